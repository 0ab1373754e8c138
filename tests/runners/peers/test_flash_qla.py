"""`backend: flash_qla` on a CPU host: the skip reason of every op x mode x dtype x head-dim combination when the
sweep is expanded (FlashQLA never imported), its options in the key only of their mode, and the adapter run as a
point (gated, its split and first-call cost in the report, the compile announced) against a stand-in module with
FlashQLA 0.1.3's signatures: `flash_qla.chunk_gated_delta_rule(..., auto_cp, cp_context, force_intra_cp)` and
`flash_qla.ops.gated_delta_rule.chunk.build_cp_context` / `CHUNK_SIZE` (its kernels need an SM90/SM100 GPU; the
stand-in computes the fp32 per-token reference and records how it was called).
"""

from __future__ import annotations

import itertools
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import torch

from kernels.vocabulary import MODES
from runners.execute import run_point_job
from runners.gang import RankContext
from runners.grid import expand, skip_reason
from runners.peers.flash_qla import FLASH_QLA, use_device_tilelang_cache
from runners.point import PointJob, PointSpec
from runners.spec import parse_spec
from tests.runners.peers.conftest import OPTIONS, peer_point

# FlashQLA 0.1.3's public signatures, over the fp32 per-token reference; each call recorded in CALLS
FAKE_INIT = """
import os
import torch
import kernels

CALLS = []


def chunk_gated_delta_rule(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False,
                           use_qk_l2norm_in_kernel=False, cu_seqlens=None, head_first=False, state_v_first=False,
                           auto_cp=True, enable_fwd_cp_cache=True, cp_context=None, force_intra_cp=False):
    assert q.dtype == torch.bfloat16 or q.dtype == torch.float16, "FlashQLA only supports bfloat16 and float16."
    assert g.dtype == torch.float32, "dg should be fp32"  # FlashQLA 0.1.3's backward, seen on the H200 (session 12)
    is_inter = cp_context is not None and cp_context.is_inter
    bounds = cp_context.cu_seqlens if cp_context is not None else cu_seqlens
    notice = os.environ.get("CPBENCH_ACTIVITY_FILE")
    CALLS.append({"auto_cp": auto_cp, "cp_context": cp_context, "cu_seqlens": cu_seqlens, "scale": scale,
                  "force_intra_cp": force_intra_cp, "bounds": bounds.tolist(), "bounds_dtype": bounds.dtype,
                  "announced": bool(notice) and os.path.exists(notice), "inter": is_inter})
    f32 = [x.float() for x in (q, k, v, g, beta)]
    o = kernels.reference("gdn", *f32, scale=scale, cu_seqlens=bounds.long())[0]
    return o.to(q.dtype), None
"""
FAKE_CHUNK = """
from dataclasses import dataclass
import torch

CHUNK_SIZE = 64
BUILT = []


@dataclass
class FlashQLACPContext:
    is_inter: bool = False
    is_intra: bool = False
    cu_seqlens: torch.Tensor | None = None
    group: object = None
    cu_seqlens_cpu: torch.Tensor | None = None
    intra_cp_cu_seqlens: torch.Tensor | None = None

    @property
    def num_seqs(self):
        return 0 if self.cu_seqlens is None else len(self.cu_seqlens) - 1


def build_cp_context(cu_seqlens=None, *, enable_inter=False, enable_intra=False, group=None, num_v_heads=None,
                     chunk_size=None, conv1d_kernel_size=None, cu_seqlens_cpu=None, g=None, is_train=False,
                     force_intra_cp=False):
    BUILT.append({"enable_inter": enable_inter, "enable_intra": enable_intra, "group": group,
                  "num_v_heads": num_v_heads, "chunk_size": chunk_size, "is_train": is_train,
                  "force_intra_cp": force_intra_cp, "cpu": cu_seqlens_cpu})
    if enable_inter:  # one card holds everything (world of one): the bounds as they are
        return FlashQLACPContext(is_inter=True, cu_seqlens=cu_seqlens, group=group, cu_seqlens_cpu=cu_seqlens_cpu)
    # a stand-in decision: split sequences into pieces of one chunk when forced or when the heads are few
    bounds = cu_seqlens.tolist()
    if not (force_intra_cp or num_v_heads <= 1):
        return FlashQLACPContext(cu_seqlens=cu_seqlens)
    cuts = sorted({*bounds, *(s for a, b in zip(bounds, bounds[1:]) for s in range(a, b, chunk_size))})
    return FlashQLACPContext(is_intra=True, cu_seqlens=cu_seqlens,
                             intra_cp_cu_seqlens=torch.tensor(cuts, dtype=cu_seqlens.dtype))
"""


