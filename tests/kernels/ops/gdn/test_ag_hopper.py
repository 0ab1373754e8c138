"""GDN's TileLang Ag pass (`kernels.ops.gdn.ag_hopper`).

On any machine: the refusals name their reason in one line; `LaunchPlan.ag_pass` picks the pass (auto: Triton, the
kernel not yet timed on an H200). Its decomposition's CPU mirror is tested in tests/kernels/common/test_ag_torch.py.
On an H200 with CPBENCH_TEST_GPU=1 and tilelang 0.1.15 (bf16, K = V = 128, chunk 64), through `wy_gdn_ag` with
`ag_pass="tilelang"` against the Triton pass (`ag_pass="triton"`) on identical inputs: varlen (37, 300, 64, 5 tokens:
partial and sub-chunk last chunks) and dense, grouped heads (H = 2, HV = 4), one strong head (gates down to -20 per
token at lb -1, -100 at lb -5) and weak ones, outputs NaN-poisoned before the call:
- Ag against the fp64 triangular solve on the same (bf16) inputs, relative L2 1e-2 (bf16's rounding, as the Triton
  pass's bf16 test), and against the Triton pass's Ag at the same tolerance; exact zeros above the diagonal;
- the gate cumsum within 1e-5 of Triton's (fp32 sums in another order);
- the forward's bound summary (L, W) and the backward's reverse sums (p per token, (L + margin A, A) per chunk) within
  1e-4 of Triton's relative, and absolute 1e-4 or 4 fp32 ulps of the largest |gate cumsum| (logs of sums of
  e^(cumsum differences): the cumsum's own rounding; -inf where Triton has -inf);
- the lab's builds (four programs an SM, the block-structured N^2 and N^3) against the default build.
"""

from __future__ import annotations

import pytest
import torch

from kernels.common.ag_torch import ag_reference
from kernels.common.index import prepare_chunk_index
from kernels.ops.gdn.ag_hopper import ag_hopper, ag_hopper_refusal, ag_hopper_wanted
from kernels.ops.gdn.wy_ag import wy_gdn_ag
from kernels.plan import LaunchPlan
from tests.utils import TEST_DEVICE, assert_rel_close, make_grouped_inputs

DIM, BT, H, HV = 128, 64, 2, 4
WHY = ag_hopper_refusal(DIM, DIM, BT, torch.device(TEST_DEVICE)) if TEST_DEVICE == "cuda" else "no GPU test"
GPU = pytest.mark.skipif(WHY is not None, reason=str(WHY))
LAYOUTS = {"dense": {"B": 2, "T": 200}, "varlen": {"lengths": (37, 300, 64, 5)}}


def test_refusals_name_their_reason() -> None:
    assert "Ag pass takes K = V = 128 and chunk 64, got K=64" in str(ag_hopper_refusal(64, 128, 64, torch.device("cpu")))
    assert "runs on CUDA only, got cpu" in str(ag_hopper_refusal(128, 128, 64, torch.device("cpu")))
    k = torch.zeros(1, 64, 1, DIM, dtype=torch.bfloat16)
    index = prepare_chunk_index(None, batch=1, seq_len=64, chunk_size=BT)
    with pytest.raises(ValueError, match="the TileLang Ag pass runs on CUDA only"):
        ag_hopper(k, torch.zeros(1, 64, 1), torch.zeros(1, 64, 1), index=index)


def test_the_plan_picks_the_pass() -> None:
    k = torch.zeros(1, 64, 1, DIM, dtype=torch.bfloat16)
    assert not ag_hopper_wanted(k, BT, LaunchPlan(), None)  # auto: Triton (and refused on the CPU)
    assert not ag_hopper_wanted(k, BT, LaunchPlan(ag_pass="triton"), None)
    with pytest.raises(ValueError, match=r"ag_pass='tilelang'\): the TileLang Ag pass runs on CUDA only"):
        ag_hopper_wanted(k, BT, LaunchPlan(ag_pass="tilelang"), None)
    with pytest.raises(ValueError, match="LaunchPlan.ag_pass must be one of auto, triton, tilelang, got 'cuda'"):
        LaunchPlan(ag_pass="cuda")


def _run(pass_: str, q, k, v, g, beta, index):  # type: ignore[no-untyped-def]
    """wy_gdn_ag on one pass with both sums, its outputs NaN-poisoned first."""
    B, T = g.shape[:2]
    bnd = torch.full((index.num_chunks, HV, 2), float("nan"), device="cuda")
    rev = (torch.full((B, T, HV), float("nan"), device="cuda"), torch.full((index.num_chunks, HV, 2), float("nan"),
                                                                           device="cuda"))  # fmt: skip
    ag, gcum = wy_gdn_ag(k, g, beta, index=index, launch=LaunchPlan(ag_pass=pass_), bnd=bnd, v=v, rev=rev, q=q)
    return ag, gcum, bnd, *rev


