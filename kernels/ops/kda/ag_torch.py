"""TORCH MIRROR of KDA's TileLang Ag pass (`kernels.ops.kda.ag_hopper`), and the fp64 reference both are tested
against: what the pass stores per chunk and value head (Ag, Aqk and the gated keys of `kernels.ops.kda.wy_ag`'s
`gated` variant), by the kernel's decomposition, in plain PyTorch.

Per chunk of C = 64 rows (G the in-chunk cumsum of the floored per-key gate, `[C, K]`; block I the rows 16I..16I+15,
b_I the cumsum before it (b_0 = 0), e_I its last row's, per key):

    r_I = (b_I + e_I) / 2 where every key's span b_I - e_I < FAST_SPAN in all four blocks ("fast"), else b_I
    L_I = X_I (x) e^(G_I - r_I)                    (X = K for A, Q for Aqk; the block's rows)
    R_I = K (x) e^(r_I - G), rows j <= the block's last (fast) or before the block (not fast), else 0
    A^T[:, block I] = R_I L_I^T                    (64 x 16 products per block: every exponent of an entry below the
                                                     block's diagonal <= 0, of the block's own <= the half span)

A's products take bf16 operands (hi parts); Aqk's add the lo parts' two products (R_lo L_hi^T + R_hi L_lo^T, x_lo =
x - bf16(x)): rounding its operands to bf16 alone took o's error from 1.6e-3 to 2.9e-3 at K = 128
(`tests/kernels/ops/kda/test_ag_torch.py`), A's Ag error stays ~1e-4.
    not fast: the diagonal blocks sum_d x_id k_jd e^(G_id - G_jd) elementwise (fp32, every exponent <= 0)
    A = StrictLower(beta_i A_ij),  Ag = (I + A)^-1 diag(beta) (`kernels.common.ag_torch.block_inverse`)
    Aqk = scale (Q-gram on and below the diagonal)
    qg = scale Q e^G, ke = K e^G (as L_I e^(r_I)), kd = K e^(G_C - G), gc = G_C (the chunk's last valid row)

`chunk_ref` (the kernel's lab build of that name, session 33): where every key's span across the whole chunk,
-G's last row, is under FAST_SPAN, one reference a key for all four blocks, r = G's last row / 2, and R over all 64
rows (the entries above A's diagonal may then overflow fp32; they are never selected, `torch.where` below).

`operand` = None keeps the products' operands in the compute dtype (the exact decomposition). Varlen through `ChunkIndex.pad` (padded rows: k = q = 0, gate 0, so G repeats the last
valid row's).
"""

from __future__ import annotations

import torch
from torch import Tensor

from kernels.common.ag_torch import block_inverse
from kernels.common.chunk_torch import from_chunks, last_rows, to_chunks
from kernels.common.decay import floor_gate
from kernels.common.index import ChunkIndex

__all__ = ["FAST_SPAN", "kda_ag_blocks", "kda_ag_reference"]

FAST_SPAN = 100.0  # `kernels.common.wy.FAST_SPAN`'s value (that module imports Triton; this one must not)
_C, _B = 64, 16  # chunk rows, block rows


