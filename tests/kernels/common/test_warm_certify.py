"""The one-launch certification (`kernels.common.warm_certify`) against `decay_bound`'s torch form on random chunk
sums: the fp64 bound at 1e-12 relative and the certified flags equal, with silent chunks (W = -inf), an invalid
window, the chunk sums' strided [NT, H, 2] layout and both outcomes present (interpreted on CPU; on a GPU with
CPBENCH_TEST_GPU=1)."""

from __future__ import annotations

import torch

from kernels.common.decay_bound import log_window_bound, window_certified
from kernels.common.warm_certify import certify_chunk_windows
from tests.utils import TEST_DEVICE

NT, H, K, V = 600, 3, 8, 4  # 600 chunks: three scan blocks of 256
TOL = 1e-3


def test_certify_chunk_windows_matches_decay_bound() -> None:
    gen = torch.Generator().manual_seed(5)
    bnd = torch.empty(NT, H, 2)
    bnd[..., 0] = -torch.rand(NT, H, generator=gen) * torch.tensor([0.05, 3.0, 20.0])  # weak, middling, strong heads
    bnd[..., 1] = torch.randn(NT, H, generator=gen)
    bnd[100:110, :, 1] = float("-inf")  # silent chunks
    bnd = bnd.to(TEST_DEVICE)
    starts = torch.tensor([1, 98, 255, 256, 300, 590, 400], device=TEST_DEVICE)
    ends = starts + torch.tensor([2, 4, 1, 3, 2, 10, 4], device=TEST_DEVICE)
    valid = torch.ones(len(starts), dtype=torch.bool, device=TEST_DEVICE)
    valid[-1] = False
    E_win = torch.randn(len(starts), H, K, V, generator=gen).to(TEST_DEVICE) * 0.5
    ell, log_u = bnd[..., 0], bnd[..., 1]
    lb, ok, need = certify_chunk_windows(ell, log_u, starts, ends, valid, E_win, TOL)
    lb_ref = log_window_bound(ell.double(), log_u.double(), ends, starts, valid)
    ok_ref = window_certified(lb_ref, torch.linalg.vector_norm(E_win, dim=(-2, -1)).double().log(), TOL)
    fin = torch.isfinite(lb_ref)
    assert torch.equal(fin, torch.isfinite(lb)) and torch.equal(lb_ref[~fin], lb[~fin]), (lb, lb_ref)
    assert torch.allclose(lb[fin], lb_ref[fin], rtol=1e-12, atol=1e-12), (lb - lb_ref).abs().max()
    assert torch.equal(ok, ok_ref), (ok, ok_ref)
    assert torch.equal(need, ~ok_ref), need  # (session 32) the transitions' flags from the same launch
    assert ok.any() and not ok.all() and ok[-1].all(), ok  # both outcomes; the invalid window drops nothing
