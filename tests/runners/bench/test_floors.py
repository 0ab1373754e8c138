"""The floors of the kernel benchmarks (`runners.bench.floors`), defined once: each launcher's bytes and flops equal
a hand count of the tensors it reads and writes, and the whole forward's floor is the one the table uses."""

from __future__ import annotations

import math

import pytest

from runners.bench.floors import (
    HBM_TBPS,
    LAUNCHERS,
    bwd_launcher_bytes,
    bytes_floor,
    floor_ms,
    flops_floor,
    launcher_bytes,
    launcher_flops,
    reverse_walk_flops,
)

B, T, HV, K, V = 2, 4096, 4, 128, 128  # 8192 tokens x 4 value heads
TH = B * T * HV  # token-heads


def test_gdn_bytes_per_launcher_equal_a_hand_count() -> None:
    # wy reads q, k, v, beta (bf16) and g (fp32); writes w, u, Aqk (64 per token, bf16) and the gate cumsum (fp32)
    assert launcher_bytes("gdn", "wy", B, T, HV) == TH * (2 * (128 + 128 + 128 + 1) + 4 + 2 * (128 + 128 + 64) + 4)
    # the state+output pass reads k, w, q, u, Aqk and the cumsum, writes o
    assert launcher_bytes("gdn", "state_plain", B, T, HV) == TH * (2 * (3 * 128 + 128 + 64) + 4 + 2 * 128)
    # the whole forward: q, k, v, beta, g in, o out
    assert bytes_floor("gdn", B, T, HV) == TH * (2 * (128 + 128 + 128 + 1) + 4 + 2 * 128) == TH * 1030


def test_kda_bytes_count_its_key_wide_gate() -> None:
    # g [.., K] fp32 in; the wy pass also writes k*g and q*g (bf16) and the chunk's gate [K] fp32 once per 64 tokens
    assert bytes_floor("kda", B, T, HV) == TH * (2 * (3 * 128 + 1) + 4 * 128 + 2 * 128)
    wy = TH * (2 * (3 * 128 + 1) + 4 * 128 + 2 * (128 + 128 + 64) + 4 * 128 / 64 + 2 * 2 * 128)
    assert launcher_bytes("kda", "wy", B, T, HV) == math.ceil(wy)


def test_backward_gradient_kernels_bytes_equal_a_hand_count() -> None:
    # chunk_bwd_dqk: q, k, v_new, dv_new, do (bf16), g (fp32), h and dh ([K, V] bf16 per 64 tokens); dq, dw out (bf16),
    # the fp32 dk and dG partials out
    dqk = 2 * (2 * 128 + 3 * 128) + 4 + 2 * 2 * 128 * 128 / 64 + 2 * 2 * 128 + 2 * 4 * 128
    # wy_bwd: k, v, beta, T (64 per token), w, u, dv_new, dw in (bf16), g and the two partials in; dk, dv, dbeta, dg out
    wy = 2 * (128 + 128 + 1 + 64 + 128 + 128 + 128 + 128) + 4 + 2 * 4 * 128 + 2 * (128 + 128 + 1) + 4
    # fused: the pair's inputs once, no w, u, dw or partials
    fused = 2 * (128 + 128 + 128 + 1 + 64 + 3 * 128) + 4 + 2 * 2 * 128 * 128 / 64 + 2 * (128 + 128 + 128 + 1) + 4
    assert [bwd_launcher_bytes("gdn", n, B, T, HV) for n in ("dqk", "wy_bwd", "dqk_wy")] == [TH * dqk, TH * wy, TH * fused]
    # what fusing saves: the partials and dw written and read back, w and u, the second reads of k, dv_new and g
    assert dqk + wy - fused == 2 * (2 * 4 * 128) + 2 * (2 * 128 + 4 * 128) + 4
    # KDA: g [K] fp32 in and dg [K] fp32 out, where GDN has 4 bytes each
    kda = bwd_launcher_bytes("kda", "dqk_wy", B, T, HV) - bwd_launcher_bytes("gdn", "dqk_wy", B, T, HV)
    assert kda == TH * 2 * (4 * 128 - 4)
    with pytest.raises(ValueError, match="unknown backward launcher 'wy'"):
        bwd_launcher_bytes("gdn", "wy", B, T, HV)


