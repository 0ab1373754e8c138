"""CHUNKED TORCH BACKWARD: the exact gradient of the WY-form chunk forward (chunk_torch.py), C = 64, in plain PyTorch.

The `torch` backend of the backward (`kernels.dispatch`); runs on any device, never reads a device value on the
host (the host bounds come from the `ChunkIndex`). Vectorised over chunks and heads; the only Python loop is the
reverse state pass over chunk positions (plus, for a per-key gate, a loop over blocks of chunks that bounds the
memory of the decay factors, as in the forward). The gate is `[B, T, H, Kg]`, Kg == K (KDA) or 1 (GDN).

Recompute policy: only the inputs (and the initial state) are saved by the forward; this backward recomputes the
WY factors and the chunk states. Extra memory: the per-chunk states `h`, the per-chunk state gradients `dh` and
`scale (Q*e^G)^T dO` (each `[NT, H, K, V]`), plus per-chunk `[C, C]` / `[C, K]` / `[C, V]` factors, i.e.
O(chunks x H x (K V + C^2 + C (K + V))). Never a `[T, K, K]` tensor or a per-token state.

Per chunk (notation of chunk_torch.py; G = chunk-local cumsum of g, S = state entering the chunk, S' = leaving):

    forward    A   = StrictLower(beta_i sum_d k_id k_jd e^(G_id - G_jd)),  L = I + A,  T = L^-1
               kb  = beta * e^G * K,  vb = beta * V,  w = T kb,  u = T vb,  K~ = K * e^(G_C - G),  gamma = e^(G_C)
               v_new = u - w S,   S' = gamma * S + K~^T v_new,   o = scale [(Q * e^G) S + Aqk v_new]
               Aqk_ij = sum_d q_id k_jd e^(G_id - G_jd) for i >= j

    reverse state pass (serial over chunks; dS' = gradient reaching S', starting from dht, or 0):
               dv_new = scale Aqk^T dO + K~ dS'
               dS     = gamma * dS' + scale (Q * e^G)^T dO - w^T dv_new          (after chunk 0: dh0 = dS)

    per chunk, in parallel (S from the recomputed forward pass, dS' from the reverse pass):
               d(Q e^G) = scale dO S^T          dAqk = scale Tril(dO v_new^T)     dK~ = v_new dS'^T
               dw = -dv_new S^T                 du = dv_new                       dgamma = rowsum_V(S * dS')
    WY:        dkb = T^T dw,  dvb = T^T du,  dA = -StrictLower(dkb w^T + dvb u^T)      (L w = kb, L u = vb)
               dK += beta e^G dkb,   dV = beta dvb,   dbeta = sum_K(dkb e^G K) + sum_V(dvb V),   dG += dkb * kb
    decayed products: with  R(X, b)_i = sum_{j<=i} X_ij b_j e^(G_i - G_j)  and  Cc(X, a)_j = sum_{i>=j} X_ij a_i e^(G_i - G_j)
               A:    dbeta += sum_K K * R(dA, K),   dK += beta R(dA, K) + Cc(dA, beta K),
                     dG += beta K * R(dA, K) - K * Cc(dA, beta K)
               Aqk:  dQ += R(dAqk, K),   dK += Cc(dAqk, Q),   dG += Q * R(dAqk, K) - K * Cc(dAqk, Q)
    gates:     dQ += e^G d(Q e^G),  dG += Q e^G d(Q e^G);   dK += e^(G_C - G) dK~,  dG -= K~ dK~,
               dG_C += sum_C(K~ dK~) + gamma dgamma;   dg = reverse cumsum of dG within the chunk
    GDN (Kg = 1): the same per key, dG summed over K.

R and Cc for a per-key gate never form e^(G_i) or e^(-G_j) (overflow): they split e^(G_i - G_j) around the last row
of j's sub-block, so every factor is <= 1 (the forward's `_per_key_products` trick); Cc is R on the time-reversed
chunk (transpose and flip X, negate and flip G). G is the cumsum of the floored gate (`kernels.common.decay`); dg of
a gate below the floor is 0 (the clamp's gradient, the reference's value). Padding (varlen) tokens have k = v = beta = g = 0, so the padded
computation equals the real one and their gradients are dropped by `from_chunks`.
"""

from __future__ import annotations

import torch
from torch import Tensor

from kernels.common.chunk_torch import (
    _DECAY_BLOCK_BYTES,
    _SUB,
    ChunkPrep,
    chunk_prepare,
    chunk_state_pass,
    compute_dtype,
    from_chunks,
    to_chunks,
)
from kernels.common.decay import GATE_FLOOR, floor_gate
from kernels.common.index import ChunkIndex

__all__ = ["chunk_bwd_torch"]


