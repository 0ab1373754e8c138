"""KDA's forward state+output pass on the TileLang walk's gated build (`kernels.ops.gdn.fwd_walk`, gate "vector").

On any machine:
- the plan: `fwd_pass` "auto" takes the walk for KDA (`KDA_WALK_AUTO`, session 29) and GDN in bf16 where it runs,
  "triton" never; "tilelang" where the walk cannot run is refused in one line, through KDA's forward too;
- the launcher and the plan switch with the kernel's torch mirror (`kernels.common.fwd_walk_torch`) in the compiled
  kernel's place (the walk's refusal lifted): KDA's forward under `LaunchPlan(fwd_pass="tilelang", ag_pass="triton")` asks
  the Triton Ag pass for its gated variant (an explicit Ag config keeps its other fields), runs no Triton output pass, and equals the
  per-token reference: bf16, grouped value heads (HV = 2H), value head 0 strong (gates down to -20 per token), three
  varlen sequences (37, 300, 5 tokens) from initial states, whole and split into 1-chunk segments (the Triton
  transitions and chain, the walk from each segment's state), relative L2 2e-2 (bf16 operands; the interpreted Triton
  Ag pass).
On an H200 with CPBENCH_TEST_GPU=1 and tilelang 0.1.15 (bf16, K = V = 128, chunk 64), on the Triton gated Ag pass's
outputs for those sequences (Hk = 1, HV = 2):
- the kernel against its mirror in two-chunk ranges (programs in reverse order through the program map, each range's
  entering state; partial and sub-chunk last chunks, whose loads run into the next range) and as whole sequences: o,
  the final states and every chunk's entering state (STORE_H) at value blocks 64 and 128, relative L2 2e-2 (the kernel
  rounds its products' operands to bf16, the mirror does not); the state pass alone;
- the kernel against the Triton gated pass (PRE_GATED) from h0: o and the final states, 2e-2;
- KDA's forward under `LaunchPlan(fwd_pass="tilelang")` (the walk's one-wave split, and 2-chunk segments) against
  the fp32 per-token reference, 2e-2.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import pytest
import torch

import kernels
from kernels.common.fwd_walk_torch import fwd_walk
from kernels.common.index import prepare_chunk_index
from kernels.common.seqsplit import whole_sequences
from kernels.ops.gdn import fwd_walk as walk_module
from kernels.ops.gdn import tilelang_hopper
from kernels.ops.gdn.fwd_walk import FWD_WALK_MODES, fwd_walk_refusal, fwd_walk_tilelang, fwd_walk_wanted
from kernels.ops.kda.chunk import chunk_kda_fwd
from kernels.ops.kda.wy_ag import KDA_AG_VARIANTS, WY_KDA_AG_FWD, GatedKeys, gated_ag_plan, wy_kda_ag
from kernels.plan import LaunchPlan, LaunchRecorder
from tests.utils import TEST_DEVICE, assert_rel_close, make_inputs, make_state
from tests.utils.reverse_walk import forward_ranges

DIM, BT = 128, 64
LENGTHS, CU = (37, 300, 5), [0, 37, 337, 342]
TOL = 2e-2  # bf16 operands (module docstring)
WHY = fwd_walk_refusal(DIM, DIM, BT, torch.device(TEST_DEVICE)) if TEST_DEVICE == "cuda" else "no GPU test"
GPU = pytest.mark.skipif(WHY is not None, reason=str(WHY))


def _inputs(dim: int, device: str) -> tuple[torch.Tensor, ...]:
    """bf16 KDA inputs, q, k with one head, v, g, beta with two (head 0's gates down to -20 per token); cu int32."""
    q, k, _, _, _, cu = make_inputs("kda", LENGTHS, H=1, K=dim, V=dim, dtype=torch.bfloat16, device=device)
    _, _, v, g, beta, _ = make_inputs("kda", LENGTHS, H=2, K=dim, V=dim, lb=-0.5, seed=3, dtype=torch.bfloat16,
                                      device=device)  # fmt: skip
    g[:, :, 0] *= 40
    return q, k, v, g, beta, cu


def _reference(q, k, v, g, beta, cu, h0):
    return kernels.reference("kda", *(x.float() for x in (q, k, v, g, beta)), scale=q.shape[-1] ** -0.5,
                             initial_state=h0, output_final_state=True, cu_seqlens=cu)  # fmt: skip


def test_the_plan_takes_the_walk_for_kda_under_auto(monkeypatch: pytest.MonkeyPatch) -> None:
    k = torch.zeros(1, 64, 1, DIM, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match=r"fwd_pass='tilelang'\): the TileLang forward walk runs on CUDA only"):
        fwd_walk_wanted(k, k, BT, LaunchPlan(fwd_pass="tilelang"), gated=True)
    assert not fwd_walk_wanted(k, k, BT, LaunchPlan(), gated=True)  # refused here: "auto" falls back
    monkeypatch.setattr(tilelang_hopper, "tilelang_refusal_cached", lambda *a: None)  # as on an H200
    assert fwd_walk_wanted(k, k, BT, LaunchPlan()) and fwd_walk_wanted(k, k, BT, LaunchPlan(), gated=True)
    assert not fwd_walk_wanted(k.float(), k.float(), BT, LaunchPlan(), gated=True)  # "auto": bf16 only
    assert fwd_walk_wanted(k, k, BT, LaunchPlan(fwd_pass="tilelang"), gated=True)
    assert not fwd_walk_wanted(k, k, BT, LaunchPlan(fwd_pass="triton"), gated=True)


def test_tilelang_refused_in_one_line_through_kda_forward() -> None:
    q, k, v, g, beta, cu = make_inputs("kda", (70,), H=1, K=16, V=16, device=TEST_DEVICE)
    with pytest.raises(ValueError, match=r"^LaunchPlan\(fwd_pass='tilelang'\): the TileLang forward walk takes K = V"):
        chunk_kda_fwd(q, k, v, g, beta, scale=0.25, cu_seqlens=cu, fwd_path="fused", plan=LaunchPlan(fwd_pass="tilelang"))


def _mirror_build(calls: list[str]) -> Callable[..., Any]:
    """`fwd_walk._build`'s stand-in: a kernel running the torch mirror on the launcher's arguments (the kernel's
    argument order, `fwd_walk._build`'s prim_funcs), writing what the kernel writes; `calls` gets each build's gate."""

    def build(H: int, Hk: int, BV: int, scale: float, io: str, gate: str = "scalar") -> Callable[..., None]:
        calls.append(gate)

        def run(*args: Any) -> None:
            if gate == "vector":
                q, k, kd, v, ag, aqk, gs, h0, cu, co, pmap, fin, o, ht, hs, modes = args
            else:
                (q, k, v, ag, gs, h0, cu, co, pmap, fin, o, ht, hs, modes), kd, aqk = args, None, None
            on = {name: bool(modes & bit) for name, bit in FWD_WALK_MODES.items()}
            got_o, got_ht, got_hs = fwd_walk(
                q if on["output"] else None, k, v, ag, gs, cu=cu, co=co, pmap=pmap, fin=fin, scale=scale,
                h0=h0 if on["h0"] else None, num_states=ht.shape[0], num_chunks=hs.shape[0] if on["store_h"] else None,
                aqk=aqk if on["output"] else None, kd=kd,
            )  # fmt: skip
            if got_o is not None:
                o.copy_(got_o)
            stored = fin[fin >= 0].long()
            if got_ht is not None:
                ht[stored] = got_ht[stored]
            if got_hs is not None:
                hs.copy_(got_hs)

        return run

    return build


@pytest.mark.skipif(TEST_DEVICE != "cpu", reason="the mirror in the kernel's place: CPU only (the GPU runs the kernel)")
@pytest.mark.parametrize("split", [0, 1], ids=["whole", "one-chunk-segments"])
def test_kda_forward_on_the_walk_with_its_mirror(monkeypatch: pytest.MonkeyPatch, split: int) -> None:
    calls: list[str] = []
    monkeypatch.setattr(tilelang_hopper, "tilelang_refusal_cached", lambda *a: None)
    monkeypatch.setattr(walk_module, "tilelang_refusal_cached", lambda *a: None)
    monkeypatch.setattr(walk_module, "_build", _mirror_build(calls))
    dim = 16
    q, k, v, g, beta, cu = _inputs(dim, "cpu")
    h0 = make_state(3, 2, dim, dim)
    rec = LaunchRecorder()
    ag_cfg = dataclasses.replace(WY_KDA_AG_FWD.default, BK=32)
    # the Triton Ag pass (its gated variant), pinned: with the refusals lifted "auto" would take the TileLang pass
    plan = LaunchPlan(fwd_pass="tilelang", ag_pass="triton", recorder=rec, configs={WY_KDA_AG_FWD.name: ag_cfg})
    o, ht = chunk_kda_fwd(q, k, v, g, beta, scale=dim**-0.5, initial_state=h0, output_final_state=True,
                          cu_seqlens=cu, split_chunks=split, plan=plan, fwd_path="fused")  # fmt: skip
    o_ref, ht_ref = _reference(q, k, v, g, beta, cu, h0)
    assert calls == ["vector"]
    assert rec["wy_kda_ag_fwd"][1] == dataclasses.replace(ag_cfg, VARIANT=KDA_AG_VARIANTS["gated"])
    assert ("seg_chain_fwd" in rec) == bool(split)  # (the split: Triton's transitions, the chain, then the walk)
    assert_rel_close("o", o_ref, o.float(), TOL)
    assert_rel_close("ht", ht_ref, ht, TOL)


def _gated(q, k, g, beta, cu, launch=None) -> tuple[torch.Tensor, torch.Tensor, GatedKeys, Any]:
    index = prepare_chunk_index(cu, batch=1, seq_len=g.shape[1], chunk_size=BT, device=g.device)
    ag, aqk, gated = wy_kda_ag(q, k, g, beta, scale=q.shape[-1] ** -0.5, index=index, launch=gated_ag_plan(launch))
    assert isinstance(gated, GatedKeys)
    return ag, aqk, gated, index


@GPU
@pytest.mark.parametrize("BV", [64, 128])
@pytest.mark.parametrize("span", [2 * BT, 10**9], ids=["two-chunk-ranges", "whole-sequences"])
def test_kernel_matches_its_torch_mirror(span: int, BV: int) -> None:
    from kernels.common.chunk_state import SeqLayout

    q, k, v, g, beta, cu = _inputs(DIM, "cuda")
    ag, aqk, x, index = _gated(q, k, g, beta, cu)
    flat = {"q": x.qg[0].cpu(), "k": x.ke[0].cpu(), "v": v[0].cpu(), "ag": ag[0].cpu(), "gs": x.gc.cpu(),
            "aqk": aqk[0].cpu(), "kd": x.kd[0].cpu()}  # fmt: skip
    h0 = make_state(3, 2, DIM, DIM)
    nt = index.num_chunks
    first = index.chunk_offsets.tolist()[:3]  # each sequence's first chunk
    _, _, h = fwd_walk(**flat, cu=torch.tensor(CU), co=torch.tensor(first), pmap=torch.arange(3),
                       fin=torch.arange(3), scale=1.0, h0=h0, num_chunks=nt)  # fmt: skip
    assert h is not None
    r = forward_ranges(CU, first, h, span, BT)
    want = fwd_walk(**flat, scale=1.0, num_states=3, num_chunks=nt, **r)
    layout = SeqLayout(r["pmap"].numel(), *(r[name].cuda() for name in ("cu", "co", "pmap", "fin")))
    got = fwd_walk_tilelang(x.qg, x.ke, v, ag, x.gc, layout=layout, h0=r["h0"].cuda(), num_states=3,
                            output_final_state=True, num_chunks=nt, BV=BV, aqk=aqk, kd=x.kd)  # fmt: skip
    for name, a, b in zip(("o", "ht", "h"), got, want, strict=True):
        assert a is not None and b is not None
        a = a[0] if name == "o" else a
        assert torch.isfinite(a).all(), name
        assert_rel_close(name, b.float(), a.float().cpu(), TOL)
    _, ht_state, _ = fwd_walk_tilelang(None, x.ke, v, ag, x.gc, layout=layout, h0=r["h0"].cuda(), num_states=3,
                                       output_final_state=True, BV=BV, kd=x.kd)  # fmt: skip
    assert ht_state is not None and want[1] is not None
    assert_rel_close("ht (state only)", want[1].float(), ht_state.cpu(), TOL)


@GPU
def test_kernel_matches_the_triton_gated_pass() -> None:
    from kernels.ops.gdn.fused import gdn_fused_state_output

    q, k, v, g, beta, cu = _inputs(DIM, "cuda")
    ag, aqk, x, index = _gated(q, k, g, beta, cu)
    h0 = make_state(3, 2, DIM, DIM, device="cuda")
    layout = whole_sequences(index)
    o_tr, ht_tr = gdn_fused_state_output(x.qg, x.ke, v, ag, x.gc, layout=layout, BT=BT, h0=h0,
                                         output_final_state=True, aqk=aqk, kd=x.kd)  # fmt: skip
    o, ht, _ = fwd_walk_tilelang(x.qg, x.ke, v, ag, x.gc, layout=layout, h0=h0, output_final_state=True, aqk=aqk,
                                 kd=x.kd)  # fmt: skip
    assert o is not None and ht is not None and o_tr is not None and ht_tr is not None
    assert_rel_close("o", o_tr.float(), o.float(), TOL)
    assert_rel_close("ht", ht_tr, ht, TOL)


@GPU
@pytest.mark.parametrize("split", [None, 2], ids=["one-wave-split", "two-chunk-segments"])
def test_kda_forward_on_the_walk(split: int | None) -> None:
    q, k, v, g, beta, cu = _inputs(DIM, "cuda")
    h0 = make_state(3, 2, DIM, DIM, device="cuda")
    rec = LaunchRecorder()
    o, ht = chunk_kda_fwd(q, k, v, g, beta, scale=DIM**-0.5, initial_state=h0, output_final_state=True,
                          cu_seqlens=cu, split_chunks=split, plan=LaunchPlan(fwd_pass="tilelang", recorder=rec),
                          fwd_path="fused")  # fmt: skip
    o_ref, ht_ref = _reference(q, k, v, g, beta, cu, h0)
    assert KDA_AG_VARIANTS["gated"] == rec["wy_kda_ag_fwd"][1].VARIANT
    assert_rel_close("o", o_ref, o.float(), TOL)
    assert_rel_close("ht", ht_ref, ht, TOL)
