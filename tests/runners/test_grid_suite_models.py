"""runners/suites/models.yaml (issue 25): the real models' layer shapes parse and expand into the expected points.

Three sweeps (YAML documents), one per model, each named in its tags: Qwen3-Next-80B-A3B GDN (H 16, HV 32), Qwen3.5-397B
GDN (H 16, HV 64), Kimi Linear 48B KDA (H = HV = 32), all K = V = 128, at T in {8K, 32K, 128K}, fwd and fwd+bwd, the
model's gate (`in_kernel`) against `precomputed`, q/k L2-normalised in the kernel. No point runs here.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from kernels.vocabulary import MODES, SINGLE_DEVICE
from runners.errors import SpecError
from runners.grid import expand
from runners.spec import load_spec, load_specs

SUITE = Path(__file__).resolve().parents[2] / "runners" / "suites" / "models.yaml"
# name -> (model tag, op, H, HV)
MODELS = {
    "models-qwen3-next": ("Qwen3-Next-80B-A3B", "gdn", 16, 32),
    "models-qwen3.5": ("Qwen3.5-397B-A17B", "gdn", 16, 64),
    "models-kimi-linear": ("Kimi-Linear-48B-A3B", "kda", 32, 32),
}


def test_the_suite_holds_one_sweep_per_model() -> None:
    specs = load_specs(SUITE)
    assert [s.name for s in specs] == list(MODELS)
    for spec in specs:
        tag, op, H, HV = MODELS[spec.name]
        assert tag in spec.tags and "models" in spec.tags and spec.ops == [op]
        a = spec.axes
        assert (a.H, a.HV or a.H, a.K, a.V) == ([H], [HV], [128], [128])
        assert a.T == [8192, 32768, 131072] and a.direction == ["fwd", "fwd+bwd"]
        assert a.gate == ["precomputed", "in_kernel"] and a.l2norm_in_kernel == [True]
    with pytest.raises(SpecError, match="holds 3 sweeps"):
        load_spec(SUITE)


@pytest.mark.parametrize("index", range(3))
def test_each_sweep_expands_into_its_model_points(index: int) -> None:
    spec = load_specs(SUITE)[index]
    tag, op, H, HV = MODELS[spec.name]
    rows = expand(spec)
    Ws, cp_modes = (1, 2, 4), len(MODES) - len(SINGLE_DEVICE)
    per_cell = len(MODES) * len(Ws)  # 3 T x 2 directions x 2 gates cells
    assert len(rows) == 3 * 2 * 2 * per_cell
    queued = [r for r in rows if r["status"] == "queued"]
    assert len(queued) == 3 * 2 * 2 * (len(MODES) + cp_modes * (len(Ws) - 1))  # none/warmup_correct: W = 1 only
    assert {r["reason"] for r in rows if r["status"] == "skipped"} == {
        f"mode '{m}' runs on one device: needs W == 1, got W={W}" for m in SINGLE_DEVICE for W in Ws[1:]
    }
    for r in rows:
        p = r["params"]
        assert (r["op"], r["H"], r["K"], r["V"], p.get("HV", H)) == (op, H, 128, 128, HV)
        assert p["l2norm_in_kernel"] is True and "lower_bound" not in p
        assert r["key"].endswith(f"{',gate=in_kernel' if p.get('gate') else ''},l2norm_in_kernel=True") or ",opts=" in r["key"]
    gates = Counter(r["params"].get("gate", "precomputed") for r in rows)
    assert gates == {"precomputed": len(rows) // 2, "in_kernel": len(rows) // 2}
    assert len({r["key"] for r in rows}) == len(rows)