def chunk_bwd_torch(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    g: Tensor,
    beta: Tensor,
    do: Tensor,
    *,
    scale: float,
    initial_state: Tensor | None,
    dht: Tensor | None,
    index: ChunkIndex,
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor | None]:
    """Gradients (dq, dk, dv, dg, dbeta, dh0) of the chunked forward, given do `[B,T,H,V]` and dht `[N,H,K,V]` (or None).

    q, k `[B,T,H,K]`, v `[B,T,H,V]`, g `[B,T,H,Kg]` (Kg in {1, K}), beta `[B,T,H]`. dq, dk, dv, dbeta come back in
    the input's dtype, dg in g's dtype (`[B,T,H,Kg]`), dh0 in fp32 (fp64 for fp64 inputs), or None without an
    initial state.
    """
    B, T, H, K = k.shape
    V = v.shape[-1]
    cd = compute_dtype(q)
    qc, kc, vc, gc, bc, doc = (to_chunks(x, index, cd) for x in (q, k, v, g, beta, do))
    prep = chunk_prepare(kc, vc, gc, bc, q=qc)
    assert prep.qg is not None and prep.aqk is not None and prep.akk is not None
    h0 = initial_state.to(cd) if initial_state is not None else qc.new_zeros(index.num_seqs, H, K, V)
    _, h, v_new = chunk_state_pass(prep, index, h0)                    # states entering each chunk, v_new
    assert h is not None and v_new is not None

    dh, dv_new, dS0 = _reverse_state_pass(prep, doc, index, scale, dht.to(cd) if dht is not None else torch.zeros_like(h0))

    G = floor_gate(gc).cumsum(2)                                       # [NT, H, C, Kg] (kernels.common.decay)
    eG = G.exp()
    ht = h.transpose(-1, -2)                                           # [NT, H, V, K]
    dqg = scale * (doc @ ht)                                           # [NT, H, C, K]
    causal = torch.ones(prep.aqk.shape[-1], prep.aqk.shape[-1], dtype=torch.bool, device=k.device).tril()
    daqk = (scale * (doc @ v_new.transpose(-1, -2))).masked_fill(~causal, 0.0)
    dkt = v_new @ dh.transpose(-1, -2)                                 # [NT, H, C, K]
    dgamma = (h * dh).sum(-1)                                          # [NT, H, K]
    dw = -(dv_new @ ht)                                                # [NT, H, C, K]

    # WY: L w = kb, L u = vb with L = I + A unit lower triangular
    Lt = (prep.akk + torch.eye(prep.akk.shape[-1], dtype=cd, device=k.device)).transpose(-1, -2)
    dsol = torch.linalg.solve_triangular(Lt, torch.cat([dw, dv_new], -1), upper=True, unitriangular=True)
    dkb, dvb = dsol[..., :K], dsol[..., K:]
    strict = causal.tril(-1)
    dA = -(dkb @ prep.w.transpose(-1, -2) + dvb @ prep.u.transpose(-1, -2)).masked_fill(~strict, 0.0)
    b1 = bc[..., None]
    dk = dkb * b1 * eG
    dv = dvb * b1
    dbeta = (dkb * eG * kc).sum(-1) + (dvb * vc).sum(-1)
    dG = dkb * b1 * eG * kc                                            # [NT, H, C, K]

    # the decayed products A (strict) and Aqk (inclusive)
    Ra, Ca, Rq, Cq = _decayed(dA, daqk, kc, b1 * kc, qc, G)
    dbeta = dbeta + (kc * Ra).sum(-1)
    dk = dk + b1 * Ra + Ca + Cq
    dq = Rq + dqg * eG
    dG = dG + b1 * kc * Ra - kc * Ca + qc * Rq - kc * Cq + dqg * prep.qg

    # K~ = K e^(G_C - G), gamma = e^(G_C)
    dk = dk + dkt * (G[:, :, -1:] - G).exp()
    ktdkt = dkt * prep.kt
    dG = dG - ktdkt
    dG_C = ktdkt.sum(2) + dgamma * prep.gamma                          # [NT, H, K]
    dG[:, :, -1] += dG_C
    if gc.shape[-1] == 1:
        dG = dG.sum(-1, keepdim=True)
    dg = dG.flip(2).cumsum(2).flip(2)                                  # G = cumsum(g) within the chunk
    dg = dg.masked_fill(gc < GATE_FLOOR, 0.0)                          # the floor's clamp: 0 below it

    def out(x: Tensor, like: Tensor) -> Tensor:
        return from_chunks(x, index, B, T).to(like.dtype)

    dh0 = dS0 if initial_state is not None else None
    return out(dq, q), out(dk, k), out(dv, v), out(dg, g), out(dbeta, beta), dh0


