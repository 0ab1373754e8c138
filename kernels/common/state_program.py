"""Triton device helpers shared by the serial passes over chunks and segments (GDN and KDA): which range a state pass
program walks (`range_of_program`: the forward and reverse state passes) and the start of a chain over a sequence's
segments (`chain_start`: the forward and reverse segment chains). The chunk-parallel kernels' helper is
`kernels.common.chunk_program`.
"""

from __future__ import annotations

import triton
import triton.language as tl

__all__ = ["chain_dropped", "chain_start", "range_of_program"]


@triton.jit
def range_of_program(
    i_n, seq_map, cu_seqlens, chunk_offsets, T, BT: tl.constexpr, IS_VARLEN: tl.constexpr, USE_SEQ_MAP: tl.constexpr
):
    """(range i_s, first token bos, length T, first global chunk boc, chunk count NT) that program row i_n walks in a
    serial state pass (forward or reverse): range seq_map[i_n] with a map, else i_n; varlen bounds or dense rows."""
    if USE_SEQ_MAP:
        i_s = tl.load(seq_map + i_n).to(tl.int64)
    else:
        i_s = i_n
    if IS_VARLEN:
        bos = tl.load(cu_seqlens + i_s).to(tl.int64)
        eos = tl.load(cu_seqlens + i_s + 1).to(tl.int64)
        T = eos - bos
        boc = tl.load(chunk_offsets + i_s).to(tl.int64)
    else:
        bos = i_s * T
        boc = i_s * tl.cdiv(T, BT)
    return i_s, bos, T, boc, tl.cdiv(T, BT)


@triton.jit
def chain_start(
    seg_ptr, x0, H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr, USE_X0: tl.constexpr
):
    """The start of a serial chain over a sequence's segments (grid (V / BV, N * H)): (sequence i_n, head i_h, its
    segments [s0, s1), the key rows o_k and value columns o_v with their masks m_kv [BK, BV] and m_kk [BK, BK], and the
    fp32 [BK, BV] state x0[i_n, i_h] (zeros without x0)); K padded to a power of two, rows and map columns past K
    masked."""
    i_v, i_nh = tl.program_id(0), tl.program_id(1)
    i_n, i_h = (i_nh // H).to(tl.int64), i_nh % H
    s0 = tl.load(seg_ptr + i_n).to(tl.int64)
    s1 = tl.load(seg_ptr + i_n + 1).to(tl.int64)
    o_k = tl.arange(0, BK)
    o_v = i_v * BV + tl.arange(0, BV)
    m_kv = (o_k < K)[:, None] & (o_v < V)[None, :]
    m_kk = (o_k < K)[:, None] & (o_k < K)[None, :]
    b_s = tl.zeros([BK, BV], dtype=tl.float32)
    if USE_X0:
        b_s += tl.load(x0 + (i_n * H + i_h) * K * V + o_k[:, None] * V + o_v[None, :], mask=m_kv, other=0.0)
    return i_n, i_h, s0, s1, o_k, o_v, m_kv, m_kk, b_s


@triton.jit
def chain_dropped(drop, row, H: tl.constexpr, i_h, USE_DROP: tl.constexpr):
    """Whether a chain step drops its map (a certified warm window, `kernels.common.warm_split` / `warm_bwd`): drop's
    uint8 flag at [row, i_h] (False without USE_DROP). Uniform per program: the step is then a load, not a product."""
    if USE_DROP:
        return tl.load(drop + row * H + i_h) != 0
    else:
        return False
