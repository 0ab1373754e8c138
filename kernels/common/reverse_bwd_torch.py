"""GDN's backward as one reverse walk per sequence and head, in the Ag form, in plain PyTorch: the decomposition of a
fused reverse backward kernel (issue 26's next kernel, `kernels/NOTES.md` "Session 21": FlashQLA's shape, one
program per (segment, head) walking its chunks last to first with the state gradient in registers, no dh, v_new or
dv_new through memory). The CPU-tested mirror of that kernel's per-chunk math; not a backend.

Per chunk of C rows (G = the in-chunk cumsum of the floored gate, G_L its last row, Gam_ij = e^(G_i - G_j) for
i >= j else 0, S the state entering the chunk):

    forward   A  = StrictLower(diag(beta) (K K^T o Gam)),  T = (I + A)^-1,  Ag = T diag(beta)
              KG = K e^G,  KR = K e^(G_L - G),  QG = scale Q e^G,  P = scale Tril(Q K^T o Gam)
              W  = V - KG S,   U = Ag W   (v_new),   O = QG S + P U,   S' = e^(G_L) S + KR^T U

    backward  (given dO and dS', the gradient reaching S')
              dU = P^T dO + KR dS'            dW = Ag^T dU = dV          dS = e^(G_L) dS' + QG^T dO - KG^T dW
              dP = Tril(dO U^T)               dAg = dU W^T               dT = dAg diag(beta)
              dA = -StrictLower(T^T dT T^T)   B = K K^T o Gam            dB = diag(beta) dA
              dQ = scale (dP o Gam) K + scale e^G (dO S^T)
              dK = scale (dP o Gam)^T Q + (dB o Gam + (dB o Gam)^T) K - e^G (dW S^T) + e^(G_L - G) (U dS'^T)
              dbeta = colsum(dAg o T) + rowsum(dA o B)
              dG = rowsum(X) - colsum(X) for X = scale dP o Q K^T o Gam and for X = dB o B,
                   + rowsum(QG o dQG) + rowsum(KG o dKG) - rowsum(KR o dKR),  dQG = dO S^T, dKG = -dW S^T, dKR = U dS'^T
              dG_L += e^(G_L) sum(S o dS') + sum(KR o dKR);   dg = the reverse in-chunk cumsum of dG (0 below the floor)

Every exponent is <= 0. A kernel holds dS `[K, V]` across chunks and needs, per chunk, the chunk's inputs, S (a state
pass's output, as FlashQLA's `prepare_h`) and its own products; here the walk recomputes S by the forward above.

`chunk_backward_kernel_form` and `reverse_walk` are the TileLang kernel's own decomposition
(`kernels.ops.gdn.reverse_bwd`, whose docstring lists its products: T = I - Ag M from the kept Ag, the gates folded
into Og = scale e^G o dO and Wn = -e^G o dv, dG summed per row then cumsummed in reverse) over the same ranges,
states and end gradients the kernel reads: the kernel's GPU test compares against `reverse_walk` on identical inputs.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

from kernels.common.chunk_torch import compute_dtype, from_chunks, to_chunks
from kernels.common.decay import GATE_FLOOR, floor_gate
from kernels.common.index import ChunkIndex, prepare_chunk_index

__all__ = [
    "ChunkBackward", "ChunkForward", "chunk_backward_ag", "chunk_backward_kernel_form", "chunk_forward_ag", "chunk_states", "reverse_backward",
    "reverse_walk",
]  # fmt: skip


def _factors(q: Tensor, k: Tensor, g: Tensor, beta: Tensor, scale: float) -> dict[str, Tensor]:
    """The chunk's state-free factors (module docstring), batched over the leading dims: q, k `[..., C, K]`, g and
    beta `[..., C]`."""
    C = k.shape[-2]
    G = floor_gate(g).cumsum(-1)
    GL = G[..., -1:]
    low = torch.ones(C, C, dtype=torch.bool, device=k.device).tril()
    Gam = (G[..., :, None] - G[..., None, :]).masked_fill(~low, float("-inf")).exp()
    B = (k @ k.transpose(-1, -2)) * Gam
    A = (beta[..., :, None] * B).tril(-1)
    eye = torch.eye(C, dtype=k.dtype, device=k.device)
    T = torch.linalg.solve_triangular(eye + A, eye.expand_as(A), upper=False, unitriangular=True)
    eG = G.exp()[..., None]
    return {
        "G": G, "GL": GL, "Gam": Gam, "B": B, "T": T, "Ag": T * beta[..., None, :], "QK": q @ k.transpose(-1, -2),
        "KG": k * eG, "KR": k * (GL - G).exp()[..., None], "QG": scale * q * eG,
    }  # fmt: skip


def chunk_forward_ag(
    q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, S: Tensor, *, scale: float
) -> tuple[Tensor, Tensor]:
    """(O `[..., C, V]`, S' `[..., K, V]`) of one chunk from its entering state S (module docstring)."""
    f = _factors(q, k, g, beta, scale)
    U = f["Ag"] @ (v - f["KG"] @ S)
    P = scale * (f["QK"] * f["Gam"])
    return f["QG"] @ S + P @ U, f["GL"].exp()[..., None] * S + f["KR"].transpose(-1, -2) @ U


def chunk_backward_ag(
    q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, S: Tensor, do: Tensor, dS_next: Tensor, *, scale: float
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    """(dq, dk, dv, dg, dbeta, dS) of one chunk given do `[..., C, V]` and the gradient dS_next reaching its leaving
    state; dS is the gradient at its entering state S (module docstring)."""
    f = _factors(q, k, g, beta, scale)
    Gam, B, T, Ag, KG, KR, QG = f["Gam"], f["B"], f["T"], f["Ag"], f["KG"], f["KR"], f["QG"]
    eG, eR, eL = f["G"].exp()[..., None], (f["GL"] - f["G"]).exp()[..., None], f["GL"].exp()

    def tr(x: Tensor) -> Tensor:
        return x.mT

    W = v - KG @ S
    U = Ag @ W
    P = scale * (f["QK"] * Gam)
    dU = tr(P) @ do + KR @ dS_next
    dW = tr(Ag) @ dU
    dS = eL[..., None] * dS_next + tr(QG) @ do - tr(KG) @ dW
    dP = (do @ tr(U)).tril()
    dT = (dU @ tr(W)) * beta[..., None, :]
    dA = -(tr(T) @ dT @ tr(T)).tril(-1)
    dB = beta[..., :, None] * dA
    X = scale * dP * f["QK"] * Gam  # the gate's terms of P
    Y = dB * B  # and of A
    dQG, dKG, dKR = do @ tr(S), -dW @ tr(S), U @ tr(dS_next)
    dq = scale * (dP * Gam) @ k + dQG * scale * eG
    dk = scale * tr(dP * Gam) @ q + (dB * Gam + tr(dB * Gam)) @ k + dKG * eG + dKR * eR
    dbeta = ((dU @ tr(W)) * T).sum(-2) + (dA * B).sum(-1)
    dG = X.sum(-1) - X.sum(-2) + Y.sum(-1) - Y.sum(-2)
    dG = dG + (QG * dQG).sum(-1) + (KG * dKG).sum(-1) - (KR * dKR).sum(-1)
    dGL = eL * (S * dS_next).sum((-2, -1))[..., None] + (KR * dKR).sum((-2, -1))[..., None]
    dG = torch.cat([dG[..., :-1], dG[..., -1:] + dGL], -1)
    dg = dG.flip(-1).cumsum(-1).flip(-1).masked_fill(g < GATE_FLOOR, 0.0)
    return dq, dk, dW, dg, dbeta, dS


# one chunk's forward (q, k, v, g, beta, S, *, scale) -> (O, S') and backward (q, k, v, g, beta, S, do, dS_next,
# *, scale) -> (dq, dk, dv, dg, dbeta, dS), batched over the leading dims: GDN's here, KDA's in
# `kernels.ops.kda.reverse_bwd_torch` (the walks below take either)
ChunkForward = Callable[..., tuple[Tensor, Tensor]]
ChunkBackward = Callable[..., tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]]


def chunk_states(
    qc: Tensor, kc: Tensor, vc: Tensor, gc: Tensor, bc: Tensor, S: Tensor, *, index: ChunkIndex, scale: float,
    forward: ChunkForward = chunk_forward_ag,
) -> Tensor:  # fmt: skip
    """The state entering every chunk `[NT, H, K, V]` by the forward walk (`forward` per chunk: GDN's
    `chunk_forward_ag` by default) over chunked inputs (`to_chunks`: `[NT, H, C, ..]`) in `index`'s serial order,
    from each sequence's entering state S `[N, H, K, V]`."""
    h = S.new_empty(index.num_chunks, *S.shape[1:])
    for seq_ids, ids in index.pad.steps:
        Sj = S if seq_ids is None else S.index_select(0, seq_ids)
        h[ids] = Sj
        Sj = forward(qc[ids], kc[ids], vc[ids], gc[ids], bc[ids], Sj, scale=scale)[1]
        S = Sj if seq_ids is None else S.index_copy(0, seq_ids, Sj)
    return h


def reverse_backward(
    q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, do: Tensor, *, scale: float,
    initial_state: Tensor | None = None, dht: Tensor | None = None, cu_seqlens: Tensor | None = None,
    chunk_size: int = 64, forward: ChunkForward = chunk_forward_ag, backward: ChunkBackward | None = None,
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:  # fmt: skip
    """(dq, dk, dv, dg, dbeta, dh0) of GDN: q, k `[B, T, H, K]`, v, do `[B, T, H, V]`, g, beta `[B, T, H]`,
    initial_state and dht `[N, H, K, V]` or None, varlen by cu_seqlens (B = 1). The torch path's chunk layout
    (`kernels.common.chunk_torch.to_chunks`: each sequence padded to whole chunks with zeros, which changes nothing:
    no decay, no write) and its serial order (`ChunkIndex.pad.steps`): a forward walk for the states entering each
    chunk, then one reverse walk carrying dS (`chunk_backward_ag` per chunk). In the inputs' compute dtype.
    forward, backward: another op's chunk functions (KDA's: g `[B, T, H, K]`, its dg too)."""
    B, T, H, K = k.shape
    V = v.shape[-1]
    index = prepare_chunk_index(cu_seqlens, batch=B, seq_len=T, chunk_size=chunk_size, device=k.device)
    cd = compute_dtype(q)
    qc, kc, vc, gc, bc, doc = (to_chunks(x, index, cd) for x in (q, k, v, g, beta, do))
    S = initial_state.to(cd) if initial_state is not None else qc.new_zeros(index.num_seqs, H, K, V)
    h = chunk_states(qc, kc, vc, gc, bc, S, index=index, scale=scale, forward=forward)
    dS = dht.to(cd) if dht is not None else torch.zeros_like(S)
    grads = [torch.empty_like(x) for x in (qc, kc, vc, gc, bc)]
    chunk_backward = backward if backward is not None else chunk_backward_ag
    for seq_ids, ids in reversed(index.pad.steps):
        dSj = dS if seq_ids is None else dS.index_select(0, seq_ids)
        *gr, dSj = chunk_backward(qc[ids], kc[ids], vc[ids], gc[ids], bc[ids], h[ids], doc[ids], dSj, scale=scale)
        for out, x in zip(grads, gr, strict=True):
            out[ids] = x
        dS = dSj if seq_ids is None else dS.index_copy(0, seq_ids, dSj)
    dq, dk, dv, dg, dbeta = (from_chunks(x, index, B, T) for x in grads)
    return dq, dk, dv, dg, dbeta, dS


def chunk_backward_kernel_form(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    do: Tensor,
    ag: Tensor,
    G: Tensor,
    beta: Tensor,
    S: Tensor,
    dS_next: Tensor,
    *,
    scale: float,
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    """(dq, dk, dv, dG per row (before the reverse cumsum), dbeta, dS) of one chunk by the TileLang kernel's products
    (`kernels.ops.gdn.reverse_bwd`'s docstring), batched over the leading dims: Ag `[.., C, C]` as the forward kept
    it and G the in-chunk cumsum of the floored gate `[.., C]`."""
    C = k.shape[-2]
    low = torch.ones(C, C, dtype=torch.bool, device=k.device).tril()
    Gam = (G[..., :, None] - G[..., None, :]).masked_fill(~low, float("-inf")).exp()
    GL = G[..., -1:]
    eG, eR, eL = G.exp()[..., None], (GL - G).exp()[..., None], GL.exp()[..., None]
    P = scale * (q @ k.mT) * Gam
    B = (k @ k.mT) * Gam
    T = torch.eye(C, dtype=k.dtype, device=k.device) - ag @ B.tril(-1)
    W = v - eG * (k @ S)
    U = ag @ W
    dU = eR * (k @ dS_next) + P.mT @ do
    dv = ag.mT @ dU
    Wn, Og = -eG * dv, scale * eG * do
    dP = (do @ U.mT).tril()
    dAg = dU @ W.mT
    X1 = dP * P
    dPg = scale * dP * Gam
    db1 = (dAg * T).sum(-2)
    dA = -(T.mT @ (dAg * beta[..., None, :]) @ T.mT).tril(-1)
    db2 = (dA * B).sum(-1)
    X2 = dA * B * beta[..., :, None]
    dBg = beta[..., :, None] * dA * Gam
    c = Og @ S.mT
    r3 = (q * c).sum(-1)
    dq = c + dPg @ k
    c = Wn @ S.mT
    r4 = (k * c).sum(-1)
    b = eR * (U @ dS_next.mT)
    r5 = (k * b).sum(-1)
    dk = c + b + dPg.mT @ q + (dBg + dBg.mT) @ k
    sd = (S * dS_next).sum((-2, -1))[..., None]
    dS = eL * dS_next + q.mT @ Og + k.mT @ Wn
    dG = X1.sum(-1) - X1.sum(-2) + X2.sum(-1) - X2.sum(-2) + r3 + r4 - r5
    dG = torch.cat([dG[..., :-1], dG[..., -1:] + eL[..., 0] * sd + r5.sum(-1, keepdim=True)], -1)
    return dq, dk, dv, dG, db1 + db2, dS


def _padded(y: Tensor, C: int, *, last: bool) -> Tensor:
    """A chunk's rows `[n, H, ..]` as `[H, C, ..]`: padded with zeros, or with the last row (the gate cumsum)."""
    n = y.shape[0]
    pad = y[-1:].expand(C - n, *y.shape[1:]) if last else y.new_zeros(C - n, *y.shape[1:])
    return torch.cat([y, pad]).transpose(0, 1)


def reverse_walk(
    q: Tensor, k: Tensor, v: Tensor, g: Tensor, gs: Tensor, beta: Tensor, ag: Tensor, h: Tensor, do: Tensor, *,
    scale: float, cu: Tensor, chunk_offsets: Tensor, ends: Tensor, final_idx: Tensor, num_seqs: int,
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:  # fmt: skip
    """`kernels.ops.gdn.reverse_bwd.reverse_bwd_tilelang` in plain PyTorch, with its arguments and outputs (dq, dk per
    value head, dv, dg, dbeta fp32, dh0 fp32): each range of cu walked last chunk first from its end gradient,
    `chunk_backward_kernel_form` per chunk, rows past the range zeros with the last row's gate cumsum. In fp64 for
    fp64 inputs, else fp32 (from the inputs' values: the GPU test's reference for the kernel on identical inputs).
    A test reference, not a step path: it reads the ranges to the host and walks them in Python."""
    B, T, Hk, K = k.shape
    H, V = v.shape[2], v.shape[3]
    C = ag.shape[-1]
    cd = compute_dtype(q)
    grp = H // Hk
    qf, kf = (x.reshape(B * T, Hk, K).repeat_interleave(grp, 1).to(cd) for x in (q, k))
    vf, dof, agf = (x.reshape(B * T, H, -1).to(cd) for x in (v, do, ag))
    gsf, gf, bf = (x.reshape(B * T, H).to(cd) for x in (gs, g, beta))
    dq, dk = (torch.zeros(B * T, H, K, dtype=cd, device=k.device) for _ in range(2))
    dv = torch.zeros(B * T, H, V, dtype=cd, device=k.device)
    dg, dbeta = (torch.zeros(B * T, H, dtype=cd, device=k.device) for _ in range(2))
    dh0 = torch.zeros(num_seqs, H, K, V, dtype=cd, device=k.device)
    bounds, offs, fin = cu.tolist(), chunk_offsets.tolist(), final_idx.tolist()
    for s in range(len(bounds) - 1):
        bos, eos = bounds[s], bounds[s + 1]
        dS = ends[s].to(cd)
        for i in reversed(range(-(-(eos - bos) // C))):
            rows = torch.arange(bos + i * C, min(bos + (i + 1) * C, eos), device=k.device)
            n = rows.numel()
            xs = [_padded(x[rows], C, last=x is gsf) for x in (qf, kf, vf, dof, agf, gsf, bf)]
            out = chunk_backward_kernel_form(*xs, h[offs[s] + i].to(cd), dS, scale=scale)
            cq, ck, cv, cG, cb, dS = out
            for buf, x in ((dq, cq), (dk, ck), (dv, cv), (dbeta, cb)):
                buf[rows] = x.transpose(0, 1)[:n]
            rev = cG.flip(-1).cumsum(-1).flip(-1).transpose(0, 1)[:n]
            dg[rows] = rev.masked_fill(gf[rows] < GATE_FLOOR, 0.0)
        if fin[s] >= 0:
            dh0[fin[s]] = dS
    shape = (B, T, H)
    return dq.view(*shape, K), dk.view(*shape, K), dv.view(*shape, V), dg.view(shape), dbeta.view(shape), dh0
