"""The gate-certified warmup of the intra-device split (`kernels.common.warm_split`) against the fp32 per-token
reference, GDN and KDA on the Triton backend (interpreted on CPU; on a GPU with CPBENCH_TEST_GPU=1), on both
forward paths: the WY path (GDN, KDA) and GDN's fused path (`kernels.ops.gdn.fused.gdn_fused_fwd`).

Scenarios: one head with strong gates (certified: its segments enter with the window's state, M skipped) and one
with weak gates (not certified: the exact maps), in one call, varlen with an initial state, fused and unfused
output; the certification count is read on the host after the call and must show both branches; every head
strong or weak; dense batches; grouped value heads (HV = 2H); a window not shorter than a segment runs the exact
split (no certification); a bad warm_chunks is refused; the WY (or Ag) pass's per-chunk bound sums. Tolerance as test_dispatch_triton.py: 1e-5 relative L2 on CPU, 1e-2 on a GPU (tf32 dots).
"""

from __future__ import annotations

import importlib

import pytest
import torch

import kernels
from kernels.plan import LaunchRecorder, default_plan
from tests.utils import TEST_DEVICE, assert_rel_close, make_grouped_inputs, make_inputs, make_state

DEVICE = TEST_DEVICE
TOL = 1e-5 if DEVICE == "cpu" else 1e-2
# on the GPU K = V = 64: a 32-wide head dim forces the state passes' 32-column block with one pipeline stage, the
# known Triton 3.6 sm_90 miscompile (kernels/NOTES.md), as in test_triton_backward.py
DIM = 32 if DEVICE == "cpu" else 64
WEAK = -0.05  # gate lower bound: ~exp(-1.6) per 64 tokens, far from certifiable
STRONG = 100  # head 0's gates times this (lb -5: ~exp(-160) per 64 tokens)
LENGTHS = (10, 330, 50)  # segments of 2 chunks (128 tokens): the 330-token sequence has 3, so 2 transitions
SPLIT, WINDOW = 2, 1

# (op, forward path): the WY path of both ops, GDN's fused path (KDA's: in test_warm_split_takes_both_branches_exactly)
CASES = [("gdn", "wy"), ("gdn", "fused"), ("kda", "wy")]
each_case = pytest.mark.parametrize(("OP", "PATH"), CASES)
# the launches that show which path ran
PATH_KERNELS = {"wy": ("chunk_state_transition_fwd",), "fused": ("wy_{op}_ag_fwd", "{op}_fused_state_output_fwd")}


def _fwd(op: str):
    return getattr(importlib.import_module(f"kernels.ops.{op}.chunk"), f"chunk_{op}_fwd")


def _inputs(op: str, strong_heads: tuple[int, ...], dense: bool = False, grouped: bool = False):
    """Varlen LENGTHS (or dense B=2 T=300) with weak gates, the heads in `strong_heads` strong; grouped: GDN with
    H = 1 key head and HV = 2 value heads, value head 0 strong."""
    shape = {"B": 2, "T": 300} if dense else {"lengths": LENGTHS}
    if grouped:
        return make_grouped_inputs(1, 2, DIM, lb=WEAK, strong=STRONG, device=DEVICE, **shape)
    q, k, v, g, beta, cu = make_inputs(op, H=2, K=DIM, V=DIM, lb=WEAK, device=DEVICE, **shape)
    for h in strong_heads:
        g[:, :, h] *= STRONG
    return q, k, v, g, beta, cu


def _run(op: str, path: str, strong_heads: tuple[int, ...], *, fuse: bool = True, window: int = WINDOW,
         dense: bool = False, grouped: bool = False):  # fmt: skip
    """The warm split on `path` against the fp32 reference (with initial states); returns the report (read after the
    call)."""
    q, k, v, g, beta, cu = _inputs(op, strong_heads, dense, grouped)
    h0 = make_state(2 if dense else len(LENGTHS), 2, DIM, DIM, device=DEVICE)
    o_ref, ht_ref = kernels.reference(op, q, k, v, g, beta, cu_seqlens=cu, initial_state=h0, output_final_state=True)
    report: dict[str, torch.Tensor] = {}
    rec = LaunchRecorder()
    opts = {"split_chunks": SPLIT, "fuse_output": fuse, "warm_chunks": window, "warm_report": report, "fwd_path": path}
    o, ht = _fwd(op)(
        q,
        k,
        v,
        g,
        beta,
        scale=DIM**-0.5,
        initial_state=h0,
        output_final_state=True,
        cu_seqlens=cu,
        plan=default_plan().with_recorder(rec),
        **opts,
    )
    assert all(name.format(op=op) in rec for name in (*PATH_KERNELS[path], "seg_chain_fwd")), list(rec)
    assert all(n.format(op=op) not in rec for other in set(PATH_KERNELS) - {path} for n in PATH_KERNELS[other]), list(rec)
    assert_rel_close("o", o_ref, o, TOL)
    assert_rel_close("ht", ht_ref, ht, TOL)
    return report