def _reverse_state_pass(
    prep: ChunkPrep, doc: Tensor, index: ChunkIndex, scale: float, dS: Tensor
) -> tuple[Tensor, Tensor, Tensor]:
    """(dh `[NT,H,K,V]` = gradient at each chunk's end, dv_new `[NT,H,C,V]`, dS at the start of each sequence)."""
    assert prep.aqk is not None and prep.qg is not None
    dv_loc = scale * (prep.aqk.transpose(-1, -2) @ doc)                # [NT, H, C, V]
    dq_term = scale * (prep.qg.transpose(-1, -2) @ doc)                # [NT, H, K, V]
    dh = dS.new_empty(doc.shape[0], *dS.shape[1:])
    dv_new = torch.empty_like(dv_loc)
    wT = prep.w.transpose(-1, -2)                                      # [NT, H, K, C]
    for seq_ids, chunk_ids in reversed(index.pad.steps):
        dSj = dS if seq_ids is None else dS.index_select(0, seq_ids)
        dh[chunk_ids] = dSj
        dvn = dv_loc[chunk_ids] + prep.kt[chunk_ids] @ dSj
        dv_new[chunk_ids] = dvn
        dSj = prep.gamma[chunk_ids][..., None] * dSj + dq_term[chunk_ids] - wT[chunk_ids] @ dvn
        dS = dSj if seq_ids is None else dS.index_copy(0, seq_ids, dSj)
    return dh, dv_new, dS


def _decayed(dA: Tensor, daqk: Tensor, k: Tensor, bk: Tensor, q: Tensor, G: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """(R(dA, k), Cc(dA, beta k), R(dAqk, k), Cc(dAqk, q)), each `[NT, H, C, K]` (see the module docstring)."""
    NT, H, C, K = k.shape
    if G.shape[-1] == 1:
        # scalar gate: one [C, C] decay per chunk and head, exact and bounded (<= 1 on and below the diagonal)
        causal = torch.ones(C, C, dtype=torch.bool, device=k.device).tril()
        E = (G - G.transpose(-1, -2)).masked_fill(~causal, float("-inf")).exp()
        XA, XQ = dA * E, daqk * E
        return XA @ k, XA.transpose(-1, -2) @ bk, XQ @ k, XQ.transpose(-1, -2) @ q
    outs = [torch.empty_like(k) for _ in range(4)]
    step = max(1, _DECAY_BLOCK_BYTES // max(1, H * C * (C // _SUB + _SUB) * K * k.element_size()))
    for s in range(0, NT, step):
        sl = slice(s, min(NT, s + step))
        Gs = G[sl]
        outs[0][sl] = _rows(dA[sl], k[sl], Gs)
        outs[1][sl] = _cols(dA[sl], bk[sl], Gs)
        outs[2][sl] = _rows(daqk[sl], k[sl], Gs)
        outs[3][sl] = _cols(daqk[sl], q[sl], Gs)
    return outs[0], outs[1], outs[2], outs[3]


def _rows(X: Tensor, b: Tensor, G: Tensor) -> Tensor:
    """R_i = sum_{j <= i} X_ij b_j e^(G_i - G_j) per key, `[n, H, C, K]`; X `[n, H, C, C]` zero above the diagonal.

    For j in sub-block beta (last row r) and i after it, e^(G_i - G_j) = e^(G_i - G_r) e^(G_r - G_j), both <= 1 for a
    non-increasing G: the off-diagonal sub-blocks are matmuls of bounded factors; the diagonal ones form the decay.
    """
    n, H, C, K = b.shape
    BC = _SUB if C % _SUB == 0 else C
    NB = C // BC
    Gb = G.view(n, H, NB, BC, K)
    Gr = Gb[:, :, :, -1]                                               # [n, H, NB, K]
    blk = torch.arange(C, device=b.device) // BC
    after = blk[None, :] > torch.arange(NB, device=b.device)[:, None]  # [NB, C]
    El = torch.where(after[:, :, None], G[:, :, None] - Gr[:, :, :, None], float("-inf")).exp_()   # [n, H, NB, C, K]
    bb = b.view(n, H, NB, BC, K)
    Bb = bb * (Gr[:, :, :, None] - Gb).exp()                           # [n, H, NB, BC, K]
    Xb = X.view(n, H, C, NB, BC).permute(0, 1, 3, 2, 4)                # [n, H, NB, C, BC]
    R = (El * (Xb @ Bb)).sum(2)                                        # [n, H, C, K]
    causal = torch.ones(BC, BC, dtype=torch.bool, device=b.device).tril()
    Ed = (Gb[:, :, :, :, None] - Gb[:, :, :, None]).masked_fill(~causal[:, :, None], float("-inf")).exp_()  # [n,H,NB,BC,BC,K]
    Xd = X.view(n, H, NB, BC, NB, BC).diagonal(0, 2, 4).permute(0, 1, 4, 2, 3)                          # [n,H,NB,BC,BC]
    Rd = ((Xd[..., None] * Ed) * bb[:, :, :, None]).sum(-2)                                              # [n,H,NB,BC,K]
    return R + Rd.reshape(n, H, C, K)


def _cols(X: Tensor, a: Tensor, G: Tensor) -> Tensor:
    """Cc_j = sum_{i >= j} X_ij a_i e^(G_i - G_j) per key: `_rows` on the time-reversed chunk."""
    Xr = X.transpose(-1, -2).flip(-1, -2)
    return _rows(Xr, a.flip(2), -G.flip(2)).flip(2)
