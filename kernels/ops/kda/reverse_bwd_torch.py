"""KDA's backward as one reverse walk per sequence and head, in the gated form, in plain PyTorch: the decomposition of
a fused reverse backward kernel for KDA (issue 26's KDA row: `chunk_bwd_dqk` and `wy_bwd` are 61 % of KDA's step on
the H200, session 29), as `kernels.common.reverse_bwd_torch` is GDN's. The CPU-tested mirror of that kernel's
per-chunk math; not a backend.

Per chunk of C rows (G = the in-chunk cumsum of the floored per-key gate `[C, K]`, G_C its last row, Gam_ijk =
e^(G_ik - G_jk) for i >= j else 0, S the state entering the chunk), the forward in the gated form the forward walk
reads (`kernels.ops.kda.fused`, `kernels.common.fwd_walk_torch`):

    forward   Aqk = scale Tril(sum_k q_ik k_jk Gam_ijk),  B = sum_k k_ik k_jk Gam_ijk,  A = StrictLower(diag(beta) B)
              T = (I + A)^-1,  Ag = T diag(beta),  qg = scale q e^G,  ke = k e^G,  kd = k e^(G_C - G)
              W = V - ke S,   U = Ag W,   O = qg S + Aqk U,   S' = diag(e^G_C) S + kd^T U

    backward  (given dO and dS', the gradient reaching S')
              dU = Aqk^T dO + kd dS'          dV = dW = Ag^T dU          dS = diag(e^G_C) dS' + qg^T dO - ke^T dW
              dAqk = Tril(dO U^T)             dAg = dU W^T               dqg = dO S^T, dke = -dW S^T, dkd = U dS'^T
              dbeta = colsum(dAg o T) + rowsum(dA o B),  dA = -StrictLower(T^T (dAg diag(beta)) T^T),  dB = diag(beta) dA
              the grams' per-key decayed products (X = scale dAqk, lower with the diagonal; Y = dB, strictly lower):
                  Rq = sum_j X_ij k_j Gam_ij,  Cq = sum_i X_ij q_i Gam_ij,  Rk = sum_j Y_ij k_j Gam_ij,
                  Ck = sum_i Y_ij k_i Gam_ij   (each `[C, K]`)
              dq = Rq + scale e^G o dqg        dk = Cq + Rk + Ck + e^G o dke + e^(G_C - G) o dkd
              dG = q o Rq - k o Cq + k o Rk - k o Ck + qg o dqg + ke o dke - kd o dkd
              dG_C += e^G_C o rowsum_V(S o dS') + colsum(kd o dkd);  dg = the reverse in-chunk cumsum of dG (0 where
              the gate is below the floor)

Every exponent is <= 0 (Gam's, e^G, e^(G_C - G)). The four decayed products are what KDA's per-key gate adds to
GDN's walk (there each is one matmul with a scalar decay): `chunk_backward_products` forms them from dA instead of
dB (rowsum(dA o B) = rowsum(k o R(dA, k)): B itself is never formed) and from the forward's kept gated tensors
(Ag, Aqk, T, qg, ke, kd, G_C: what keep "ag" holds, `kernels.ops.kda.ag_bwd.KEPT_GATED` and T), the way a kernel
would; `chunk_backward_gated` is the plain form. `reverse_backward` walks either over a whole batch
(`kernels.common.reverse_bwd_torch.reverse_backward`'s walk with KDA's chunk functions).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from kernels.common.decay import GATE_FLOOR, floor_gate
from kernels.common.reverse_bwd_torch import reverse_backward as _walk
from kernels.ops.kda.ag_torch import FAST_SPAN

__all__ = ["chunk_backward_gated", "chunk_backward_products", "chunk_forward_gated", "decayed_products",
           "decayed_products_blocks", "gated_factors", "products_finish", "reverse_backward", "state_products"]  # fmt: skip

BLOCK = 16  # the rows of a block of the kernel's decayed products (`decayed_products_blocks`)


def gated_factors(q: Tensor, k: Tensor, g: Tensor, beta: Tensor, scale: float) -> dict[str, Tensor]:
    """The chunk's state-free factors (module docstring), batched over the leading dims: q, k, g `[..., C, K]`, beta
    `[..., C]`. Gam `[..., C, C, K]` is formed whole: a reference for small chunks, not a kernel's way."""
    C = k.shape[-2]
    G = floor_gate(g).cumsum(-2)
    GC = G[..., -1, :]
    low = torch.ones(C, C, dtype=torch.bool, device=k.device).tril()
    Gam = (G[..., :, None, :] - G[..., None, :, :]).masked_fill(~low[..., None], float("-inf")).exp()
    aqk = scale * torch.einsum("...ik,...jk,...ijk->...ij", q, k, Gam)
    B = torch.einsum("...ik,...jk,...ijk->...ij", k, k, Gam).tril(-1)
    A = beta[..., :, None] * B
    eye = torch.eye(C, dtype=k.dtype, device=k.device)
    T = torch.linalg.solve_triangular(eye + A, eye.expand_as(A), upper=False, unitriangular=True)
    eG = G.exp()
    return {
        "G": G, "GC": GC, "Gam": Gam, "Aqk": aqk, "B": B, "T": T, "Ag": T * beta[..., None, :],
        "qg": scale * q * eG, "ke": k * eG, "kd": k * (GC[..., None, :] - G).exp(),
    }  # fmt: skip