@pytest.fixture
def fake_flash_qla(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    """The stand-in `flash_qla` package, importable for this test only."""
    root = tmp_path / "site"
    chunk = root / "flash_qla" / "ops" / "gated_delta_rule" / "chunk"
    chunk.mkdir(parents=True)
    (root / "flash_qla" / "__init__.py").write_text(textwrap.dedent(FAKE_INIT))
    (root / "flash_qla" / "ops" / "__init__.py").write_text("")
    (root / "flash_qla" / "ops" / "gated_delta_rule" / "__init__.py").write_text("")
    (chunk / "__init__.py").write_text(textwrap.dedent(FAKE_CHUNK))
    monkeypatch.syspath_prepend(str(root))
    for name in [m for m in sys.modules if m == "flash_qla" or m.startswith("flash_qla.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setattr(FLASH_QLA, "_contexts", {})
    monkeypatch.setattr(FLASH_QLA, "_compiled", set())
    import flash_qla
    import flash_qla.ops.gated_delta_rule.chunk as chunk_mod

    yield flash_qla, chunk_mod
    for name in [m for m in sys.modules if m == "flash_qla" or m.startswith("flash_qla.")]:
        sys.modules.pop(name, None)


def _point(**kw: Any) -> PointSpec:
    return peer_point("flash_qla", **kw)


def _expected(op: str, mode: str, dtype: str, K: int, V: int, W: int) -> str | None:
    """FlashQLA's rules, first match wins, as the grid applies them (an independent statement of the table)."""
    if mode in ("headwise", "all_gather", "ring", "tail_exchange"):
        return f"does not implement mode '{mode}'"
    if op != "gdn":
        return "FlashQLA implements GDN only"
    if dtype not in ("bfloat16", "float16"):
        return "FlashQLA only supports bfloat16 and float16"
    if (K, V) != (128, 128):
        return f"FlashQLA requires K=128 and V=128, got K={K}, V={V}"
    if mode == "true_cp" and W < 2:
        return "inter-card CP (FlashQLACPContext) needs W >= 2"
    if mode in ("none", "warmup_correct") and W != 1:
        return "runs on one device"
    return None


HEAD_DIMS = [(128, 128), (64, 128), (128, 64), (256, 256)]


@pytest.mark.parametrize(
    ("op", "mode", "dtype"), list(itertools.product(("gdn", "kda"), MODES, ("float32", "bfloat16", "float16")))
)
def test_every_combination_is_decided_without_importing_flashqla(op: str, mode: str, dtype: str) -> None:
    for (K, V), W, direction in itertools.product(HEAD_DIMS, (1, 2), ("fwd", "fwd+bwd")):
        got = skip_reason(_point(op=op, mode=mode, dtype=dtype, K=K, V=V, W=W, direction=direction))
        want = _expected(op, mode, dtype, K, V, W)
        if want is None:
            assert got is None, (op, mode, dtype, K, V, W, direction, got)
        else:
            assert got is not None and want in got, (op, mode, dtype, K, V, W, direction, got)
    assert "flash_qla" not in sys.modules and "tilelang" not in sys.modules


def test_a_cpu_host_stores_flashqla_points_skipped_with_the_reason() -> None:
    spec = parse_spec(
        {
            "name": "q",
            "ops": ["gdn"],
            "modes": ["none", "warmup_correct", "true_cp"],
            "backends": ["triton", "flash_qla"],
            "axes": {
                "B": [1],
                "T": [256],
                "H": [2],
                "K": [128],
                "V": [128],
                "W": [1, 2],
                "dtype": ["bfloat16"],
                "direction": ["fwd", "fwd+bwd"],
            },
            "mode_options": {"flash_qla": {"force_intra_cp": True, "dual": True}},
        }
    )
    rows = [r for r in expand(spec, max_W=2, backends=("torch",)) if r["backend"] == "flash_qla"]
    runnable = [r for r in rows if r["reason"] is None or "not available" in r["reason"]]
    assert len(runnable) == 6  # none, warmup_correct at W=1 and true_cp at W=2, each direction
    for r in runnable:
        assert r["status"] == "skipped" and "FlashQLA needs an NVIDIA GPU" in r["reason"], r
    # each option is in the key (and the point's options) only of the mode it applies to
    keys = {r["mode"]: r["key"] for r in runnable}
    assert "flash_qla.force_intra_cp=True" in keys["warmup_correct"] and "dual" not in keys["warmup_correct"]
    assert "flash_qla.dual=True" in keys["true_cp"] and "force_intra_cp" not in keys["true_cp"]
    assert ",opts=" not in keys["none"]
    assert "flash_qla" not in sys.modules


def _run(point: PointSpec) -> Any:
    rc = RankContext(rank=0, world_size=1, device=torch.device("cpu"), backend="gloo", group=None)
    return run_point_job(rc, PointJob(point, OPTIONS, trace_path=None))


@pytest.mark.parametrize("direction", ["fwd", "fwd+bwd"])
def test_none_runs_flashqla_without_its_cp_and_is_gated(
    fake_flash_qla: Any, direction: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fq, _ = fake_flash_qla
    monkeypatch.setenv("CPBENCH_ACTIVITY_FILE", str(tmp_path / "activity.json"))
    res = _run(_point(T=24, lengths=None, direction=direction))
    assert res.ok, res.error
    assert res.gate["err_vs_reference"] < 3e-2 and res.gate["err_vs_none"] < 3e-2, res.gate
    calls = fq.CALLS
    assert calls and all(c["auto_cp"] is False and c["cp_context"] is None for c in calls)
    assert calls[0]["bounds_dtype"] == torch.int32 and calls[0]["scale"] == pytest.approx(128**-0.5)
    # the first call of each compile key (the forward; a training step's too) is announced, the later ones are not
    assert calls[0]["announced"] and sum(c["announced"] for c in calls) <= 2 and not calls[-1]["announced"]
    assert not (tmp_path / "activity.json").exists()  # the notice ends with the first call
    first = res.report["first_call_s"]
    assert set(first) == ({"fwd"} if direction == "fwd" else {"fwd", "fwd+bwd"}) and all(s >= 0 for s in first.values())


@pytest.mark.parametrize(("force", "H", "intra"), [(False, 2, False), (True, 2, True), (False, 1, True)])
def test_warmup_correct_is_flashqla_own_split_and_the_report_holds_it(
    fake_flash_qla: Any, force: bool, H: int, intra: bool
) -> None:
    fq, chunk = fake_flash_qla
    point = _point(
        mode="warmup_correct",
        B=1,
        T=200,
        lengths=[130, 70],
        H=H,
        direction="fwd+bwd",
        backend_options={"force_intra_cp": True} if force else {},
    )
    res = _run(point)
    assert res.ok, res.error
    assert res.gate["err_vs_reference"] < 3e-2, res.gate
    mine = [b for b in chunk.BUILT if b["num_v_heads"] == H and b["enable_intra"]]
    assert mine and all(b["force_intra_cp"] is force and b["chunk_size"] == 64 and not b["enable_inter"] for b in mine)
    assert {b["is_train"] for b in mine} == {False, True}  # the `do`'s forward, then the training steps
    wc = [c for c in fq.CALLS if c["cp_context"] is not None]  # the rest: the gate's `none` (auto_cp=False)
    assert wc and all(c["auto_cp"] is True for c in wc)
    assert all(c["auto_cp"] is False for c in fq.CALLS if c["cp_context"] is None)
    split = res.report["flash_qla"]
    assert split["intra_cp"] is intra and split["forced"] is force and split["sequences"] == 2
    if intra:  # the stand-in's pieces: 130 -> 64, 64, 2 and 70 -> 64, 6
        assert split["pieces"] == 5 and split["max_piece_tokens"] == 64
    else:
        assert "pieces" not in split


def test_true_cp_hands_flashqla_an_inter_card_context(fake_flash_qla: Any) -> None:
    """The adapter's call: FlashQLA's inter-card context of the global bounds (int64 on the host, int32 on the device),
    dual CP as its intra flag, and no cu_seqlens of its own (a world of one here: W >= 2 needs GPUs)."""
    from kernels import cp

    fq, chunk = fake_flash_qla
    bounds = (0, 40, 64)
    ctx = cp.build_context(bounds, 1, 0, "contiguous")
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 64, 2, 128, generator=g).to(torch.bfloat16) for _ in range(3))
    k = torch.nn.functional.normalize(k.float(), dim=-1).to(torch.bfloat16)
    gate = (-torch.rand(1, 64, 2, generator=g)).to(torch.bfloat16)
    beta = torch.rand(1, 64, 2, generator=g).to(torch.bfloat16)
    o = FLASH_QLA.forward("true_cp", "gdn", q, k, v, gate, beta, group=None, ctx=ctx, scale=None, options={"dual": True})
    built = chunk.BUILT[-1]
    assert built["enable_inter"] and built["enable_intra"] and built["cpu"].dtype == torch.int64
    assert built["cpu"].tolist() == list(bounds) and built["num_v_heads"] == 2
    call = fq.CALLS[-1]
    assert call["inter"] and call["cu_seqlens"] is None and call["bounds_dtype"] == torch.int32
    ref = __import__("kernels").reference(
        "gdn", q.float(), k.float(), v.float(), gate.float(), beta.float(), cu_seqlens=torch.tensor(bounds)
    )[0]
    assert ((o.float() - ref).norm() / ref.norm()).item() < 3e-2
    assert FLASH_QLA.point_report(_point(mode="true_cp", W=2)) == {
        "flash_qla": {"intra_cp": False, "sequences": 2, "inter_cp": True, "dual": True}
    }


def test_one_tilelang_cache_per_device_model(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TILELANG_CACHE_DIR", "")
    monkeypatch.delenv("TILELANG_CACHE_DIR")
    a = use_device_tilelang_cache(tmp_path, "NVIDIA H200", "9.0")
    assert a == str(tmp_path / "tilelang-cache" / "nvidia-h200-sm90") and Path(a).is_dir()
    import os

    assert os.environ["TILELANG_CACHE_DIR"] == a
    assert use_device_tilelang_cache(tmp_path, "NVIDIA B200", "10.0") == a  # set once: the user's (or the first) wins
