"""The shipped H200 autotune file (`benchmarks/results/autotune_h200.json`) is a valid file for the loader: schema,
device, every entry's config inside its kernel's declared space and not ruled out by a known miscompile, and the
tuned configs are the ones launched when the file is loaded for the H200 (observed at launch). Its source hashes
are those of the kernels it was tuned on; after a kernel edit the loader refuses it (a file of other kernels must
not silently apply), which the last test states."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import kernels
import kernels.common.chunk_bwd  # noqa: F401  (registers the specs of the backward's kernels)
import kernels.common.chunk_state  # noqa: F401  (registers the specs of every Triton kernel of the forward)
import kernels.common.seqsplit  # noqa: F401
import kernels.common.state_bwd  # noqa: F401
import kernels.common.wy  # noqa: F401
from kernels.autotune import AutotuneMismatchError, load_autotune, parse_autotune, source_hash
from kernels.configs import KERNELS, LaunchConfig
from kernels.plan import LaunchPlan, LaunchRecorder
from runners.tuner.miscompiles import known_bad

SHIPPED = Path(__file__).resolve().parents[2] / "benchmarks" / "results" / "autotune_h200.json"
H200 = "NVIDIA H200"


def _data() -> dict:
    return json.loads(SHIPPED.read_text())


def test_shipped_file_is_valid_and_inside_the_declared_spaces() -> None:
    data = _data()
    table = parse_autotune(data, device_name=H200, check_sources=False)
    assert table.device_name == H200 and table.compute_capability == "9.0"
    # (session 20: the WY passes' entries, all at their defaults, were dropped when their block solve changed;
    # session 24: chunk_state_output_fwd's likewise when the state kernel gained the Ag form)
    assert set(table.kernels()) >= {"chunk_state_fwd", "chunk_bwd_dqk_wy", "chunk_state_bwd", "wy_from_ag"}
    ruled_out = known_bad("9.0", data["versions"]["triton"])
    for name, block in data["kernels"].items():
        space = set(KERNELS[name].configs())
        for e in block["entries"]:
            cfg = LaunchConfig.from_dict(e["config"])
            assert cfg in space, (name, cfg)
            assert cfg not in ruled_out.get(name, {}), (name, cfg)
            assert e["median_ms"] <= e["default_ms"] * 1.02, (name, e)  # never slower than the default beyond noise


@pytest.mark.skipif(any(b["source_hash"] != source_hash(n) for n, b in _data()["kernels"].items()),
                    reason="the kernels changed since the H200 tuning run: the file is stale until re-tuned on the device")
def test_shipped_configs_are_launched_for_the_h200() -> None:
    """Loaded for the H200, every shipped entry is what a launcher's `LaunchPlan.config_for` returns (and records in
    the plan's recorder, which measurements report) for that kernel and key."""
    plan = LaunchPlan(table=load_autotune(SHIPPED, device_name=H200))
    n = 0
    for name, block in _data()["kernels"].items():
        for e in block["entries"]:
            rec = LaunchRecorder()
            cfg = plan.with_recorder(rec).config_for(KERNELS[name], e["key"])
            assert cfg.as_dict() == e["config"], (name, e["key"])
            assert rec[name][1] == cfg
            n += 1
    assert n == sum(len(b["entries"]) for b in _data()["kernels"].values()) > 0
    # a config that differs from the default really is picked up (not only equal-to-default entries)
    assert any(e["config"] != KERNELS[name].default.as_dict() for name, b in _data()["kernels"].items()
               for e in b["entries"])


def test_shipped_file_is_refused_for_another_device() -> None:
    with pytest.raises(AutotuneMismatchError, match="H200"):
        load_autotune(SHIPPED, device_name="NVIDIA A100-SXM4-80GB")


def test_shipped_file_loads_in_a_fresh_process() -> None:
    """A training job loads the file before any op has run: the loader imports the modules that register the file's
    kernels (the fused GDN pass and the Ag passes live under `kernels/ops/`, which a chunk.py imports only when it
    runs; `wy_from_ag` under `kernels/ops/gdn/ag_bwd.py`). Before session 16 the loader imported three fixed modules and
    refused the re-tuned file."""
    import subprocess
    import sys

    code = ("from kernels.autotune import load_autotune; "
            f"t = load_autotune({str(SHIPPED)!r}, device_name={H200!r}); print(' '.join(sorted(t.kernels())))")
    proc = subprocess.run([sys.executable, "-c", code], cwd=SHIPPED.parents[2], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert set(proc.stdout.split()) == set(_data()["kernels"]) >= {"gdn_fused_state_output_fwd", "wy_from_ag"}