def chunk_forward_gated(
    q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, S: Tensor, *, scale: float
) -> tuple[Tensor, Tensor]:
    """(O `[..., C, V]`, S' `[..., K, V]`) of one chunk from its entering state S (module docstring)."""
    f = gated_factors(q, k, g, beta, scale)
    U = f["Ag"] @ (v - f["ke"] @ S)
    return f["qg"] @ S + f["Aqk"] @ U, f["GC"].exp()[..., None] * S + f["kd"].mT @ U


def decayed_products(X: Tensor, a: Tensor, G: Tensor) -> tuple[Tensor, Tensor]:
    """(R, Cc) `[..., C, K]`: R_i = sum_j X_ij a_j e^(G_i - G_j) and Cc_j = sum_i X_ij a_i e^(G_i - G_j) per key, for
    X `[..., C, C]` zero above the diagonal (what a kernel forms by blocks with a reference per block, as
    `kernels.common.bwd_tiles._rows_vec`; here elementwise)."""
    C = X.shape[-1]
    low = torch.ones(C, C, dtype=torch.bool, device=X.device).tril()
    Gam = (G[..., :, None, :] - G[..., None, :, :]).masked_fill(~low[..., None], float("-inf")).exp()
    XG = X[..., None] * Gam
    return torch.einsum("...ijk,...jk->...ik", XG, a), torch.einsum("...ijk,...ik->...jk", XG, a)


def decayed_products_blocks(X: Tensor, a: Tensor, G: Tensor) -> tuple[Tensor, Tensor]:
    """`decayed_products` by 16-row blocks with one reference per block and key, as a kernel forms them (tensor-core
    products, every factor bounded): X `[..., C, C]`, a and G `[..., C, K]`, C a multiple of 16.

    Rows: block I of R is e^(G_I - r_I) o (X_I,: (a o e^(r_I - G))) over the columns up to the block's end. Columns:
    block J of Cc is e^(r_J - G_J) o (X_:,J^T (a o e^(G - r_J))) over the rows from the block's start. Where every
    key's span across every block (G before the block minus its last row) is below FAST_SPAN (the chunk is fast), r is
    the block's midpoint and the products cover the diagonal block too (factors within e^(FAST_SPAN / 2)); else r_I is
    G before block I (rows) and r_J G at block J's last row (columns), the products cover the other blocks (factors
    <= 1) and the diagonal blocks are summed elementwise (exponents <= 0): any gate. The choice is per chunk (each
    index of the leading dims), as a kernel's program makes it."""
    before = torch.cat([torch.zeros_like(G[..., :1, :]), G[..., BLOCK - 1 : -1 : BLOCK, :]], -2)  # [.., nb, K]
    last = G[..., BLOCK - 1 :: BLOCK, :]
    fast = ((before - last) < FAST_SPAN).flatten(-2).all(-1)[..., None, None]  # [.., 1, 1]
    quick, exact = (_blocked(X, a, G, before, last, f) for f in (True, False))
    return tuple(torch.where(fast, q, e) for q, e in zip(quick, exact, strict=True))  # type: ignore[return-value]


