"""Tiles shared by the backward's gradient kernels (`kernels.common.chunk_bwd`'s pair `chunk_bwd_dqk` + `wy_bwd`
and the fused `kernels.common.dqk_wy_bwd`): the decayed products of the in-chunk gradients (R(X, b), Cc(X, a) of
chunk_bwd's docstring, per key for KDA), the floored gate cumsum tile, and the launchers' shape key, bounds, grid
and column blocks.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl
from torch import Tensor

from kernels.common.chunk_program import chunk_of_program
from kernels.common.index import ChunkIndex
from kernels.common.wy import FAST_SPAN, FLOOR
from kernels.configs import HOPPER_MISCOMPILE_TRITON, LaunchConfig, cdiv, head_block, version_tuple

# ---------------------------------------------------------------------------------------------------------------------
# device helpers


@triton.jit
def _dot_prec(a, b, DT: tl.constexpr, PREC: tl.constexpr):
    """a @ b (2-D or batched 3-D) with operands rounded to DT ("bf16") or kept fp32 at Triton's input_precision."""
    if PREC == "bf16":
        return tl.dot(a.to(DT), b.to(DT))
    else:
        return tl.dot(a, b, input_precision=PREC)


@triton.jit
def _rows_vec(X, b, G, BT: tl.constexpr, BK: tl.constexpr, DT: tl.constexpr, PREC: tl.constexpr):
    """R_i = sum_{j <= i} X_ij b_j exp(G_i - G_j) per key: X [BT, BT] fp32 zero above the diagonal, b and G
    [BT, BK] fp32 (G non-increasing down the rows), for any gate. Row block I uses exp(G_i - r_I) exp(r_I - G_j)
    (one batched [BT/16, 16, BT] x [BT/16, BT, BK] product): if every key's decay over every block spans less
    than FAST_SPAN (`kernels.common.wy`), r_I is the block's midpoint and the product covers j inside block I too
    (factors within e^(FAST_SPAN/2)); else r_I = g_I, the gate before block I, the product covers the earlier
    blocks only (factors <= 1) and j inside block I takes exp(G_i - G_j) elementwise (`_diag_rows`)."""
    NB: tl.constexpr = BT // 16
    o_t = tl.arange(0, BT)
    o_b = tl.arange(0, NB)
    gI = tl.sum(tl.where(o_t[None, :, None] == (16 * o_b - 1)[:, None, None], G[None, :, :], 0.0), 1)  # [NB, BK]
    eI = tl.sum(tl.where(o_t[None, :, None] == (16 * o_b + 15)[:, None, None], G[None, :, :], 0.0), 1)
    fast = tl.max(tl.max(gI - eI, 1), 0) < FAST_SPAN
    rI = tl.where(fast, 0.5 * (gI + eI), gI)
    m = o_t[None, :, None] < (16 * o_b + tl.where(fast, 16, 0))[:, None, None]
    right = b[None, :, :] * tl.exp(tl.where(m, rI[:, None, :] - G[None, :, :], float("-inf")))  # [NB, BT, BK]
    part = _dot_prec(tl.reshape(X, (NB, 16, BT)), right, DT, PREC)  # [NB, 16, BK]
    G3 = tl.reshape(G, (NB, 16, BK))
    part = part * tl.exp(G3 - rI[:, None, :])
    if not fast:
        part += _diag_rows(tl.reshape(X, (NB, 16, BT)), tl.reshape(b, (NB, 16, BK)), G3, BT, NB)
    return tl.reshape(part, (BT, BK))


@triton.jit
def _diag_rows(X3, b3, G3, BT: tl.constexpr, NB: tl.constexpr):
    """sum_{j in block I, j <= i} X_ij b_j exp(G_i - G_j) for the rows i of every block I: X3 [NB, 16, BT] (row
    blocks of X), b3 and G3 [NB, 16, BK]; the decay elementwise (exponent <= 0), one column j of the block a step."""
    o_t = tl.arange(0, BT)
    o_i = tl.arange(0, 16)
    o_b = tl.arange(0, NB)
    D = tl.zeros_like(G3)
    for jj in range(16):
        xc = tl.sum(tl.where(o_t[None, None, :] == (16 * o_b + jj)[:, None, None], X3, 0.0), 2)  # [NB, 16] X_i,16I+jj
        m_j = (o_i == jj)[None, :, None]
        gj = tl.sum(tl.where(m_j, G3, 0.0), 1)  # [NB, BK]
        bj = tl.sum(tl.where(m_j, b3, 0.0), 1)
        e = tl.exp(tl.where((o_i >= jj)[None, :, None], G3 - gj[:, None, :], float("-inf")))
        D += xc[:, :, None] * bj[:, None, :] * e
    return D