def _chunks(q: Tensor, k: Tensor, g: Tensor, beta: Tensor, index: ChunkIndex, dt: torch.dtype):
    """q, k on the value heads, G, beta in chunks: `[NT, HV, C, K]` x 3, `[NT, HV, C]`."""
    hv = g.shape[2]
    qc, kc = (to_chunks(x.repeat_interleave(hv // x.shape[2], 2), index, dt) for x in (q, k))
    G = to_chunks(floor_gate(g), index, dt).cumsum(2)
    return qc, kc, G, to_chunks(beta, index, dt)


def kda_ag_reference(q: Tensor, k: Tensor, g: Tensor, beta: Tensor, *, index: ChunkIndex, scale: float,
                     dtype: torch.dtype = torch.float64) -> tuple[Tensor, Tensor, Tensor]:  # fmt: skip
    """(Ag, Aqk `[B, T, HV, C]`, G `[B, T, HV, K]`) in `dtype`: the decayed grams sum_d x_id k_jd e^(G_id - G_jd)
    per entry, A strictly lower times beta on the rows, Ag = (I + A)^-1 diag(beta) by a triangular solve, Aqk scale
    times the q-gram on and below the diagonal (zeros above), G the in-chunk cumsum of the floored gate."""
    B, T, HV, _ = g.shape
    qc, kc, G, bc = _chunks(q, k, g, beta, index, dtype)
    C = index.chunk_size
    lower = torch.ones(C, C, dtype=torch.bool, device=g.device).tril()

    def gram(x: Tensor, m: Tensor) -> Tensor:
        D = (G[..., :, None, :] - G[..., None, :, :]).masked_fill(~m[..., None], float("-inf")).exp()
        return torch.einsum("nhid,nhjd,nhijd->nhij", x, kc, D)

    A = gram(kc, lower.tril(-1)) * bc[..., None]
    eye = torch.eye(C, dtype=dtype, device=g.device)
    ag = torch.linalg.solve_triangular(A + eye, torch.diag_embed(bc), upper=False, unitriangular=True)
    return from_chunks(ag, index, B, T), from_chunks(gram(qc, lower) * scale, index, B, T), from_chunks(G, index, B, T)


def kda_ag_blocks(
    q: Tensor, k: Tensor, g: Tensor, beta: Tensor, *, index: ChunkIndex, scale: float,
    dtype: torch.dtype = torch.float32, operand: torch.dtype | None = torch.bfloat16, aqk_lo: bool = True,
    chunk_ref: bool = False,
) -> tuple[Tensor, Tensor, tuple[Tensor, Tensor, Tensor, Tensor]]:  # fmt: skip
    """(Ag, Aqk `[B, T, HV, C]`, (qg, ke, kd `[B, T, HV, K]`, gc `[NT, HV, K]`)) in `dtype` by the TileLang pass's
    decomposition (module docstring), the products' operands rounded to `operand` (None: not rounded; aqk_lo False:
    Aqk without its lo parts' products, `benchmarks/kda_ag_precision.py`; chunk_ref: the module docstring's). q, k
    `[B, T, H, K]`, g `[B, T, HV, K]`, beta `[B, T, HV]`; chunk 64 only."""
    B, T, HV, K = g.shape
    if index.chunk_size != _C:
        raise ValueError(f"kda_ag_blocks: the TileLang Ag pass's decomposition takes chunk 64, got {index.chunk_size}")
    qc, kc, G, bc = _chunks(q, k, g, beta, index, dtype)
    nb = _C // _B
    e = G[..., _B - 1 :: _B, :]  # [NT, HV, 4, K] each block's last row
    b = torch.cat([torch.zeros_like(e[..., :1, :]), e[..., :-1, :]], dim=-2)  # the cumsum before each block
    fast = (b - e).amax(dim=(-2, -1), keepdim=True) < FAST_SPAN  # [NT, HV, 1, 1] per chunk and head
    r = torch.where(fast, 0.5 * (b + e), b)  # [NT, HV, 4, K]
    rr = r.repeat_interleave(_B, dim=-2)  # each row's block reference [NT, HV, C, K]

    def rnd(x: Tensor) -> Tensor:
        return x if operand is None else x.to(operand).to(dtype)

    def mm(a: Tensor, b: Tensor) -> Tensor:
        return a @ b.transpose(-1, -2)

    Lk, Lq = kc * (G - rr).exp(), qc * (G - rr).exp()
    # (chunk_ref) the chunks whose every key spans under FAST_SPAN take one reference a key: the products' operands
    # below use rp and reach every row there; the gated keys keep the blocks' references (the kernel forms them from G)
    whole = (-G[..., -1:, :]).amax(-1, keepdim=True) < FAST_SPAN if chunk_ref else torch.zeros_like(fast)
    rp = torch.where(whole, 0.5 * G[..., -1:, :], r)  # [NT, HV, 4, K]
    rrp = rp.repeat_interleave(_B, dim=-2)
    Lkp, Lqp = (Lk, Lq) if not chunk_ref else (kc * (G - rrp).exp(), qc * (G - rrp).exp())
    rows = torch.arange(_C, device=g.device)
    At = torch.zeros(*G.shape[:2], _C, _C, dtype=dtype, device=g.device)  # A^T, then Aqk^T, column blocks by I
    Qt = torch.zeros_like(At)
    for i in range(nb):
        blk = slice(_B * i, _B * i + _B)
        reach = torch.where(fast[..., 0], rows < _B * i + _B, rows < _B * i) | whole[..., 0]  # [NT, HV, C] R_I's rows
        R = torch.where(reach[..., None], kc * (rp[..., i : i + 1, :] - G).exp(), 0.0)
        Rh, Lh = rnd(R), rnd(Lqp[..., blk, :])
        At[..., blk] = mm(Rh, rnd(Lkp[..., blk, :]))
        Qt[..., blk] = mm(Rh, Lh)
        if aqk_lo:
            Qt[..., blk] += mm(rnd(R - Rh), Lh) + mm(Rh, rnd(Lqp[..., blk, :] - Lh))
    A, Aqk = At.transpose(-1, -2), Qt.transpose(-1, -2)
    slow = ~fast[..., 0, 0]  # [NT, HV]: the diagonal blocks elementwise
    if bool(slow.any()):
        for i in range(nb):
            blk = slice(_B * i, _B * i + _B)
            Gb = G[..., blk, :]
            D = (Gb[..., :, None, :] - Gb[..., None, :, :]).clamp_max(0).exp()  # [.., 16, 16, K], exponents <= 0 used
            dk = torch.einsum("nhid,nhjd,nhijd->nhij", kc[..., blk, :], kc[..., blk, :], D)
            dq = torch.einsum("nhid,nhjd,nhijd->nhij", qc[..., blk, :], kc[..., blk, :], D)
            A[..., blk, blk] = torch.where(slow[..., None, None], dk, A[..., blk, blk])
            Aqk[..., blk, blk] = torch.where(slow[..., None, None], dq, Aqk[..., blk, blk])
    # (selected, not multiplied: under chunk_ref the entries above the diagonal may be inf)
    A = torch.where(rows[:, None] > rows[None, :], A, 0.0) * bc[..., None]
    Aqk = torch.where(rows[:, None] >= rows[None, :], Aqk, 0.0) * scale
    ag = block_inverse(A) * bc[..., None, :]
    last = last_rows(index, B, T, HV, g.device)  # [NT, HV, 1]
    gc = G.gather(2, last[..., None].expand(-1, -1, 1, K))  # [NT, HV, 1, K]: the last valid row's
    er = r.exp().repeat_interleave(_B, dim=-2)
    gated = (scale * Lq * er, Lk * er, kc * (gc - G).exp())
    out = [from_chunks(x, index, B, T) for x in (ag, Aqk, *gated)]
    return out[0], out[1], (out[2], out[3], out[4], gc[..., 0, :])
