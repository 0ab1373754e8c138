"""The chunk-parallel output pass (GDN and KDA), one Triton program per (V-block, chunk, head).

With S the state entering the chunk (stored by `chunk_state_fwd`) and v_new = u - w S:

    GDN: o = scale (Q * exp G) S + Aqk v_new
    KDA: o = qg S + Aqk v_new          (qg = scale Q exp G; Aqk = scale (Q K^T (x) exp(G_i - G_j) (x) causal),
                                        both from `kernels.common.wy`)

Used when the output is not fused into the state pass (`chunk_state_output_fwd`).
Grid: dense (V/BV, NT, B*H); varlen (V/BV, NT_total, H).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from kernels.common.chunk_program import chunk_of_program, heuristics
from kernels.common.index import ChunkIndex
from kernels.configs import KernelSpec, LaunchConfig, cdiv, head_block, register
from kernels.plan import LaunchPlan, launch_config

__all__ = ["CHUNK_OUTPUT_FWD", "chunk_output_fwd"]

CHUNK_OUTPUT_FWD = register(KernelSpec(
    name="chunk_output_fwd",
    key=("H", "K", "V", "BT", "GATE", "IS_VARLEN", "dtype"),
    # FLA's chunk_fwd_o list on Hopper: (BV 128, 8 warps) and (64, 4); 64/4 keeps 2+ programs per SM
    default=LaunchConfig(BV=64, num_warps=4, num_stages=2),
    space={"BV": (32, 64, 128), "num_warps": (4, 8), "num_stages": (1, 2, 3)},
))


@heuristics({"IS_VARLEN": lambda args: args["cu_seqlens"] is not None,
             "G": lambda args: args["v_new"].shape[2] // args["q"].shape[2]})  # value heads per q head
@triton.jit(do_not_specialize=["T"])
def chunk_output_fwd_kernel(
    q,  # [B, T, H, K]: q (GDN) or qg (KDA)
    v_new,  # [B, T, H, V]
    h,  # [NT_total, H, K, V] states entering each chunk
    g,  # GDN: gate cumsum [B, T, H] fp32 (unused for KDA)
    aqk,  # [B, T, H, BT]: scale (QK^T (x) decay), lower incl. diagonal
    o,  # out [B, T, H, V]
    cu_seqlens,
    chunk_indices,
    scale,
    T,
    H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    GATE_VECTOR: tl.constexpr, IS_VARLEN: tl.constexpr, G: tl.constexpr,
):
    i_v, i_c, i_bh = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    i_b, i_h = i_bh // H, i_bh % H
    _, i_t, i_tg, bos, T = chunk_of_program(i_c, i_b, cu_seqlens, chunk_indices, T, BT, IS_VARLEN)
    dt = v_new.dtype.element_ty

    o_k = tl.arange(0, BK)  # K padded to a power of two, the columns past K masked
    m_k = o_k < K
    o_t = tl.arange(0, BT)
    o_v = i_v * BV + tl.arange(0, BV)
    m_v = o_v < V
    o_r = i_t * BT + o_t
    m_r = o_r < T
    p_row = (bos + o_r) * H + i_h
    m_causal = o_t[:, None] >= o_t[None, :]

    b_h = tl.load(h + (i_tg * H + i_h) * K * V + o_k[:, None] * V + o_v[None, :], mask=m_k[:, None] & m_v[None, :],
                  other=0.)  # [BK, BV]
    b_q = tl.load(q + ((bos + o_r) * (H // G) + i_h // G)[:, None] * K + o_k[None, :], mask=m_r[:, None] & m_k[None, :], other=0.)
    b_v = tl.load(v_new + p_row[:, None] * V + o_v[None, :], mask=m_r[:, None] & m_v[None, :], other=0.)
    b_A = tl.load(aqk + p_row[:, None] * BT + o_t[None, :], mask=m_r[:, None] & m_causal, other=0.)
    if GATE_VECTOR:
        b_o = tl.dot(b_q, b_h) + tl.dot(b_A.to(dt), b_v)
    else:
        b_g = tl.load(g + p_row, mask=m_r, other=0.)
        b_o = tl.dot(b_q, b_h) * (tl.exp(b_g) * scale)[:, None] + tl.dot(b_A.to(dt), b_v)
    tl.store(o + p_row[:, None] * V + o_v[None, :], b_o.to(o.dtype.element_ty), mask=m_r[:, None] & m_v[None, :])


def chunk_output_fwd(
    q: Tensor, v_new: Tensor, h: Tensor, g: Tensor | None, aqk: Tensor, *, index: ChunkIndex, scale: float,
    gate_vector: bool, out_dtype: torch.dtype | None = None, launch: LaunchPlan | None = None,
) -> Tensor:
    """o [B, T, H, V]. GDN: raw q and g = gate cumsum. KDA: q = qg (scaled), g unused."""
    B, T, _, K = q.shape
    H, V = v_new.shape[2], v_new.shape[-1]  # the value heads (q may have H / G, grouped: read at head h // G)
    key = {"H": H, "K": K, "V": V, "BT": index.chunk_size, "GATE": "vector" if gate_vector else "scalar",
           "IS_VARLEN": index.is_varlen, "dtype": str(q.dtype).removeprefix("torch.")}
    cfg = launch_config(launch, CHUNK_OUTPUT_FWD, key, bv_limit=head_block(V))
    BV, BT = cfg.BV, index.chunk_size
    assert BV is not None and BV >= 16 and BT >= 16, f"tiles must be >= 16, got BV={BV} BT={BT}"
    o = torch.empty(v_new.shape, dtype=out_dtype or q.dtype, device=q.device)
    if index.is_varlen:
        grid = (cdiv(V, BV), index.num_chunks, H)
    else:
        grid = (cdiv(V, BV), cdiv(T, BT), B * H)
    chunk_output_fwd_kernel[grid](
        q, v_new, h, g, aqk, o,
        index.cu_seqlens if index.is_varlen else None, index.chunk_indices if index.is_varlen else None,
        scale, T, H=H, K=K, V=V, BT=BT, BK=head_block(K), BV=BV, GATE_VECTOR=gate_vector,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )
    return o