def _close_with_infs(name: str, ref: torch.Tensor, got: torch.Tensor, atol: float) -> None:
    inf = torch.isinf(ref)
    assert bool((torch.isinf(got) == inf).all()), f"{name}: -inf where Triton's is finite, or the reverse"
    torch.testing.assert_close(got[~inf], ref[~inf], rtol=1e-4, atol=atol, msg=lambda m: f"{name}: {m}")


@GPU
@pytest.mark.parametrize("layout", sorted(LAYOUTS))
@pytest.mark.parametrize("lb", [-1.0, -5.0])
def test_kernel_matches_the_triton_pass_and_the_solve(layout: str, lb: float) -> None:
    q, k, v, g, beta, cu = make_grouped_inputs(H, HV, DIM, lb=lb, dtype=torch.bfloat16, device="cuda",
                                               **LAYOUTS[layout])  # fmt: skip
    g = g.float()
    B, T = g.shape[:2]
    index = prepare_chunk_index(cu, batch=B, seq_len=T, chunk_size=BT, device=torch.device("cuda"))
    got = _run("tilelang", q, k, v, g, beta, index)
    ref = _run("triton", q, k, v, g, beta, index)
    ag_ref, _ = ag_reference(k, g, beta, index=index)
    assert ag_ref.abs().amax() > 0.1
    assert_rel_close("Ag vs the solve", ag_ref, got[0].double(), 1e-2)
    assert_rel_close("Ag vs Triton", ref[0].double(), got[0].double(), 1e-2)
    upper = torch.ones(BT, BT, dtype=torch.bool, device="cuda").triu(1)
    pos = (torch.arange(B * T, device="cuda") % T) if cu is None else _positions(cu, T)
    above = upper[pos % BT]  # [B*T, BT]: the columns above each row's diagonal, per value head alike
    assert bool((got[0].reshape(B * T, HV, BT)[above[:, None, :].expand(-1, HV, -1)] == 0).all())
    torch.testing.assert_close(got[1], ref[1], rtol=1e-5, atol=1e-5)
    # the sums are logs of sums of e^(gate cumsum differences): an fp32 cumsum summed in another order moves them by
    # its own rounding, a few ulps of the largest |cumsum| (6400 at lb -5: 4.9e-4 an ulp; measured 3.7e-4 on the H200)
    atol = max(1e-4, 4 * torch.finfo(torch.float32).eps * float(ref[1].abs().amax()))
    for name, a, b in zip(("bnd", "rev p", "rev chunk"), got[2:], ref[2:], strict=True):
        _close_with_infs(name, b, a, atol)


def _positions(cu: torch.Tensor, T: int) -> torch.Tensor:
    """Each token's position within its sequence (varlen, flattened)."""
    starts = torch.repeat_interleave(cu[:-1], (cu[1:] - cu[:-1]).long())
    return torch.arange(T, device=cu.device) - starts


@GPU
@pytest.mark.parametrize("knobs", [(0, True), (4, False), (4, True)], ids=["quad", "b4", "b4+quad"])
def test_lab_builds_match_the_default_build(knobs: tuple[int, bool]) -> None:
    """The lab's builds (`ag_pass_lab.py --builds`): four programs an SM and the block-structured N^2, N^3 give the
    default build's outputs (Ag within bf16's rounding, 1e-2; the gate cumsum and the sums to 1e-6: the same code)."""
    q, k, v, g, beta, cu = make_grouped_inputs(H, HV, DIM, lb=-1.0, dtype=torch.bfloat16, device="cuda",
                                               **LAYOUTS["varlen"])  # fmt: skip
    g = g.float()
    B, T = g.shape[:2]
    index = prepare_chunk_index(cu, batch=B, seq_len=T, chunk_size=BT, device=torch.device("cuda"))

    def run(blocks: int, quad: bool) -> list[torch.Tensor]:
        bnd = torch.full((index.num_chunks, HV, 2), float("nan"), device="cuda")
        rev = (torch.full((B, T, HV), float("nan"), device="cuda"),
               torch.full((index.num_chunks, HV, 2), float("nan"), device="cuda"))  # fmt: skip
        ag, gcum = ag_hopper(k, g, beta, index=index, bnd=bnd, v=v, rev=rev, q=q, blocks=blocks, quad=quad)
        return [ag, gcum, bnd, *rev]

    ref, got = run(0, False), run(*knobs)
    assert_rel_close("Ag", ref[0].double(), got[0].double(), 1e-2)
    for name, a, b in zip(("gcum", "bnd", "rev p", "rev chunk"), got[1:], ref[1:], strict=True):
        inf = torch.isinf(b)
        assert bool((torch.isinf(a) == inf).all()), name
        torch.testing.assert_close(a[~inf], b[~inf], rtol=1e-6, atol=1e-6, msg=lambda m, n=name: f"{n}: {m}")
