"""TORCH MIRROR of the two-kernel chunked forward (FlashQLA's decomposition), scalar gate (GDN): what the WY pass
`wy_gdn_ag` stores and what the state+output pass does with it, in plain PyTorch (tests of both kernels).

Per chunk of C tokens, with G the in-chunk cumsum of the floored gate (`kernels.common.decay`) and S the state
entering the chunk (`[K, V]` per value head):

    A  = StrictLower(beta_i k_i.k_j exp(G_i - G_j)),   Ag = (I + A)^{-1} diag(beta)         (`ag_reference`)
    Vd = Ag (V - exp(G) (x) K S)                        (= u - w S of the WY form, `chunk_torch.py`)
    o  = scale (exp(G) (x) Q S + (Q K^T (x) exp(G_i - G_j), i >= j) Vd)
    S' = exp(G_C) S + K^T (exp(G_C - G) (x) Vd)                                            (`ag_chunk_forward`)

Grouped value heads: q, k have H heads, v, g, beta, Ag HV = G H; value head h uses key head h // G. Varlen through
the padding maps of `ChunkIndex.pad` (padded rows: k = v = q = 0, Ag = 0, G = the chunk's last valid G).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from kernels.common.chunk_torch import compute_dtype, from_chunks, last_rows, to_chunks
from kernels.common.decay import floor_gate
from kernels.common.index import ChunkIndex

__all__ = ["ag_block_solve", "ag_chunk_forward", "ag_reference", "block_inverse"]


def _heads(x: Tensor, hv: int) -> Tensor:
    """A `[B, T, H, ...]` tensor of the key heads on the HV value heads (value head h reads key head h // (HV / H))."""
    return x.repeat_interleave(hv // x.shape[2], dim=2)


def ag_reference(
    k: Tensor, g: Tensor, beta: Tensor, *, index: ChunkIndex, dtype: torch.dtype = torch.float64
) -> tuple[Tensor, Tensor]:
    """(Ag `[B, T, HV, C]`, gcum `[B, T, HV]`) in `dtype`: Ag = (I + A)^{-1} diag(beta) by a triangular solve (zeros
    above the diagonal), gcum the in-chunk cumsum of the floored gate. k `[B, T, H, K]`, g and beta `[B, T, HV]`."""
    B, T, HV = g.shape
    kc = to_chunks(_heads(k, HV), index, dtype)  # [NT, HV, C, K]
    G = to_chunks(floor_gate(g), index, dtype).cumsum(2)  # [NT, HV, C]
    bc = to_chunks(beta, index, dtype)
    C = index.chunk_size
    strict = torch.ones(C, C, dtype=torch.bool, device=k.device).tril(-1)
    D = (G[..., :, None] - G[..., None, :]).masked_fill(~strict, float("-inf")).exp()
    A = (kc @ kc.transpose(-1, -2)) * D * bc[..., None]
    eye = torch.eye(C, dtype=dtype, device=k.device)
    ag = torch.linalg.solve_triangular(A + eye, torch.diag_embed(bc), upper=False, unitriangular=True)
    return from_chunks(ag, index, B, T), from_chunks(G, index, B, T)


def ag_block_solve(
    k: Tensor, g: Tensor, beta: Tensor, *, index: ChunkIndex, dtype: torch.dtype = torch.float64
) -> tuple[Tensor, Tensor]:
    """`ag_reference`'s (Ag, gcum) by the decomposition of the TileLang Ag pass (`kernels.ops.gdn.ag_hopper`), its
    CPU mirror: D^-1 the inverses of I + A's four 16x16 diagonal blocks by forward substitution, N = D^-1 A off its
    diagonal blocks (N^4 = 0), T = (I - N + N^2 - N^3) D^-1, Ag = T diag(beta). Chunk 64 only."""
    B, T, HV = g.shape
    C = index.chunk_size
    if C != 64:
        raise ValueError(f"ag_block_solve: the TileLang Ag pass's decomposition takes chunk 64, got {C}")
    kc = to_chunks(_heads(k, HV), index, dtype)  # [NT, HV, C, K]
    G = to_chunks(floor_gate(g), index, dtype).cumsum(2)
    bc = to_chunks(beta, index, dtype)
    rows = torch.arange(C, device=k.device)
    strict = rows[:, None] > rows[None, :]
    D = (G[..., :, None] - G[..., None, :]).masked_fill(~strict, float("-inf")).exp()
    A = (kc @ kc.transpose(-1, -2)) * D * bc[..., None]
    return from_chunks(block_inverse(A) * bc[..., None, :], index, B, T), from_chunks(G, index, B, T)


def block_inverse(A: Tensor, mm: Callable[[Tensor, Tensor], Tensor] = torch.matmul) -> Tensor:
    """(I + A)^{-1} of a strictly lower `[..., 64, 64]` A by the TileLang Ag pass's decomposition (`ag_block_solve`):
    the diagonal 16x16 blocks' inverses D^-1 by forward substitution in A's dtype, then (I - N + N^2 - N^3) D^-1 with
    N = D^-1 A off its diagonal blocks, every product by `mm` (`benchmarks/solve_precision.py` passes an emulated
    tf32 one)."""
    C = A.shape[-1]
    rows = torch.arange(C, device=A.device)
    dinv = torch.zeros_like(A)
    for d in range(C // 16):  # column by column of each diagonal block: t_i = [i == j] - sum_{m < i} A_im t_m
        blk = slice(16 * d, 16 * d + 16)
        a = A[..., blk, blk]
        t = torch.zeros_like(a)
        for i in range(16):
            t[..., i, :] = (rows[i] == rows[:16]).to(A.dtype) - (a[..., i, :i, None] * t[..., :i, :]).sum(-2)
        dinv[..., blk, blk] = t
    below = (rows[:, None] // 16) > (rows[None, :] // 16)
    N = mm(dinv, A) * below
    N2 = mm(N, N)
    eye = torch.eye(C, dtype=A.dtype, device=A.device)
    return mm(eye - N + N2 - mm(N, N2), dinv)


def ag_chunk_forward(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    ag: Tensor,
    gcum: Tensor,
    *,
    scale: float,
    index: ChunkIndex,
    initial_state: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """The chunk recurrence from Ag and gcum (module docstring): (o `[B, T, HV, V]` in q's dtype, final state `[N, HV, K, V]`
    in the compute dtype: fp32, fp64 for fp64 q). q, k `[B, T, H, K]`, v `[B, T, HV, V]`, ag `[B, T, HV, C]`, gcum
    `[B, T, HV]`; initial_state `[N, HV, K, V]` or None."""
    B, T, HV, V = v.shape
    K = k.shape[-1]
    cd = compute_dtype(q)
    qc, kc = (to_chunks(_heads(x, HV), index, cd) for x in (q, k))  # [NT, HV, C, K]
    vc, agc = to_chunks(v, index, cd), to_chunks(ag, index, cd)
    G = to_chunks(gcum, index, cd)  # [NT, HV, C], 0 on padded rows
    last = last_rows(index, B, T, HV, gcum.device)
    G_C = G.gather(2, last)  # [NT, HV, 1]: the last valid row
    pad = torch.arange(index.chunk_size, device=G.device) > last
    G = torch.where(pad, G_C, G)
    causal = torch.ones(index.chunk_size, index.chunk_size, dtype=torch.bool, device=G.device).tril()
    aqk = (qc @ kc.transpose(-1, -2)) * (G[..., :, None] - G[..., None, :]).masked_fill(~causal, float("-inf")).exp()
    eG, eC, eCG = G.exp()[..., None], G_C.exp()[..., None], (G_C - G).exp()[..., None]
    S = initial_state.to(cd) if initial_state is not None else qc.new_zeros(index.num_seqs, HV, K, V)
    o = vc.new_empty(vc.shape)
    for seq_ids, c in index.pad.steps:
        Sj = S if seq_ids is None else S.index_select(0, seq_ids)
        vd = agc[c] @ (vc[c] - eG[c] * (kc[c] @ Sj))  # [n, HV, C, V]
        o[c] = scale * (eG[c] * (qc[c] @ Sj) + aqk[c] @ vd)
        Sj = eC[c] * Sj + kc[c].transpose(-1, -2) @ (eCG[c] * vd)
        S = Sj if seq_ids is None else S.index_copy(0, seq_ids, Sj)
    return from_chunks(o, index, B, T).to(q.dtype), S