def _blocked(X: Tensor, a: Tensor, G: Tensor, before: Tensor, last: Tensor, fast: bool) -> tuple[Tensor, Tensor]:
    """`decayed_products_blocks` on one path for every chunk (the fast one overflows where a span passes FAST_SPAN:
    the caller keeps it only where none does)."""
    C = X.shape[-1]
    nb = C // BLOCK
    mid = 0.5 * (before + last)
    blk = torch.arange(C, device=X.device) // BLOCK
    R, Cc = torch.zeros_like(a), torch.zeros_like(a)
    for b in range(nb):
        rows = slice(b * BLOCK, (b + 1) * BLOCK)
        r_row = mid[..., b : b + 1, :] if fast else before[..., b : b + 1, :]
        r_col = mid[..., b : b + 1, :] if fast else last[..., b : b + 1, :]
        # rows of block b against the columns up to its end (fast) or before it (else): e^(r - G_j) <= 1 there
        cols = (blk <= b) if fast else (blk < b)
        right = (a * (r_row - G).exp()).masked_fill(~cols[:, None], 0.0)
        R[..., rows, :] = (G[..., rows, :] - r_row).exp() * (X[..., rows, :] @ right)
        # columns of block b against the rows from its start (fast) or after it (else)
        below = (blk >= b) if fast else (blk > b)
        left = (a * (G - r_col).exp()).masked_fill(~below[:, None], 0.0)
        Cc[..., rows, :] = (r_col - G[..., rows, :]).exp() * (X[..., :, rows].mT @ left)
        if not fast:  # the diagonal block elementwise: every exponent <= 0 (X is zero above the diagonal)
            Xd = X[..., rows, rows]
            D = (G[..., rows, None, :] - G[..., None, rows, :]).clamp_max(0.0).exp()  # [.., 16, 16, K]: i, j
            R[..., rows, :] += torch.einsum("...ij,...ijk,...jk->...ik", Xd, D, a[..., rows, :])
            Cc[..., rows, :] += torch.einsum("...ij,...ijk,...ik->...jk", Xd, D, a[..., rows, :])
    return R, Cc


def _finish(q: Tensor, k: Tensor, g: Tensor, G: Tensor, GC: Tensor, dgc_state: Tensor, kept: dict[str, Tensor],
            grads: dict[str, Tensor], scale: float) -> tuple[Tensor, Tensor, Tensor]:  # fmt: skip
    """dq, dk and dg of one chunk from the grams' products (grads: Rq, Cq, Rk, Ck), the gated keys' gradients
    (grads: dqg, dke, dkd; kept: qg, ke, kd) and the leaving gate's state term dgc_state = e^G_C o rowsum_V(S o dS'),
    both forms alike."""
    eG, eR = G.exp(), (GC[..., None, :] - G).exp()
    dqg, dke, dkd = grads["dqg"], grads["dke"], grads["dkd"]
    dq = grads["Rq"] + scale * eG * dqg
    dk = grads["Cq"] + grads["Rk"] + grads["Ck"] + eG * dke + eR * dkd
    dG = q * grads["Rq"] - k * grads["Cq"] + k * grads["Rk"] - k * grads["Ck"]
    dG = dG + kept["qg"] * dqg + kept["ke"] * dke - kept["kd"] * dkd
    dGC = dgc_state + (kept["kd"] * dkd).sum(-2)
    dG = torch.cat([dG[..., :-1, :], dG[..., -1:, :] + dGC[..., None, :]], -2)
    dg = dG.flip(-2).cumsum(-2).flip(-2).masked_fill(g < GATE_FLOOR, 0.0)
    return dq, dk, dg


def state_products(kept: dict[str, Tensor], v: Tensor, S: Tensor, do: Tensor, dS_next: Tensor) -> dict[str, Tensor]:
    """The chunk's products with its states (module docstring's first lines of the backward) from the gated tensors
    (kept: Ag, Aqk, qg, ke, kd, G_C): W, U, dU, dW (= dV), dS, dAqk, dAg, dqg, dke, dkd; the mirror of the TileLang
    lab kernel `kernels.ops.kda.state_grads_hopper` (which also gives dG_C's state term, `_finish`'s first)."""
    W = v - kept["ke"] @ S
    U = kept["Ag"] @ W
    dU = kept["Aqk"].tril().mT @ do + kept["kd"] @ dS_next  # (Aqk on and below the diagonal: what a pass writes)
    dW = kept["Ag"].mT @ dU
    return {
        "W": W, "U": U, "dU": dU, "dW": dW,
        "dS": kept["GC"].exp()[..., None] * dS_next + kept["qg"].mT @ do - kept["ke"].mT @ dW,
        "dAqk": (do @ U.mT).tril(), "dAg": dU @ W.mT, "dqg": do @ S.mT, "dke": -dW @ S.mT, "dkd": U @ dS_next.mT,
    }  # fmt: skip


