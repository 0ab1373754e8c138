"""Every CP scheme x op x layout vs `none` on the whole sequence and vs the fp32 reference (gloo, W = 2 and 4).

Scenarios (FLA's CP test matrix, scaled down to T = 512, H = 4, K = 16, V = 32; torch backend, fp32):
a sequence cut in the middle of a rank; boundaries aligned with ranks; one sequence spanning three ranks
(W = 4); a single long sequence; many short sequences; a sequence shorter than a chunk across a rank edge.
Runs per case: headwise, all_gather, ring, true_cp, true_cp with intra-device splitting (64-token
sub-segments), all_gather with intra-device splitting. Tolerance: relative L2 <= 1e-5 (fp32 both sides,
same math in another summation order; measured ~4e-7).
"""

from __future__ import annotations

import functools

import pytest
import torch

import kernels
import kernels.cp as cp
from tests.kernels.cp import cases
from tests.utils import assert_rel_close, make_inputs

pytestmark = [pytest.mark.multiproc, pytest.mark.timeout(300)]

TOL = 1e-5
H, K, V = 4, 16, 32
CASES = {
    "cut-mid-rank": (200, 312),
    "aligned": (128, 128, 256),
    "span-3-ranks": (60, 260, 192),
    "single-long": (512,),
    "many-short": (37, 3, 45, 20, 64, 7, 100, 33, 51, 88, 64),
    "short-at-edge": (250, 12, 250),
}
RUNS = [("headwise", None), ("all_gather", None), ("ring", None), ("true_cp", {"segment_len": None}),
        ("true_cp", {"segment_len": 64}), ("all_gather", {"segment_len": 128})]


@functools.cache
def _truth(op: str, case: str) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
    q, k, v, g, beta, cu = make_inputs(op, CASES[case], H=H, K=K, V=V, lb=-1.0, seed=0)
    assert sum(CASES[case]) == 512
    ref, _ = kernels.reference(op, q, k, v, g, beta, cu_seqlens=cu)
    ctx = cp.build_context(cu, 1, 0)
    base = cp.forward("none", op, q, k, v, g, beta, group=None, ctx=ctx, backend="torch")
    assert_rel_close("none vs reference", ref, base, TOL)
    return ref, base, cu.tolist()


@pytest.mark.parametrize("layout", ["contiguous", "zigzag"])
@pytest.mark.parametrize("op", ["gdn", "kda"])
@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("W", [2, 4])
def test_forward_schemes(gangs: dict, W: int, case: str, op: str, layout: str) -> None:
    ref, base, cu = _truth(op, case)
    per_rank = gangs[W].run(cases.schemes, {"op": op, "lengths": CASES[case], "layout": layout, "runs": RUNS, "H": H, "K": K, "V": V, "lb": -1.0, "seed": 0})
    ctx = cp.build_context(cu, W, 0, layout)
    for label in per_rank[0]:
        o = cp.unshard([r[label] for r in per_rank], ctx)
        assert_rel_close(f"{label} vs none", base, o, TOL)
        assert_rel_close(f"{label} vs reference", ref, o, TOL)


def test_group_mismatch_is_refused(gang2) -> None:
    msgs = gang2.run(cases.bad_group, None)
    assert all("ctx was built for world_size=4" in m for m in msgs), msgs