@triton.jit
def _cols_vec(X, a, G, BT: tl.constexpr, BK: tl.constexpr, DT: tl.constexpr, PREC: tl.constexpr):
    """Cc_j = sum_{i >= j} X_ij a_i exp(G_i - G_j) per key (as `_rows_vec`: split at r_J, the midpoint of j's block
    when every span is below FAST_SPAN, the product then covering i inside j's block too; else at its last row e_J,
    for i in the later blocks, and elementwise for i inside j's block, `_diag_cols`)."""
    NB: tl.constexpr = BT // 16
    o_t = tl.arange(0, BT)
    o_b = tl.arange(0, NB)
    gJ = tl.sum(tl.where(o_t[None, :, None] == (16 * o_b - 1)[:, None, None], G[None, :, :], 0.0), 1)  # [NB, BK]
    eJ = tl.sum(tl.where(o_t[None, :, None] == (16 * o_b + 15)[:, None, None], G[None, :, :], 0.0), 1)
    fast = tl.max(tl.max(gJ - eJ, 1), 0) < FAST_SPAN
    rJ = tl.where(fast, 0.5 * (gJ + eJ), eJ)
    m = o_t[None, :, None] >= (16 * o_b + tl.where(fast, 0, 16))[:, None, None]
    left = a[None, :, :] * tl.exp(tl.where(m, G[None, :, :] - rJ[:, None, :], float("-inf")))  # [NB, BT, BK]
    Xt3 = tl.reshape(tl.trans(X), (NB, 16, BT))
    part = _dot_prec(Xt3, left, DT, PREC)  # [NB, 16, BK]
    G3 = tl.reshape(G, (NB, 16, BK))
    part = part * tl.exp(rJ[:, None, :] - G3)
    if not fast:
        part += _diag_cols(Xt3, tl.reshape(a, (NB, 16, BK)), G3, BT, NB)
    return tl.reshape(part, (BT, BK))


@triton.jit
def _diag_cols(Xt3, a3, G3, BT: tl.constexpr, NB: tl.constexpr):
    """sum_{i in block J, i >= j} X_ij a_i exp(G_i - G_j) for the columns j of every block J: Xt3 [NB, 16, BT] (row
    blocks of X^T), a3 and G3 [NB, 16, BK]; the decay elementwise (exponent <= 0), one row i of the block a step."""
    o_t = tl.arange(0, BT)
    o_i = tl.arange(0, 16)
    o_b = tl.arange(0, NB)
    D = tl.zeros_like(G3)
    for ii in range(16):
        xc = tl.sum(tl.where(o_t[None, None, :] == (16 * o_b + ii)[:, None, None], Xt3, 0.0), 2)  # [NB, 16] X_16J+ii,j
        m_i = (o_i == ii)[None, :, None]
        gi = tl.sum(tl.where(m_i, G3, 0.0), 1)  # [NB, BK]
        ai = tl.sum(tl.where(m_i, a3, 0.0), 1)
        e = tl.exp(tl.where((o_i <= ii)[None, :, None], gi[:, None, :] - G3, float("-inf")))
        D += xc[:, :, None] * ai[:, None, :] * e
    return D


@triton.jit
def _gate_tile(g, p_row, m_r, o_k, K: tl.constexpr, GATE_VECTOR: tl.constexpr):
    """The in-chunk cumsum of the raw gate, floored (kernels.common.decay): [BT, BK] (KDA, columns o_k) or [BT, 1]
    (GDN), fp32; 0 past T and K."""
    if GATE_VECTOR:
        b_g = tl.load(g + p_row[:, None] * K + o_k[None, :], mask=m_r[:, None] & (o_k < K)[None, :], other=0.0).to(tl.float32)
        b_G = tl.cumsum(tl.maximum(b_g, FLOOR), 0)
    else:
        b_g = tl.load(g + p_row, mask=m_r, other=0.0).to(tl.float32)
        b_G = tl.cumsum(tl.maximum(b_g, FLOOR), 0)[:, None]
    return b_G


@triton.jit
def _chunk_rows(cu_seqlens, chunk_indices, T, H: tl.constexpr, BT: tl.constexpr, IS_VARLEN: tl.constexpr):
    """This program's chunk (grid (chunks, B * H), `chunk_of_program`): (head i_h, chunk i_t, global chunk i_tg, first
    token bos, sequence length T, the chunk's rows o_r, their mask m_r (< T), their offsets p_row in [.., T, H])."""
    i_c, i_bh = tl.program_id(0), tl.program_id(1)
    i_b, i_h = i_bh // H, i_bh % H
    _, i_t, i_tg, bos, T = chunk_of_program(i_c, i_b, cu_seqlens, chunk_indices, T, BT, IS_VARLEN)
    o_r = i_t * BT + tl.arange(0, BT)
    return i_h, i_t, i_tg, bos, T, o_r, o_r < T, (bos + o_r) * H + i_h