def chunk_backward_gated(
    q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, S: Tensor, do: Tensor, dS_next: Tensor, *, scale: float
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    """(dq, dk, dv, dg, dbeta, dS) of one chunk given do `[..., C, V]` and the gradient dS_next reaching its leaving
    state; dS is the gradient at its entering state S (module docstring, the plain form: B and Gam formed whole)."""
    f = gated_factors(q, k, g, beta, scale)
    s = state_products(f, v, S, do, dS_next)
    T = f["T"]
    dA = -(T.mT @ (s["dAg"] * beta[..., None, :]) @ T.mT).tril(-1)
    dbeta = (s["dAg"] * T).sum(-2) + (dA * f["B"]).sum(-1)
    X = scale * s["dAqk"]
    Rk, Ck = decayed_products(beta[..., :, None] * dA, k, f["G"])
    grads = {**s, "Rq": decayed_products(X, k, f["G"])[0], "Cq": decayed_products(X, q, f["G"])[1], "Rk": Rk, "Ck": Ck}
    dq, dk, dg = _finish(q, k, g, f["G"], f["GC"], f["GC"].exp() * (S * dS_next).sum(-1), f, grads, scale)
    return dq, dk, s["dW"], dg, dbeta, s["dS"]


def chunk_backward_products(
    q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, S: Tensor, do: Tensor, dS_next: Tensor, *,
    kept: dict[str, Tensor], scale: float,
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:  # fmt: skip
    """`chunk_backward_gated`'s outputs the way a kernel forms them: from the forward's kept gated tensors (kept: Ag,
    Aqk, T, qg, ke, kd and G_C `[..., K]`; G recomputed from g), in the two halves of the planned kernels: the state
    products (`state_products`, `kernels.ops.kda.state_grads_hopper`), then `products_finish`
    (`kernels.ops.kda.bwd_products_hopper`)."""
    s = state_products(kept, v, S, do, dS_next)
    grads = {**s, "dGC": kept["GC"].exp() * (S * dS_next).sum(-1)}
    dq, dk, dg, dbeta = products_finish(q, k, g, beta, kept, grads, scale=scale)
    return dq, dk, s["dW"], dg, dbeta, s["dS"]


def products_finish(
    q: Tensor, k: Tensor, g: Tensor, beta: Tensor, kept: dict[str, Tensor], grads: dict[str, Tensor], *, scale: float
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """(dq, dk, dg, dbeta) of one chunk from the state products (grads: dAqk, dAg, dqg, dke, dkd and dGC, the leaving
    gate's state term e^G_C o rowsum_V(S o dS')) and the forward's kept T, qg, ke, kd: dA from T, then four decayed
    products, B never formed (dbeta's second term rowsum(dA o B) = rowsum(k o R(dA, k)), and dB's row product is beta
    times dA's). The mirror of the TileLang lab kernel `kernels.ops.kda.bwd_products_hopper`."""
    G = floor_gate(g).cumsum(-2)
    T = kept["T"]
    dA = -(T.mT @ (grads["dAg"] * beta[..., None, :]) @ T.mT).tril(-1)
    X = scale * grads["dAqk"]
    RA = decayed_products(dA, k, G)[0]  # beta-free: dbeta's term, and Rk = diag(beta) RA
    dbeta = (grads["dAg"] * T).sum(-2) + (k * RA).sum(-1)
    prods = {**grads, "Rq": decayed_products(X, k, G)[0], "Cq": decayed_products(X, q, G)[1], "Rk": beta[..., None] * RA,
             "Ck": decayed_products(beta[..., :, None] * dA, k, G)[1]}  # fmt: skip
    dq, dk, dg = _finish(q, k, g, G, G[..., -1, :], grads["dGC"], kept, prods, scale)
    return dq, dk, dg, dbeta


def reverse_backward(
    q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, do: Tensor, **options: Any
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    """(dq, dk, dv, dg, dbeta, dh0) of KDA: q, k, g `[B, T, H, K]`, v, do `[B, T, H, V]`, beta `[B, T, H]`; options:
    scale, initial_state, dht, cu_seqlens, chunk_size (`kernels.common.reverse_bwd_torch.reverse_backward`'s walk,
    with KDA's chunk functions: the forward walk for the states entering each chunk, then the reverse walk)."""
    return _walk(q, k, v, g, beta, do, forward=chunk_forward_gated, backward=chunk_backward_gated, **options)
