"""`benchmarks/step_memory.py`'s live-bytes tracker on plain torch ops: a storage counts from its creation to the death
of its last tensor (views share it; a tensor autograd saved lives with the graph), and the peak keeps what was live
at it."""

from __future__ import annotations

import torch

from tests.utils.scripts import load_script

sm = load_script("step_memory")


def test_storages_count_while_a_tensor_lives_and_views_do_not_count_twice() -> None:
    x = torch.randn(64, requires_grad=True)  # made before the mode: not counted
    with sm.LiveBytes() as live:
        a = torch.empty(1000, dtype=torch.float32)
        view = a[10:20].view(2, 5)
        assert live.now == live.peak == 4000
        y = x.exp()  # exp saves its result for the backward
        z = y.sum()
        del y
        assert live.now == 4000 + 256 + 4, "the graph keeps exp's output alive after the name is gone"
        del z
        assert live.now == 4000
        del a
        assert live.now == 4000, "a view keeps its storage"
        del view
        assert live.now == 0
        b = torch.zeros(10, dtype=torch.float64)
    assert live.peak == 4000 + 256 + 4
    assert sorted(n for n, _, _ in live.at_peak) == [4, 256, 4000]
    assert live.now == 80 and b.numel() == 10


def test_grouped_heads_hold_less_than_ungrouped_heads_per_value_head() -> None:
    """GDN's training step under the interpreter in bf16 (the bytes are the GPU's; the values are not checked here):
    with two value heads per q/k head the step's peak per token and value head is the ungrouped step's less dq and
    dk's halves (2 K bytes: the fused gradient kernel sums them over the group in place, session 19). Before, it
    held the per-value-head dq and a summed one (K bytes more than ungrouped); with fp32 partials (before session
    14) 4 K bytes more again."""
    K = 32
    peaks = {}
    for H in (1, 2):
        live, _ = sm.measure("gdn", "ours", B=1, T=128, H=H, HV=2, K=K, device="cpu")
        peaks[H] = live.peak / (128 * 2)
    assert peaks[2] > 20 * K, peaks  # the step holds its intermediates (h, w, u, v_new, dv_new, ...)
    assert peaks[1] <= peaks[2] - 2 * K, peaks