@triton.jit
def _wy_rows(tt, beta, p_row, m_r, BT: tl.constexpr, dt: tl.constexpr):
    """(T^T of the chunk in dt, from its lower blocks incl. the diagonal; beta of its rows, fp32 [BT])."""
    o_t = tl.arange(0, BT)
    m_low = m_r[:, None] & (o_t[:, None] >= o_t[None, :])
    b_Tt = tl.trans(tl.load(tt + p_row[:, None] * BT + o_t[None, :], mask=m_low, other=0.0)).to(dt)
    return b_Tt, tl.load(beta + p_row, mask=m_r, other=0.0).to(tl.float32)


@triton.jit
def _state_products(h, dh, v_new, dv_new, do, p_h, p_row, m_r, o_k, K: tl.constexpr, V: tl.constexpr,
                    BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, WITH_DA: tl.constexpr):  # fmt: skip
    """The chunk's products with its state S ([K, V] at p_h of h) and the gradient dS' at its end (dh), over V blocks,
    for the key columns o_k [BK] (fp32): (dQg = dO S^T, dK~ = v_new dS'^T, dw = dv_new S^T (not negated), each
    [BT, BK]; dgamma = rowsum_V(S * dS') [BK]; dO v_new^T [BT, BT] if WITH_DA, else zeros)."""
    m_k = o_k < K
    b_dqg = tl.zeros([BT, BK], dtype=tl.float32)
    b_dkt = tl.zeros([BT, BK], dtype=tl.float32)
    b_dw = tl.zeros([BT, BK], dtype=tl.float32)
    b_da = tl.zeros([BT, BT], dtype=tl.float32)
    b_dgam = tl.zeros([BK], dtype=tl.float32)
    for i_v in range(tl.cdiv(V, BV)):
        o_v = i_v * BV + tl.arange(0, BV)
        m_v = o_v < V
        p_v = p_row[:, None] * V + o_v[None, :]
        m_rv = m_r[:, None] & m_v[None, :]
        p_s = p_h + o_k[:, None] * V + o_v[None, :]
        b_h = tl.load(h + p_s, mask=m_k[:, None] & m_v[None, :], other=0.0)  # [BK, BV]
        b_dh = tl.load(dh + p_s, mask=m_k[:, None] & m_v[None, :], other=0.0)
        b_vn = tl.load(v_new + p_v, mask=m_rv, other=0.0)
        b_do = tl.load(do + p_v, mask=m_rv, other=0.0)
        b_dqg = tl.dot(b_do, tl.trans(b_h), b_dqg)
        b_dw = tl.dot(tl.load(dv_new + p_v, mask=m_rv, other=0.0), tl.trans(b_h), b_dw)
        b_dkt = tl.dot(b_vn, tl.trans(b_dh), b_dkt)
        if WITH_DA:
            b_da = tl.dot(b_do, tl.trans(b_vn), b_da)
        b_dgam += tl.sum(b_h.to(tl.float32) * b_dh.to(tl.float32), 1)
    return b_dqg, b_dkt, b_dw, b_dgam, b_da


@triton.jit
def _dg_columns(dg, g, b_dG, b_dgs, p_k, m_rk, GATE_VECTOR: tl.constexpr):
    """One column block of dG (the gradient of the in-chunk gate cumsum, [BT, BK] fp32): KDA stores dg = its reverse
    in-chunk cumsum (0 where the gate is below the floor: the clamp's gradient, `kernels.common.decay`); GDN adds its
    row sums to b_dgs [BT] (`_store_dg_rows` stores them). Returns b_dgs."""
    if GATE_VECTOR:
        b_dG = tl.where(tl.load(g + p_k, mask=m_rk, other=0.0) < FLOOR, 0.0, tl.cumsum(b_dG, 0, reverse=True))
        tl.store(dg + p_k, b_dG.to(dg.dtype.element_ty), mask=m_rk)
    else:
        b_dgs += tl.sum(b_dG, 1)
    return b_dgs


@triton.jit
def _store_dg_rows(dg, g, b_dgs, p_row, m_r):
    """GDN's dg: the reverse in-chunk cumsum of the row sums b_dgs [BT] (0 where the gate is below the floor)."""
    b_dgs = tl.where(tl.load(g + p_row, mask=m_r, other=0.0) < FLOOR, 0.0, tl.cumsum(b_dgs, 0, reverse=True))
    tl.store(dg + p_row, b_dgs.to(dg.dtype.element_ty), mask=m_r)


