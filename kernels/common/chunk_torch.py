"""CHUNKED TORCH PATH: the WY-form chunk algorithm (C = 64) in plain PyTorch, for a per-key gate.

This is the `torch` backend of `kernels.forward` (and of `kernels.transition`, see transition.py): what a
machine without a GPU benchmarks. Shapes follow DESIGN.md §1. The gate is `[B, T, H, Kg]` with Kg == K
(KDA) or Kg == 1 (GDN: its scalar gate broadcasts over the key dim).

Per chunk of C tokens, with G the chunk-local cumulative log gate (natural log) of the floored gate (any g <= 0,
-inf masks included: `kernels.common.decay`, applied once in `chunk_prepare`):

    A    = StrictLower(beta_i sum_d k_id k_jd exp(G_id - G_jd))      T = (I + A)^-1 (triangular solve)
    w    = T (beta * exp(G) * K)           u = T (beta * V)          K~ = K * exp(G_C - G)
    state pass (serial over the chunks of a sequence, S = state entering the chunk):
    v_new = u - w S                        S' = Diag(exp(G_C)) S + K~^T v_new
    o    = scale [(Q * exp(G)) S + (sum_d q_id k_jd exp(G_id - G_jd), i >= j) v_new]

Everything is fp32 inside (fp64 for fp64 inputs: tests and gradcheck); o is cast to q.dtype, the final state stays fp32. Vectorised over chunks and
heads: the only Python loop is the state pass over chunk positions (plus, for a per-key gate, a loop over
blocks of chunks that bounds the memory of the decay factors; see `_per_key_products` for the overflow-free split). Varlen: every sequence is padded to a
multiple of C through gather maps built once on the host (`ChunkIndex.pad`); padded tokens have k = v = 0,
beta = 0, g = 0, i.e. the identity map, so they change neither states nor outputs.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from kernels.common.decay import floor_gate
from kernels.common.index import ChunkIndex

__all__ = ["ChunkPrep", "chunk_fwd_torch", "chunk_prepare", "chunk_state_pass", "compute_dtype", "from_chunks", "last_rows",
           "to_chunks"]

# bytes allowed for one block of the per-key decay tensor [n, H, C, C, K] (a few temporaries of this size live at once)
_DECAY_BLOCK_BYTES = 64 << 20
# sub-block size of the per-key decay products (see _per_key_products): 8 balances the C/8 bounded-factor matmuls
# against the [8, 8, K] diagonal decay tensors
_SUB = 8


@dataclass
class ChunkPrep:
    """Per-chunk quantities, all fp32 and `[NT, H, C, ...]` (chunk-major, heads second)."""

    w: Tensor          # [NT, H, C, K]
    u: Tensor          # [NT, H, C, V]
    kt: Tensor         # [NT, H, C, K]  K~ = K * exp(G_C - G)
    gamma: Tensor      # [NT, H, Kg]    exp(G_C)
    qg: Tensor | None  # [NT, H, C, K]  Q * exp(G)
    aqk: Tensor | None  # [NT, H, C, C] lower triangle incl. diagonal, unscaled
    akk: Tensor | None = None  # [NT, H, C, C] A = StrictLower(beta_i k_i . k_j decay), T = (I + A)^-1 (the backward)


def compute_dtype(x: Tensor) -> torch.dtype:
    """The dtype the torch path computes in: fp64 for fp64 inputs (tests, gradcheck), fp32 for everything else."""
    return torch.float64 if x.dtype == torch.float64 else torch.float32


def to_chunks(x: Tensor, index: ChunkIndex, dtype: torch.dtype = torch.float32) -> Tensor:
    """`[B, T, H, *rest]` -> `[NT, H, C, *rest]` in `dtype` (fp32), padding each sequence to a multiple of C with zeros."""
    B, T, H = x.shape[:3]
    rest = x.shape[3:]
    flat = x.reshape(B * T, H, *rest).to(dtype)
    pad = index.pad
    if not pad.identity:
        flat = torch.cat([flat, flat.new_zeros(1, H, *rest)], 0)[pad.gather]
    return flat.reshape(index.num_chunks, index.chunk_size, H, *rest).transpose(1, 2)


def last_rows(index: ChunkIndex, batch: int, seq_len: int, heads: int, device: torch.device) -> Tensor:
    """Each chunk's last valid row (its tokens minus one), `[NT, heads, 1]` int64: a partial chunk's padding excluded."""
    ones = torch.ones(batch, seq_len, heads, dtype=torch.int64, device=device)
    return to_chunks(ones, index, torch.int64).sum(2, keepdim=True) - 1


def from_chunks(x: Tensor, index: ChunkIndex, batch: int, seq_len: int) -> Tensor:
    """`[NT, H, C, *rest]` -> `[B, T, H, *rest]` (drops the padding)."""
    H = x.shape[1]
    rest = x.shape[3:]
    flat = x.transpose(1, 2).reshape(index.num_chunks * index.chunk_size, H, *rest)
    if not index.pad.identity:
        flat = flat[index.pad.scatter]
    return flat.reshape(batch, seq_len, H, *rest)


def chunk_prepare(k: Tensor, v: Tensor, g: Tensor, beta: Tensor, q: Tensor | None = None) -> ChunkPrep:
    """Intra-chunk work on chunked fp32 inputs: k, q `[NT,H,C,K]`, v `[NT,H,C,V]`, g `[NT,H,C,Kg]`, beta `[NT,H,C]`."""
    NT, H, C, K = k.shape
    Kg = g.shape[-1]
    G = floor_gate(g).cumsum(2)                                         # [NT, H, C, Kg] (kernels.common.decay)
    causal = torch.ones(C, C, dtype=torch.bool, device=k.device).tril()
    strict = causal.tril(-1)
    A = k.new_empty(NT, H, C, C)
    aqk = k.new_empty(NT, H, C, C) if q is not None else None
    if Kg == 1:
        # scalar gate: the decay exp(G_i - G_j) is one [C, C] matrix per chunk and head
        E = (G - G.transpose(-1, -2)).masked_fill(~causal, float("-inf")).exp()   # [NT, H, C, C]
        A = (k @ k.transpose(-1, -2)) * E
        if q is not None:
            aqk = (q @ k.transpose(-1, -2)) * E
    else:
        step = max(1, _DECAY_BLOCK_BYTES // max(1, H * C * (C // _SUB + _SUB) * Kg * 4))
        for s in range(0, NT, step):
            sl = slice(s, min(NT, s + step))
            A[sl] = _per_key_products(k[sl], k[sl], G[sl])
            if q is not None and aqk is not None:
                aqk[sl] = _per_key_products(q[sl], k[sl], G[sl])
    A = A.masked_fill(~strict, 0.0) * beta[..., None]                    # beta_i on row i
    eye = torch.eye(C, dtype=A.dtype, device=A.device)
    eG = G.exp()
    rhs = torch.cat([beta[..., None] * eG * k, beta[..., None] * v], -1)  # [NT, H, C, K+V]
    sol = torch.linalg.solve_triangular(A + eye, rhs, upper=False, unitriangular=True)
    w, u = sol[..., :K], sol[..., K:]
    G_C = G[:, :, -1:]                                                  # [NT, H, 1, Kg]
    kt = k * (G_C - G).exp()
    qg = q * eG if q is not None else None
    return ChunkPrep(w=w, u=u, kt=kt, gamma=G_C[:, :, 0].exp(), qg=qg, aqk=aqk, akk=A)


def _per_key_products(a: Tensor, k: Tensor, G: Tensor) -> Tensor:
    """P[i, j] = sum_d a_id k_jd exp(G_id - G_jd) for j <= i and 0 above the diagonal, `[n, H, C, C]`.

    exp(G_i - G_j) with a per-key gate cannot be split as exp(G_i) exp(-G_j) (overflow once the chunk's cumsum
    passes ~-88), but it can around r = the last row of j's sub-block of _SUB rows: for i in a later sub-block,
    exp(G_i - G_r) <= 1 and exp(G_r - G_j) <= 1, so the off-diagonal sub-blocks are plain matmuls of bounded
    factors. The diagonal sub-blocks form the [_SUB, _SUB, K] decay directly.
    """
    n, H, C, K = k.shape
    BC = _SUB if C % _SUB == 0 else C
    NB = C // BC
    Gb = G.view(n, H, NB, BC, K)
    Gr = Gb[:, :, :, -1]                                               # [n, H, NB, K]  G at each sub-block's end
    blk = torch.arange(C, device=k.device) // BC
    after = blk[None, :] > torch.arange(NB, device=k.device)[:, None]  # [NB, C]  row i lies after sub-block b
    El = torch.where(after[:, :, None], G[:, :, None] - Gr[:, :, :, None], float("-inf")).exp_()   # [n, H, NB, C, K]
    kb = k.view(n, H, NB, BC, K)
    R = kb * (Gr[:, :, :, None] - Gb).exp()                            # [n, H, NB, BC, K]
    P = ((a[:, :, None] * El) @ R.transpose(-1, -2)).permute(0, 1, 3, 2, 4).reshape(n, H, C, C)
    causal = torch.ones(BC, BC, dtype=torch.bool, device=k.device).tril()
    Ed = (Gb[:, :, :, :, None] - Gb[:, :, :, None]).masked_fill(~causal[:, :, None], float("-inf")).exp_()  # [n,H,NB,BC,BC,K]
    Pd = torch.einsum("nhbik,nhbijk->nhbij", a.view(n, H, NB, BC, K), Ed * kb[:, :, :, None])        # [n, H, NB, BC, BC]
    P.view(n, H, NB, BC, NB, BC).diagonal(0, 2, 4).copy_(Pd.permute(0, 1, 3, 4, 2))
    return P


def chunk_state_pass(
    prep: ChunkPrep, index: ChunkIndex, h0: Tensor, *, u: Tensor | None = None, store: bool = True
) -> tuple[Tensor, Tensor | None, Tensor | None]:
    """The serial pass over chunks: returns (final state `[N,H,K,Vs]`, states entering each chunk, v_new).

    `u` overrides prep.u (the transition runs with an augmented right-hand side); h0 `[N,H,K,Vs]` fp32.
    With store=False the per-chunk states and v_new are not kept (both returned as None).
    """
    u = prep.u if u is None else u
    NT, H, C, _ = u.shape
    S = h0
    h = S.new_empty(NT, *S.shape[1:]) if store else None              # [NT, H, K, Vs]
    v_new = u.new_empty(u.shape) if store else None                    # [NT, H, C, Vs]
    wT = prep.kt.transpose(-1, -2)                                     # [NT, H, K, C]
    for seq_ids, chunk_ids in index.pad.steps:
        Sj = S if seq_ids is None else S.index_select(0, seq_ids)
        vn = u[chunk_ids] - prep.w[chunk_ids] @ Sj                       # [n, H, C, Vs]
        if h is not None and v_new is not None:
            h[chunk_ids] = Sj
            v_new[chunk_ids] = vn
        Sj = prep.gamma[chunk_ids][..., None] * Sj + wT[chunk_ids] @ vn
        S = Sj if seq_ids is None else S.index_copy(0, seq_ids, Sj)
    return S, h, v_new


def chunk_fwd_torch(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    g: Tensor,
    beta: Tensor,
    *,
    scale: float,
    initial_state: Tensor | None,
    output_final_state: bool,
    index: ChunkIndex,
    states: list[Tensor] | None = None,
) -> tuple[Tensor, Tensor | None]:
    """Chunked forward. q, k `[B,T,H,K]`, v `[B,T,H,V]`, g `[B,T,H,Kg]` (Kg in {1, K}), beta `[B,T,H]`.

    Returns o `[B,T,H,V]` in q.dtype and the fp32 final state `[N,H,K,V]` (or None); `states`, a list, receives
    the states entering each chunk `[NT,H,K,V]` (fp32).
    """
    B, T, H, K = k.shape
    V = v.shape[-1]
    cd = compute_dtype(q)
    qc, kc, vc, gc, bc = (to_chunks(x, index, cd) for x in (q, k, v, g, beta))
    prep = chunk_prepare(kc, vc, gc, bc, q=qc)
    if initial_state is not None:
        h0 = initial_state.to(cd)
    else:
        h0 = q.new_zeros(index.num_seqs, H, K, V, dtype=cd)
    ht, h, v_new = chunk_state_pass(prep, index, h0)
    assert h is not None and v_new is not None and prep.qg is not None and prep.aqk is not None
    if states is not None:
        states.append(h)
    o = scale * (prep.qg @ h + prep.aqk @ v_new)                         # [NT, H, C, V]
    o = from_chunks(o, index, B, T).to(q.dtype)
    return o, (ht if output_final_state else None)
