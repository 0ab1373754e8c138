"""KDA's pair (`chunk_bwd_dqk` + `wy_bwd`) with column blocks wider than the head dim (`bwd_tiles.pair_blocks`).

On sm_90 under Triton 3.4-3.7.0 (`kernels.configs.HOPPER_MISCOMPILE_TRITON`) KDA's `wy_bwd_kernel` faulted with an
illegal memory access at K = V = 32 (bf16) and 16 (fp32) on the H200 (session 20, `benchmarks/device_runs/
s20_kda_k16.py`), grouped value heads or not, where K = V = 64 passed. There KDA's pair launches blocks of at least
64 columns, the columns past the head dim masked. Here (the interpreter, fp32) that path is forced by patching the
device check, at K = V = 16 and 32, grouped (HV = 2H) and not, and the gradients are checked against autograd
through the fp32 per-token reference expanded by hand (1e-5 relative L2, as `test_chunk_bwd.py`); the pair must
really have launched 64-wide blocks; unpatched, the device check alone decides (the head dim's blocks off the range).
"""

from __future__ import annotations

import pytest
import torch

import kernels
import kernels.common.bwd_tiles as bwd_tiles
import kernels.common.chunk_bwd as chunk_bwd
from kernels.configs import LaunchConfig
from tests.utils import TEST_DEVICE, assert_rel_close, make_inputs, make_state

TOL = 1e-5 if TEST_DEVICE == "cpu" else 5e-3
NAMES = ("dq", "dk", "dv", "dg", "dbeta", "dh0")


def _grads(K: int, H: int, HV: int, wide: bool, monkeypatch: pytest.MonkeyPatch) -> tuple[list, list, list]:
    """(ours, the reference's gradients, the pair's launched column blocks) of one KDA step at K = V."""
    _, _, v, g, beta, _ = make_inputs("kda", None, B=1, T=70, H=HV, K=K, V=K, lb=-1.0, seed=3, device=TEST_DEVICE)
    q, k, _, _, _, _ = make_inputs("kda", None, B=1, T=70, H=H, K=K, V=K, seed=4, device=TEST_DEVICE)
    h0 = make_state(1, HV, K, K, device=TEST_DEVICE)
    do = torch.randn(v.shape, generator=torch.Generator().manual_seed(5)).to(TEST_DEVICE)
    if wide:
        monkeypatch.setattr(bwd_tiles, "hopper_miscompile_range", lambda device: True)
    launched = []
    real = chunk_bwd.pair_blocks

    def spy(*args, **kw):  # noqa: ANN002, ANN003, ANN202
        launched.append(real(*args, **kw))
        return launched[-1]

    monkeypatch.setattr(chunk_bwd, "pair_blocks", spy)
    ours = [x.detach().clone().requires_grad_() for x in (q, k, v, g, beta, h0)]
    o, _ = kernels.chunk_kda(*ours[:5], initial_state=ours[5], backend="triton")
    (o * do).sum().backward()
    ref = [x.detach().clone().requires_grad_() for x in (q, k, v, g, beta, h0)]
    G = HV // H
    ro, _ = kernels.reference("kda", ref[0].repeat_interleave(G, 2), ref[1].repeat_interleave(G, 2), *ref[2:5],
                              initial_state=ref[5])  # fmt: skip
    (ro * do).sum().backward()
    return [x.grad for x in ours], [x.grad for x in ref], launched


@pytest.mark.parametrize("K", [16, 32])
@pytest.mark.parametrize(("H", "HV"), [(2, 2), (1, 2)], ids=["plain", "grouped"])
def test_kda_pair_with_blocks_wider_than_the_head_dim(K: int, H: int, HV: int, monkeypatch: pytest.MonkeyPatch) -> None:
    ours, ref, launched = _grads(K, H, HV, True, monkeypatch)
    for name, a, r in zip(NAMES, ours, ref, strict=True):
        assert_rel_close(name, r, a, TOL)
    # chunk_bwd_dqk, then wy_bwd; on a GPU the public op's first call also compiles through them (parallel compile)
    assert launched[-2:] == [(64, 64), (64, 64)] and set(launched) == {(64, 64)}


def test_the_device_check_decides_the_blocks(monkeypatch: pytest.MonkeyPatch) -> None:
    """Unpatched: the head dim's blocks off the miscompile range (this CPU), 64-wide ones in it (an H200 GPU run); GDN
    (the scalar gate) keeps the config's blocks everywhere."""
    wide = bwd_tiles.hopper_miscompile_range(torch.device(TEST_DEVICE))
    _, _, launched = _grads(16, 2, 2, False, monkeypatch)
    assert launched[-2:] == [(64, 64) if wide else (16, 16)] * 2 and len(set(launched)) == 1
    cfg = LaunchConfig(BK=32, BV=32, num_warps=4, num_stages=2)
    assert bwd_tiles.pair_blocks(cfg, 128, 128, False, torch.device("cpu")) == (32, 32)
