"""Segment transitions (M, S_ext) per sequence in fp32, and the chain/merge of affine state maps.

A segment of tokens maps its entering state to its leaving state affinely (DESIGN.md §1):

    S_end = M S_start + S_ext,    M `[K, K]` acts on the key dim of S `[K, V]`,  S_ext = end state from S_start = 0.

`chunk_transition_torch` gets both in one chunked state pass by linearity: the pass runs on the augmented
state [M | S_ext] `[K, K+V]` from [I | 0], with the right-hand side [0_K | v] (so u becomes [0 | u]); each
chunk then applies M_c = Diag(gamma_C) - K~^T w to the M block and M_c S + K~^T u to the S_ext block.
`kernels.ops.kda.naive.naive_transition` does the same with the per-token reference. `compose` and `chain` fold maps; all fp32.

`mask_maps` applies a per-sequence device mask `need` (unflagged sequences get M = 0, S_ext = 0) with
`torch.where`. The torch and reference backends compute every sequence and then mask: skipping work for
some rows only would need their count on the host (a sync). Skipping the work is a Triton-path property
(`kernels.common.transition_triton`: masked programs walk no chunk).
"""

from __future__ import annotations

import torch
from torch import Tensor

from kernels.common.chunk_torch import chunk_prepare, chunk_state_pass, to_chunks
from kernels.common.index import ChunkIndex

__all__ = ["chain", "chunk_transition_torch", "compose", "mask_maps"]


def chunk_transition_torch(k: Tensor, v: Tensor, g: Tensor, beta: Tensor, *, index: ChunkIndex) -> tuple[Tensor, Tensor]:
    """(M `[N,H,K,K]`, S_ext `[N,H,K,V]`) fp32 per sequence; g `[B,T,H,Kg]` with Kg in {1, K}."""
    H, K = k.shape[2], k.shape[3]
    kc, vc, gc, bc = (to_chunks(x, index) for x in (k, v, g, beta))
    prep = chunk_prepare(kc, vc, gc, bc)
    u_aug = torch.cat([prep.u.new_zeros(*prep.u.shape[:-1], K), prep.u], -1)     # [NT, H, C, K+V]
    eye = torch.eye(K, dtype=torch.float32, device=k.device)
    h0 = torch.cat([eye.expand(index.num_seqs, H, K, K), k.new_zeros(index.num_seqs, H, K, v.shape[-1], dtype=torch.float32)], -1)
    S, _, _ = chunk_state_pass(prep, index, h0, u=u_aug, store=False)
    return S[..., :K].contiguous(), S[..., K:].contiguous()


def mask_maps(M: Tensor, S_ext: Tensor, need: Tensor | None) -> tuple[Tensor, Tensor]:
    """(M, S_ext) with the rows of unflagged sequences set to zero (`need`: bool `[N]` on M's device, or None)."""
    if need is None:
        return M, S_ext
    keep = need.view(-1, 1, 1, 1)
    return torch.where(keep, M, 0.0), torch.where(keep, S_ext, 0.0)


def compose(M1: Tensor, S1: Tensor, M2: Tensor, S2: Tensor) -> tuple[Tensor, Tensor]:
    """The map "apply (M1, S1), then (M2, S2)": returns (M2 @ M1, M2 @ S1 + S2), fp32, any leading dims.

    M* `[..., K, K]`, S* `[..., K, V]`.
    """
    M1, S1, M2, S2 = (x.float() for x in (M1, S1, M2, S2))
    return M2 @ M1, M2 @ S1 + S2


def chain(M: Tensor, S_ext: Tensor, S0: Tensor | None = None) -> Tensor:
    """The state after applying P maps in order: S <- M[p] S + S_ext[p] for p = 0..P-1, from S0 (zeros if None).

    M `[P, H, K, K]`, S_ext `[P, H, K, V]`, S0 `[H, K, V]` (or any shape broadcasting with it); returns fp32 `[H, K, V]`.
    P is small (the number of CP ranks or segments), so this is a short loop of batched matmuls over heads.
    """
    if M.dim() != 4 or S_ext.dim() != 4 or M.shape[0] != S_ext.shape[0]:
        raise ValueError(f"chain expects M [P,H,K,K] and S_ext [P,H,K,V] with the same P, got M.shape={tuple(M.shape)}, "
                         f"S_ext.shape={tuple(S_ext.shape)}")
    S = S_ext.new_zeros(S_ext.shape[1:], dtype=torch.float32) if S0 is None else S0.float()
    for p in range(M.shape[0]):
        S = M[p].float() @ S + S_ext[p].float()
    return S