# the output unfused too, where a path has that pass (the fused path always fuses it)
@pytest.mark.parametrize(
    ("OP", "PATH", "fuse"), [(*c, f) for c in [*CASES, ("kda", "fused")] for f in (True, False) if f or c[1] == "wy"]
)
def test_warm_split_takes_both_branches_exactly(OP: str, PATH: str, fuse: bool) -> None:
    report = _run(OP, PATH, (0,), fuse=fuse)
    ok = report["certified"].cpu()  # read after the call: [transitions, heads]
    assert ok.shape == (2, 2)
    assert ok[:, 0].all() and not ok[:, 1].any(), ok


@each_case
@pytest.mark.parametrize("strong", [(0, 1), ()], ids=["all-strong", "all-weak"])
def test_warm_split_every_head_one_way(OP: str, PATH: str, strong: tuple[int, ...]) -> None:
    ok = _run(OP, PATH, strong)["certified"].cpu()
    assert ok.all() if strong else not ok.any(), ok


@each_case
def test_warm_split_dense_batch(OP: str, PATH: str) -> None:
    """Dense B=2 (the flat token axis of the bound and the windows' layout), strong head 0, weak head 1."""
    ok = _run(OP, PATH, (0,), dense=True)["certified"].cpu()  # 300 tokens: 3 segments per sequence, 2 transitions each
    assert ok.shape == (4, 2) and ok[:, 0].all() and not ok[:, 1].any(), ok


@pytest.mark.parametrize(("OP", "PATH"), [c for c in CASES if c[0] == "gdn"])  # the grouped maker is GDN's
def test_warm_split_grouped_value_heads(OP: str, PATH: str) -> None:
    """HV = 2H (value heads 0 and 1 share key head 0): value head 0 strong (certified), value head 1 weak (exact)."""
    ok = _run(OP, PATH, (0,), grouped=True)["certified"].cpu()
    assert ok.shape == (2, 2) and ok[:, 0].all() and not ok[:, 1].any(), ok


@each_case
def test_warm_split_window_not_shorter_than_a_segment_is_exact(OP: str, PATH: str) -> None:
    report = _run(OP, PATH, (0,), window=SPLIT)
    assert "certified" not in report


@each_case
def test_warm_split_refuses_a_bad_window(OP: str, PATH: str) -> None:
    q, k, v, g, beta, cu = _inputs(OP, ())
    with pytest.raises(ValueError, match="warm_chunks must be None or an int >= 0"):
        _fwd(OP)(q, k, v, g, beta, scale=1.0, cu_seqlens=cu, split_chunks=SPLIT, warm_chunks=-1, fwd_path=PATH)


@each_case
def test_chunk_bound_of_the_wy_pass_bounds_the_token_terms(OP: str, PATH: str) -> None:
    """The WY pass's (fused path: the Ag pass's) per-chunk (L, W) are the fp64 sums of decay_bound's per-token terms
    (KDA: the largest gate over the key dims), rounded up by at most the stated margin, partial chunks included."""
    from kernels.common.decay_bound import token_terms
    from kernels.common.index import prepare_chunk_index
    from kernels.common.warm_split import warm_inputs, with_chunk_bound
    from kernels.common.wy import wy_gdn_fwd, wy_kda_fwd
    from kernels.ops.gdn.wy_ag import wy_gdn_ag

    q, k, v, g, beta, cu = _inputs(OP, (0,))
    beta[:, 74:138] = 0.0  # the second chunk of the second sequence writes nothing: W = -inf there, not NaN
    assert warm_inputs(OP, k, v, g, beta, 0) is None
    x = warm_inputs(OP, k, v, g, beta, WINDOW)
    assert x is not None and x.chunk_bound is None
    index = prepare_chunk_index(cu, batch=1, seq_len=k.shape[1], chunk_size=64, device=k.device)
    x = with_chunk_bound(x, index.num_chunks)
    assert x is not None and x.chunk_bound is not None
    if PATH == "fused":
        wy_gdn_ag(k, g, beta, index=index, bnd=x.chunk_bound, v=v)
    else:
        (wy_gdn_fwd if OP == "gdn" else wy_kda_fwd)(q, k, v, g, beta, scale=1.0, index=index, bnd=x.chunk_bound)
    ell, log_u = token_terms(OP, k, v, g, beta)  # fp64 [T, H]
    got = x.chunk_bound.double().cpu()
    bounds = index.cu_seqlens_cpu
    c = no_write = 0
    for n in range(index.num_seqs):
        for a in range(bounds[n], bounds[n + 1], 64):
            e = min(a + 64, bounds[n + 1])
            el, lu = ell[a:e].cpu(), log_u[a:e].cpu()
            L = el.sum(0)
            W = torch.logsumexp(lu + (L - el.cumsum(0)), 0)
            slack = 2e-4 * (el.abs().sum(0) + W.abs().nan_to_num(posinf=0.0) + 1)
            assert (got[c, :, 0] >= L).all() and (got[c, :, 0] <= L + slack).all(), (c, got[c, :, 0], L)
            assert (got[c, :, 1] >= W).all() and (got[c, :, 1] <= W + slack).all(), (c, got[c, :, 1], W)
            no_write += int(torch.isinf(W).sum())
            c += 1
    assert c == index.num_chunks and no_write == 2  # the silent chunk, both heads