def test_reverse_walk_counts_its_inputs_once_and_its_products() -> None:
    # q, k, v, do, Ag (64 per token), beta in (bf16), g and its cumsum (fp32), h ([K, V] bf16 per 64 tokens); dq, dk,
    # dv out (bf16), dg and dbeta out (fp32)
    walk = 2 * (4 * 128 + 64 + 1) + 2 * 4 + 2 * 128 * 128 / 64 + 2 * 3 * 128 + 2 * 4
    assert bwd_launcher_bytes("gdn", "reverse", B, T, HV) == TH * walk
    # per chunk: 4 [C, C] grams over K or V (2 C^2 128 each), 3 C^3 (T, dA's two), 5 [C, 128] x [128, 128], 6
    # [C, C] x [C, 128], 2 [128, C] x [C, 128] (dS)
    per_chunk = 4 * 2 * 64 * 64 * 128 + 3 * 2 * 64**3 + 5 * 2 * 64 * 128 * 128 + 6 * 2 * 64 * 64 * 128 + 2 * 2 * 128 * 64 * 128
    assert reverse_walk_flops(B, T, HV) == B * (T // 64) * HV * per_chunk == B * (T // 64) * HV * 26738688


def test_split_launchers_count_their_segments() -> None:
    # 8 segments in the batch (4 per sequence): the transition pass skips each sequence's last segment and writes
    # M [K, K] and S [K, V] fp32 per segment; the chain reads them and writes h0
    seg = 8
    per_token = 2 * (2 * 128 + 128) + 4  # k, w, u (bf16), the cumsum (fp32)
    assert launcher_bytes("gdn", "transition", B, T, HV, segments=seg) == math.ceil(
        HV * (B * T * (1 - B / seg) * per_token + seg * 4 * (128 * 128 + 128 * 128))
    )
    assert launcher_bytes("gdn", "chain", B, T, HV, segments=seg) == HV * seg * 4 * (128 * 128 + 2 * 128 * 128)
    assert launcher_flops("gdn", "chain", B, T, HV, segments=seg) == HV * seg * 2 * 128**3
    assert (
        launcher_bytes("gdn", "state_split", B, T, HV, segments=seg)
        == launcher_bytes("gdn", "state_plain", B, T, HV) + HV * seg * 4 * 128 * 128
    )


def test_flops_per_launcher_and_the_forward() -> None:
    chunks = B * (T // 64) * HV
    assert launcher_flops("gdn", "wy", B, T, HV) == chunks * 2 * 64 * 64 * (3 * 128 + 128)
    assert launcher_flops("gdn", "state_plain", B, T, HV) == chunks * (6 * 64 * 128 * 128 + 2 * 64 * 64 * 128)
    # the forward's flops are wy + state: 2 C^2 (3K + 2V) + 6 C K V per chunk and head
    assert flops_floor(B, T, HV) == chunks * (2 * 64 * 64 * (3 * 128 + 2 * 128) + 6 * 64 * 128 * 128)
    assert flops_floor(B, T, HV) == launcher_flops("gdn", "wy", B, T, HV) + launcher_flops("gdn", "state_plain", B, T, HV)


def test_floor_ms_is_the_larger_of_bytes_and_flops() -> None:
    f = floor_ms(4.2e9, 1e12, 500.0)  # 4.2 GB at 4.2 TB/s: 1 ms; 1 TFLOP at 500 TFLOP/s: 2 ms
    assert f["bytes_ms"] == pytest.approx(1.0) and f["flops_ms"] == pytest.approx(2.0) and f["floor_ms"] == pytest.approx(2.0)
    unmeasured = floor_ms(4.2e9, 1e12, float("nan"))  # a CPU run has no matmul rate: the bytes floor alone
    assert math.isnan(unmeasured["flops_ms"]) and unmeasured["floor_ms"] == pytest.approx(1e3 * 4.2e9 / (HBM_TBPS * 1e12))
    with pytest.raises(ValueError, match="unknown launcher 'wyy'"):
        launcher_bytes("gdn", "wyy", B, T, HV)
    assert set(LAUNCHERS) >= {"wy", "transition", "chain", "state_plain", "state_split", "forward"}


def test_two_kernel_forward_launchers() -> None:
    """The Ag pass and the fused pass (`kernels.ops.<op>.wy_ag`, `fused`): KDA's Ag pass reads q, k, beta, g [K] and
    writes Ag, Aqk and the per-key cumsum; its fused pass reads q, k, v, Ag, Aqk, the cumsum and writes o."""
    K = V = 128
    per_token = {"ag": 2 * (2 * K + 1) + 4 * K + 2 * 2 * 64 + 4 * K, "fused": 2 * (2 * K + 2 * V + 2 * 64) + 4 * K}
    for name, n in per_token.items():
        assert launcher_bytes("kda", name, B, T, HV) == B * T * HV * n
    gdn_ag = 2 * (K + 1) + 4 + 2 * 64 + 4  # k, beta, g; Ag, gcum
    assert launcher_bytes("gdn", "ag", B, T, HV) == B * T * HV * gdn_ag
    assert launcher_flops("kda", "ag", B, T, HV) == 2 * launcher_flops("gdn", "ag", B, T, HV)