# ---------------------------------------------------------------------------------------------------------------------
# host helpers


def _key(index: ChunkIndex, H: int, K: int, V: int, gate_vector: bool, dtype: torch.dtype) -> dict[str, object]:
    return {
        "H": H,
        "K": K,
        "V": V,
        "BT": index.chunk_size,
        "GATE": "vector" if gate_vector else "scalar",
        "IS_VARLEN": index.is_varlen,
        "dtype": str(dtype).removeprefix("torch."),
    }


def _bounds(index: ChunkIndex) -> tuple[Tensor | None, Tensor | None]:
    return (index.cu_seqlens, index.chunk_indices) if index.is_varlen else (None, None)


def _chunk_grid(index: ChunkIndex, B: int, T: int, H: int) -> tuple[int, int]:
    return (index.num_chunks, H) if index.is_varlen else (cdiv(T, index.chunk_size), B * H)


def per_value_head(x: Tensor, H: int) -> Tensor:
    """The gradient buffer of q or k (`x` [B, T, Hk, K]) as a kernel writes it: one slice per value head ([B, T, H, K]
    with grouped heads, H = G * Hk), in x's dtype; `group_sum` reduces it. FLA's reduction: the partials in the input
    dtype (fp32 partials held 1024 B per token and value head more at the step's peak, `benchmarks/step_memory.py`)."""
    B, T, Hk, K = x.shape
    return torch.empty_like(x) if Hk == H else x.new_empty(B, T, H, K)


def group_sum(x: Tensor, Hk: int) -> Tensor:
    """A `per_value_head` buffer summed over each key head's group ([B, T, Hk, K]; torch accumulates a bf16 sum in
    fp32). Rebind the buffer's name to the result so the partials are freed before the next one is summed. Groups of
    two (HV = 2 H) are one elementwise add of the two halves (the same value: one fp32 add rounded once): torch's
    `sum` over that middle dim took 2.18 ms for dq and dk at 1x128K, HV = 32 on the H200, 2.8x the bytes' floor
    (session 24, `benchmarks/results/kernels_train_issue26_s24g_h200.md`)."""
    B, T, H, K = x.shape
    if Hk == H:
        return x
    g = x.view(B, T, Hk, H // Hk, K)
    return torch.add(g[:, :, :, 0], g[:, :, :, 1]) if H // Hk == 2 else g.sum(3)


def _fit(cfg: LaunchConfig, K: int, V: int, at_least: int = 16) -> tuple[int, int]:
    """The column blocks: the config's, at most the tile of the head dim (`head_block`; the last block is masked),
    and at least `at_least` (wider than a small head dim: the block's columns past it are masked)."""
    BK = max(min(cfg.BK or 64, head_block(K)), at_least)
    BV = max(min(cfg.BV or 64, head_block(V)), at_least)
    assert BK >= 16 and BV >= 16, f"bad column blocks BK={BK} BV={BV} for K={K} V={V}"
    return BK, BV


@functools.cache
def hopper_miscompile_range(device: torch.device) -> bool:
    """Whether `device` is an sm_90 GPU under a Triton of the range with known Hopper miscompiles
    (`kernels.configs.HOPPER_MISCOMPILE_TRITON`, the tuner's rules' range); asked once per device (KDA's backward
    launchers ask it every step)."""
    if device.type != "cuda" or torch.cuda.get_device_capability(device)[0] != 9:
        return False
    low, high = HOPPER_MISCOMPILE_TRITON
    return low <= version_tuple(triton.__version__) <= high


# KDA's pair (`chunk_bwd_dqk`, `wy_bwd`) on such a device launches column blocks of at least this many columns (the
# columns past a smaller head dim masked), and its fused kernel refuses narrower ones (`dqk_wy_bwd`): on the H200
# (Triton 3.6.0) its `wy_bwd_kernel` faulted with an illegal memory access at K = V = 32 (bf16) and at K = V = 16
# (fp32), grouped heads or not; K = V = 64 passed (session 20, `benchmarks/device_runs/s20_kda_k16.py`); with the
# wider blocks `tests/kernels/test_dispatch_grouped.py` passes on the H200 (session 21)
KDA_HOPPER_MIN_BLOCK = 64


def pair_blocks(cfg: LaunchConfig, K: int, V: int, gate_vector: bool, device: torch.device) -> tuple[int, int]:
    """The pair's column blocks (`_fit`), at least KDA_HOPPER_MIN_BLOCK wide for KDA on a device of the miscompile
    range."""
    wide = gate_vector and hopper_miscompile_range(device)
    return _fit(cfg, K, V, KDA_HOPPER_MIN_BLOCK if wide else 16)
