"""Gate-certified warm window in the backward's split reverse state pass (GDN and KDA; `LaunchPlan.bwd_warm`).

The split reverse pass (`kernels.common.state_bwd`) chains dS_end(s-1) = M_s^T dS_end(s) + dS_ext_s from dht down,
with M_s every non-first segment's forward map and dS_ext_s its reverse pass from zero (a walk of the whole segment).
The reverse recurrence is the forward's transposed, per token dS_{t-1} = A_t^T (dS_t + scale q_t do_t^T) with
A_t = (I - b_t k_t k_t^T) D_t, so ||A_t^T|| = ||A_t|| <= exp(l_t) (`kernels.common.decay_bound`), the writes are
scale q_t do_t^T (norm scale ||q_t|| ||do_t||), and dht enters as a write at its sequence's last token. When the gates
decay, the gradient at the end of segment s-1 is almost E_win, the reverse pass over the FIRST `w` chunks of segment s
from zero (the window after the segment end); the dropped part is (A^T over the window) times the gradient at the
window's end. The forward's machinery (`kernels.common.warm_split`) applies mirrored in time. Per (non-first segment,
head), on the device, no host sync:

1. `chunk_state_bwd` walks only the windows (ds_out only): E_win `[NS - N, H, K, V]`;
2. `reverse_chunk_bound` (one Triton launch, a program per chunk and head) sums the bound's per-token terms per chunk:
   L = sum of l_t and W = log sum_t u_t exp(sum of l over the chunk's tokens up to t, inclusive) (the chunk's writes'
   gradient norm at its start), fp32 rounded up like the WY pass's forward sums (`kernels.common.wy._chunk_bound`),
   stored in flipped chunk order. On the flipped chunk axis the reverse bound is the forward's, so
   `kernels.common.warm_certify.certify_chunk_windows` certifies (dht folded in as `warm_split.fold_initial_states`
   folds h0); a window that reaches its sequence's end is never certified when dht is given (its dht would be inside
   the window, where the bound does not count it). Only the writes' norms read do; the rest (l_t, L, A and
   0.5 log ||q_t||^2 + the cumsum of l up to t) depends on the forward's inputs alone, so GDN's two-kernel forward has
   its Ag pass store that q, k side when the plan keeps Ag for a backward with this window (`kernels.ops.gdn.wy_ag.wy_gdn_ag(rev=)`:
   per token p fp32 `[B, T, H]`, per chunk (L rounded up, A) `[NT_total, H, 2]`, kept as `KEPT_REV_SUMS`;
   `RevWarmInputs.qk_sums`), and `reverse_chunk_bound_kept` (a program per chunk and head) then reads do, p and
   (L, A) alone: W = log sum_t exp(log scale + p_t + 0.5 log ||do_t||^2), rounded up there, with the backward's
   scale (H200, 1x64K, H 16, K = V = 128 bf16: `reverse_chunk_bound` took 0.24 ms, almost all of it reading q and
   k; do's bytes alone take about 0.07 ms; the new launch not timed yet). GDN's backward from the kept Ag without
   those sums has `wy_from_ag` make the sums from its own loads of q and k (`RevWarmInputs.bnd`, session 19).
   Either way, where the forward's sums are not needed, this launch does not run;
3. the maps M (`chunk_state_transition_fwd(need=)`) and the ext pass (`chunk_state_bwd(need=)`) run for the
   uncertified pairs only (the others walk nothing); the forward's maps are used instead where it kept them, or where
   the backward's forward-state recompute needs the maps of all segments anyway;
4. dS_ext = where(certified, E_win, dS_ext) and `seg_chain_bwd(drop=certified)`: no [K, K] product where certified.
The pass storing dh, dv_new then runs from the chained ends as on the exact path. Certified pairs leave an error
<= tol (`warm_split.WARM_TOL`) relative, Frobenius, in the gradient at their segment's end.

When the backward recomputes the chunk states (nothing kept), the same launch of `reverse_chunk_bound` also sums the
forward's bound terms (`v=`: `kernels.common.wy._chunk_bound`'s (L, W), chunk order), and the recompute's split
chain takes the forward's certified windows (`warm_split.warm_transitions`, `seg_chain_fwd(drop=)`, report key
`certified_fwd`): with both directions certified no segment walks its full transition pass.

The window w (`LaunchPlan.bwd_warm_for(op)`, chunks; 0 = the exact path; by default 4 for both ops since session 13,
`kernels.vocabulary.AUTO_BWD_WARM`) is a host constant; windows are cut to
their segment (a last segment shorter than w is walked whole), and w must be shorter than the split's segments, else
the exact path runs (`reverse_window_plan` returns None). `RevWarmInputs.report` (a dict, optional) receives the
device tensor `certified` `[NS - N, H]`: read it after the call (tests, benchmarks), never inside a step.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch
import triton
import triton.language as tl
from torch import Tensor

from kernels.common.chunk_program import chunk_of_program, group_heads, heuristics
from kernels.common.chunk_state import SeqLayout, chunk_state_transition_fwd
from kernels.common.index import ChunkIndex
from kernels.common.seqsplit import SplitPlan
from kernels.common.state_bwd import chunk_state_bwd, first_segments, seg_chain_bwd
from kernels.common.warm_certify import certify_chunk_windows
from kernels.common.warm_split import WARM_TOL, fold_initial_states
from kernels.common.wy import BOUND_MARGIN, FLOOR
from kernels.configs import cdiv, head_block
from kernels.plan import LaunchPlan

__all__ = [
    "KEPT_REV_SUMS",
    "RevWarmInputs",
    "RevWindowPlan",
    "certify_reverse_windows",
    "kept_rev_sums",
    "reverse_chunk_bound",
    "reverse_chunk_bound_kept",
    "reverse_window_plan",
    "need_chunks",
    "warm_segment_ends",
    "window_chunk_sel",
]


# the names under which GDN's forward keeps its Ag pass's q, k side of the reverse sums (p, (L, A); module docstring,
# step 2) for the backward (`kernels.ops.gdn.fused.gdn_fused_fwd(keep=)`, read by `kernels.ops.gdn.ag_bwd`)
KEPT_REV_SUMS: tuple[str, str] = ("rev_p", "rev_la")


def kept_rev_sums(kept: Mapping[str, Tensor] | None) -> tuple[Tensor, Tensor] | None:
    """The forward's q, k side of the reverse sums from what it kept (`KEPT_REV_SUMS`; `RevWarmInputs.qk_sums`), or
    None where it kept none."""
    if kept is None or KEPT_REV_SUMS[0] not in kept:
        return None
    return kept[KEPT_REV_SUMS[0]], kept[KEPT_REV_SUMS[1]]


@dataclass(frozen=True, eq=False)
class RevWarmInputs:
    """What the reverse certification reads besides do: the op's raw q, k (`[B, T, H / G, K]`), gate (`[B, T, H]` or
    `[B, T, H, K]`) and beta, the window in chunks, the tolerance and an optional dict receiving `certified`."""

    q: Tensor
    k: Tensor
    g: Tensor
    beta: Tensor
    window_chunks: int
    tol: float = WARM_TOL
    report: dict[str, Tensor] | None = None
    v: Tensor | None = None  # [B, T, H, V]: also the forward's sums (`reverse_chunk_bound(v=)`, the states' recompute)
    # [NT_total, H, 2]: `reverse_chunk_bound`'s sums made by another launch (GDN's `wy_from_ag(bound=)`), used instead
    # of it where the forward's sums are not needed
    bnd: Tensor | None = None
    # (p fp32 [B, T, H], (L, A) fp32 [NT_total, H, 2]): the forward's q, k side of those sums (`KEPT_REV_SUMS`), from
    # which `reverse_chunk_bound_kept` makes them reading do alone where the forward's sums are not needed
    qk_sums: tuple[Tensor, Tensor] | None = None


@triton.jit
def _log_sum_exp_up(e, A):
    """log sum exp(e) over a chunk's tokens, rounded up by `kernels.common.wy._chunk_bound`'s margin (A: the sum of
    |l| the exponents were summed from); -inf when every e is -inf (no write), without inf - inf."""
    m = tl.max(e, 0)
    m = tl.where(m == float("-inf"), 0.0, m)
    lw = m + tl.log(tl.sum(tl.exp(e - m), 0))
    return tl.where(lw > float("-inf"), lw + BOUND_MARGIN * (A + tl.abs(lw) + 1.0), lw)


@triton.jit
def _chunk_rows(cu_seqlens, chunk_indices, T, H: tl.constexpr, BT: tl.constexpr, IS_VARLEN: tl.constexpr):
    """This program's chunk and head (grid (chunk, batch x head)): (i_h, the global chunk i_tg, bos, the chunk's rows
    o_r within its sequence, m_r = those before its end, p_row = their [.., H] row offsets)."""
    i_c, i_bh = tl.program_id(0), tl.program_id(1)
    i_b, i_h = i_bh // H, i_bh % H
    _, i_t, i_tg, bos, T = chunk_of_program(i_c, i_b, cu_seqlens, chunk_indices, T, BT, IS_VARLEN)
    o_r = i_t * BT + tl.arange(0, BT)
    m_r = o_r < T
    return i_h, i_tg, bos, o_r, m_r, (bos + o_r) * H + i_h


@triton.jit
def _reverse_bound_store(bnd, row, kk, qq, dd, gm, b_b, m_r, log_scale):
    """Store one chunk's reverse bound summary (L, W) at row `row` of bnd ([.., 2] fp32) from its tokens' squared
    norms kk = ||k||^2, qq = ||q||^2, dd = ||do||^2, floored (slowest) gate gm and beta b_b ([BT] fp32 each, m_r: the
    rows before T); returns the per-token l, L and A (= sum |l|) for the forward's sums."""
    # per token: l = g + log max(1, |1 - beta ||k||^2|), log u = log(scale ||q|| ||do||); rows past T: 0 and -inf
    l = tl.where(m_r, gm + tl.log(tl.maximum(tl.abs(1.0 - b_b * kk), 1.0)), 0.0)
    pos = m_r & (qq > 0.0) & (dd > 0.0)  # a zero write: log u = -inf (no log of 0)
    lu = tl.log(tl.where(pos, qq, 1.0)) + tl.log(tl.where(pos, dd, 1.0))
    lu = tl.where(pos, log_scale + 0.5 * lu, float("-inf"))
    L = tl.sum(l, 0)
    A = tl.sum(tl.abs(l), 0)
    # a write reaches the chunk start through its own token's map and the earlier ones
    tl.store(bnd + row * 2, L + BOUND_MARGIN * A)
    tl.store(bnd + row * 2 + 1, _log_sum_exp_up(lu + tl.cumsum(l, 0), A))
    return l, L, A


@heuristics(
    {
        "IS_VARLEN": lambda args: args["cu_seqlens"] is not None,
        "HAS_FWD": lambda args: args["fbnd"] is not None,
        "G": group_heads("do"),
    }
)
@triton.jit(do_not_specialize=["T"])
def reverse_chunk_bound_kernel(
    q, k,  # [B, T, H / G, K] raw
    g,  # raw gate [B, T, H] (GDN) or [B, T, H, K] (KDA)
    beta,  # [B, T, H]
    do,  # [B, T, H, V]
    v,  # [B, T, H, V] or None (read for fbnd)
    bnd,  # out [NT_total, H, 2] fp32: (L, W) of global chunk c at row NT_total - 1 - c (flipped)
    fbnd,  # out [NT_total, H, 2] fp32 or None: the forward's (L, W) (`kernels.common.wy._chunk_bound`'s), chunk order
    cu_seqlens, chunk_indices, log_scale, T, NT_ALL,
    H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    GATE_VECTOR: tl.constexpr, IS_VARLEN: tl.constexpr, HAS_FWD: tl.constexpr, G: tl.constexpr,
):  # fmt: skip
    i_h, i_tg, bos, o_r, m_r, p_row = _chunk_rows(cu_seqlens, chunk_indices, T, H, BT, IS_VARLEN)
    p_qk = (bos + o_r) * (H // G) + i_h // G  # grouped heads: the shared q/k head
    kk = tl.zeros([BT], dtype=tl.float32)
    qq = tl.zeros([BT], dtype=tl.float32)
    gm = tl.full([BT], float("-inf"), dtype=tl.float32)
    for i_k in range(tl.cdiv(K, BK)):
        o_k = i_k * BK + tl.arange(0, BK)
        m_rk = m_r[:, None] & (o_k < K)[None, :]
        b_k = tl.load(k + p_qk[:, None] * K + o_k[None, :], mask=m_rk, other=0.0).to(tl.float32)
        b_q = tl.load(q + p_qk[:, None] * K + o_k[None, :], mask=m_rk, other=0.0).to(tl.float32)
        kk += tl.sum(b_k * b_k, 1)
        qq += tl.sum(b_q * b_q, 1)
        if GATE_VECTOR:  # the slowest key channel, floored as the kernels floor it (`kernels.common.decay`)
            b_g = tl.load(g + p_row[:, None] * K + o_k[None, :], mask=m_rk, other=float("-inf")).to(tl.float32)
            gm = tl.maximum(gm, tl.max(tl.maximum(b_g, FLOOR), 1))
    if not GATE_VECTOR:
        gm = tl.maximum(tl.load(g + p_row, mask=m_r, other=0.0).to(tl.float32), FLOOR)
    dd = tl.zeros([BT], dtype=tl.float32)
    vv = tl.zeros([BT], dtype=tl.float32)
    for i_v in range(tl.cdiv(V, BV)):
        o_v = i_v * BV + tl.arange(0, BV)
        m_rv = m_r[:, None] & (o_v < V)[None, :]
        b_do = tl.load(do + p_row[:, None] * V + o_v[None, :], mask=m_rv, other=0.0).to(tl.float32)
        dd += tl.sum(b_do * b_do, 1)
        if HAS_FWD:
            b_v = tl.load(v + p_row[:, None] * V + o_v[None, :], mask=m_rv, other=0.0).to(tl.float32)
            vv += tl.sum(b_v * b_v, 1)
    b_b = tl.load(beta + p_row, mask=m_r, other=0.0).to(tl.float32)
    l, L, A = _reverse_bound_store(bnd, (NT_ALL - 1 - i_tg) * H + i_h, kk, qq, dd, gm, b_b, m_r, log_scale)
    if HAS_FWD:  # the forward's writes beta k v^T reach the chunk's end through the maps after their own token
        fpos = m_r & (b_b != 0.0) & (kk > 0.0) & (vv > 0.0)
        fu = tl.log(tl.where(fpos, tl.abs(b_b), 1.0)) + 0.5 * tl.log(tl.where(fpos, kk, 1.0))
        fu = tl.where(fpos, fu + 0.5 * tl.log(tl.where(fpos, vv, 1.0)), float("-inf"))
        tl.store(fbnd + (i_tg * H + i_h) * 2, L + BOUND_MARGIN * A)
        tl.store(fbnd + (i_tg * H + i_h) * 2 + 1, _log_sum_exp_up(fu + (L - tl.cumsum(l, 0)), A))


def reverse_chunk_bound(
    q: Tensor,
    k: Tensor,
    g: Tensor,
    beta: Tensor,
    do: Tensor,
    *,
    scale: float,
    index: ChunkIndex,
    gate_vector: bool,
    v: Tensor | None = None,
) -> tuple[Tensor, Tensor | None]:
    """fp32 `[NT_total, H, 2]`: each chunk's reverse bound summary (L, W) (module docstring, step 2), in flipped chunk
    order (row NT_total - 1 - c holds global chunk c); with v also the forward's (`warm_split.WarmInputs.chunk_bound`,
    chunk order), else None. H: do's (value) heads; q and k may have H / G."""
    B, T, _, K = k.shape
    H, V = do.shape[2], do.shape[3]
    BT = index.chunk_size
    bnd = torch.empty(index.num_chunks, H, 2, dtype=torch.float32, device=k.device)
    fbnd = None if v is None else torch.empty_like(bnd)
    grid = (index.num_chunks, H) if index.is_varlen else (cdiv(T, BT), B * H)
    cu, ci = (index.cu_seqlens, index.chunk_indices) if index.is_varlen else (None, None)
    reverse_chunk_bound_kernel[grid](
        q, k, g, beta, do, v, bnd, fbnd, cu, ci, math.log(scale), T, index.num_chunks,
        H=H, K=K, V=V, BT=BT, BK=min(64, head_block(K)), BV=min(64, head_block(V)), GATE_VECTOR=gate_vector,
        num_warps=4,
    )  # fmt: skip
    return bnd, fbnd


@heuristics({"IS_VARLEN": lambda args: args["cu_seqlens"] is not None})
@triton.jit(do_not_specialize=["T"])
def reverse_chunk_bound_kept_kernel(
    do,  # [B, T, H, V]
    rp,  # [B, T, H] fp32: 0.5 log ||q||^2 + the inclusive in-chunk cumsum of l per token (-inf: q = 0), the forward's
    rla,  # [NT_total, H, 2] fp32: (L rounded up, A = sum of |l|) per chunk, chunk order, the forward's
    bnd,  # out [NT_total, H, 2] fp32: (L, W) of global chunk c at row NT_total - 1 - c (flipped)
    cu_seqlens, chunk_indices, log_scale, T, NT_ALL,
    H: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BV: tl.constexpr, IS_VARLEN: tl.constexpr,
):  # fmt: skip
    i_h, i_tg, bos, o_r, m_r, p_row = _chunk_rows(cu_seqlens, chunk_indices, T, H, BT, IS_VARLEN)
    dd = tl.zeros([BT], dtype=tl.float32)
    for i_v in range(tl.cdiv(V, BV)):
        o_v = i_v * BV + tl.arange(0, BV)
        b_do = tl.load(do + p_row[:, None] * V + o_v[None, :], mask=m_r[:, None] & (o_v < V)[None, :], other=0.0)
        dd += tl.sum(b_do.to(tl.float32) * b_do.to(tl.float32), 1)
    b_p = tl.load(rp + p_row, mask=m_r, other=float("-inf"))
    pos = m_r & (b_p > float("-inf")) & (dd > 0.0)  # a zero write (q = 0, do = 0, past T): -inf (no log of 0)
    e = tl.where(pos, (log_scale + b_p) + 0.5 * tl.log(tl.where(pos, dd, 1.0)), float("-inf"))
    p_c = rla + (i_tg * H + i_h) * 2
    row = (NT_ALL - 1 - i_tg) * H + i_h
    tl.store(bnd + row * 2, tl.load(p_c))
    # rounded up as `_reverse_bound_store` rounds: e is its exponent with the same terms added in another order (the
    # forward's cumsum by 16-row blocks, log scale added here). Each term is at most 88 (log scale), 52 (half the log
    # of an fp32 square norm) or A (the cumsum) in size, so e's three roundings and the cumsum's err by < 4e-5 + 1e-6 A,
    # inside BOUND_MARGIN (A + |W| + 1) >= 1e-4 (1 + A) with the log-sum-exp's own few ulp
    tl.store(bnd + row * 2 + 1, _log_sum_exp_up(e, tl.load(p_c + 1)))


def reverse_chunk_bound_kept(do: Tensor, qk_sums: tuple[Tensor, Tensor], *, scale: float, index: ChunkIndex) -> Tensor:
    """`reverse_chunk_bound`'s reverse sums, fp32 `[NT_total, H, 2]` in flipped chunk order, from do `[B, T, H, V]` and
    the forward's q, k side `qk_sums` (p `[B, T, H]`, (L, A) `[NT_total, H, 2]`: `RevWarmInputs.qk_sums`, module
    docstring step 2); scale: the backward's (that of the gradients the sums bound)."""
    B, T, H, V = do.shape
    BT = index.chunk_size
    rp, rla = qk_sums
    if rp.shape != (B, T, H) or rla.shape != (index.num_chunks, H, 2):
        raise ValueError(
            f"reverse_chunk_bound_kept: the kept sums must be [{B}, {T}, {H}] and [{index.num_chunks}, {H}, 2] for do "
            f"{tuple(do.shape)}, got {tuple(rp.shape)} and {tuple(rla.shape)}"
        )
    bnd = torch.empty(index.num_chunks, H, 2, dtype=torch.float32, device=do.device)
    grid = (index.num_chunks, H) if index.is_varlen else (cdiv(T, BT), B * H)
    cu, ci = (index.cu_seqlens, index.chunk_indices) if index.is_varlen else (None, None)
    reverse_chunk_bound_kept_kernel[grid](
        do, rp, rla, bnd, cu, ci, math.log(scale), T, index.num_chunks,
        H=H, V=V, BT=BT, BV=min(64, head_block(V)), num_warps=4,
    )  # fmt: skip
    return bnd


@dataclass(eq=False)
class RevWindowPlan:
    """The reverse windows of a split's non-first segments, in order (device tensors built once per plan and window).

    layout: program i walks the window of non-first segment i, the first `window_chunks` chunks of the segment (all of
    a shorter last segment). starts / ends: int64 `[NW]`, the windows' chunks [s, e) on the flipped chunk axis; valid:
    bool `[NW]` (all True); reaches_end: bool `[NW]`, the window ends its sequence; seq_ids / seq_last: int64, every
    non-empty sequence and its last chunk on the flipped axis (where dht enters the bound)."""

    window_chunks: int
    layout: SeqLayout
    starts: Tensor
    ends: Tensor
    valid: Tensor
    reaches_end: Tensor
    seq_ids: Tensor
    seq_last: Tensor


def reverse_window_plan(index: ChunkIndex, plan: SplitPlan, window_chunks: int) -> RevWindowPlan | None:
    """The reverse windows of `plan` (None when `window_chunks` is not shorter than a segment, or < 1, or no segment
    follows another). Host lists only; cached in the split plan's `windows` under ("bwd", window_chunks)."""
    key = ("bwd", window_chunks)
    if key in plan.windows:
        return plan.windows[key]
    ptr, bounds, cbounds = plan.seg_ptr_cpu, plan.bounds_cpu, plan.chunk_bounds_cpu
    rest = [s for n in range(plan.num_seqs) for s in range(ptr[n] + 1, ptr[n + 1])]
    if window_chunks < 1 or window_chunks >= plan.seg_chunks or not rest:
        plan.windows[key] = None
        return None
    C, NT = index.chunk_size, index.num_chunks
    last = {ptr[n + 1] - 1 for n in range(plan.num_seqs)}
    pts, cpts, starts, ends, reach = [], [], [], [], []
    for s in rest:
        wc = min(window_chunks, cbounds[s + 1] - cbounds[s])
        pts += [bounds[s], min(bounds[s] + wc * C, bounds[s + 1])]
        cpts += [cbounds[s], cbounds[s] + wc]
        starts.append(NT - cbounds[s] - wc)
        ends.append(NT - cbounds[s])
        reach.append(s in last and cbounds[s] + wc == cbounds[s + 1])
    cu, co = index.cu_seqlens_cpu, index.chunk_offsets_cpu
    live = [n for n in range(index.num_seqs) if cu[n + 1] > cu[n]]
    dev = index.device

    def t(x: list[int], dtype: torch.dtype = torch.int64) -> Tensor:
        return torch.tensor(x, dtype=dtype, device=dev)

    layout = SeqLayout(
        len(pts) - 1, t(pts, torch.int32), t(cpts, torch.int32), seq_map=t(list(range(0, len(pts), 2)), torch.int32)
    )
    wp = RevWindowPlan(
        window_chunks=window_chunks,
        layout=layout,
        starts=t(starts),
        ends=t(ends),
        valid=torch.ones(len(rest), dtype=torch.bool, device=dev),
        reaches_end=torch.tensor(reach, dtype=torch.bool, device=dev),
        seq_ids=t(live),
        seq_last=t([NT - co[n + 1] for n in live]),
    )
    plan.windows[key] = wp
    return wp


def window_chunk_sel(plan: SplitPlan, wp: RevWindowPlan, num_chunks: int) -> tuple[Tensor, Tensor]:
    """(bool `[NT_total]`: the chunks of the reverse windows, int64 `[NT_total]`: each chunk's non-first segment plus
    one, 0 for a first segment's chunk), device tensors from host lists, cached in the plan's `windows` beside `wp`:
    which chunks `warm_segment_ends` reads, the windows always and a non-first segment's all where uncertified
    (`need_chunks`), for passes that form their inputs only there (GDN's reverse walk from the kept Ag)."""
    key = ("bwd_chunks", wp.window_chunks)
    hit = plan.windows.get(key)
    if hit is not None:
        return hit
    cb, ptr = plan.chunk_bounds_cpu, plan.seg_ptr_cpu
    win, seg = [False] * num_chunks, [0] * num_chunks
    rest = [s for n in range(plan.num_seqs) for s in range(ptr[n] + 1, ptr[n + 1])]
    for r, s in enumerate(rest):
        for c in range(cb[s], cb[s + 1]):
            seg[c] = r + 1
        for c in range(cb[s], min(cb[s] + wp.window_chunks, cb[s + 1])):
            win[c] = True
    dev = wp.starts.device
    out = (torch.tensor(win, dtype=torch.bool, device=dev), torch.tensor(seg, dtype=torch.int64, device=dev))
    plan.windows[key] = out
    return out


def need_chunks(need: Tensor, win: Tensor, seg: Tensor) -> Tensor:
    """bool `[NT_total, H]` on the device (no host sync): the chunks of the uncertified (non-first segment, head)
    pairs `need` `[NR, H]` outside the windows (`window_chunk_sel`'s win, seg)."""
    ext = torch.cat([need.new_zeros(1, need.shape[1]), need])
    return ext.index_select(0, seg) & ~win[:, None]


def certify_reverse_windows(
    bnd: Tensor, wp: RevWindowPlan, E_win: Tensor, dht: Tensor | None, tol: float
) -> tuple[Tensor, Tensor]:
    """(certified, not certified), bool `[NW, H]` on the device: the gradient the window drops is provably <= tol of
    the exact one (module doc); the second, the pairs whose exact passes run (from the certify launch itself where
    no end gradient enters, session 32)."""
    ell, log_u = bnd[..., 0], bnd[..., 1]  # fp32 [NT_total, H] views, flipped chunk order
    if dht is not None and wp.seq_ids.numel():
        ell = ell.double()
        log_u = fold_initial_states(ell, log_u.double(), wp.seq_last, wp.seq_ids, dht)
    _, ok, need = certify_chunk_windows(ell, log_u, wp.starts, wp.ends, wp.valid, E_win, tol)
    if dht is None:
        return ok, need
    ok = ok & ~wp.reaches_end[:, None]
    return ok, ~ok


def warm_segment_ends(
    qs: Tensor,
    ks: Tensor,
    w: Tensor,
    u: Tensor,
    gs: Tensor,
    aqk: Tensor,
    do: Tensor,
    *,
    x: RevWarmInputs,
    wp: RevWindowPlan,
    plan: SplitPlan,
    index: ChunkIndex,
    dht: Tensor | None,
    M: Tensor | None,
    bnd: Tensor,
    scale: float,
    gate_vector: bool,
    launch: LaunchPlan | None = None,
    refill: Callable[[Tensor], object] | None = None,
) -> Tensor:
    """The gradient at the end of every segment, fp32 `[NS, H, K, V]` (what `seg_chain_bwd` gives on the exact path),
    by the module docstring's steps 1-4. The arguments are `chunk_bwd._state_pass`'s; M: the forward maps of all
    segments `[NS, H, K, K]` where the caller has them (kept, or computed for the forward recompute), else None (the
    uncertified maps are computed here); bnd: `reverse_chunk_bound`'s reverse sums; refill: called with the
    uncertified pairs `[NR, H]` (a device tensor) before the passes that read w, u, aqk of their whole segments, where
    the caller formed them for the windows only (`window_chunk_sel`)."""
    H, K, V = do.shape[2], ks.shape[3], do.shape[3]
    BT = index.chunk_size
    bwd = {"BT": BT, "gate_vector": gate_vector, "scale": scale, "launch": launch}
    rest, _ = first_segments(plan)
    NR = rest.numel()
    E_win = ks.new_empty(NR, H, K, V, dtype=torch.float32)
    chunk_state_bwd(qs, ks, w, gs, aqk, do, layout=wp.layout, dht=None, ds_out=E_win, **bwd)
    ok, need = certify_reverse_windows(bnd, wp, E_win, dht, x.tol)
    segs = plan.all_segments
    rest_layout = SeqLayout(plan.num_segments, segs.cu_seqlens, segs.chunk_offsets, seq_map=rest)
    if refill is not None:
        refill(need)
    if M is None:
        M, _ = chunk_state_transition_fwd(ks, w, u, gs, layout=rest_layout, BT=BT, gate_vector=gate_vector,
                                          launch=launch, need=need)  # fmt: skip
    ds_ext = torch.empty_like(E_win)  # (the certified pairs' rows: their E_win, stored by the launch)
    chunk_state_bwd(qs, ks, w, gs, aqk, do, layout=rest_layout, dht=None, ds_out=ds_ext, need=need, skipped=E_win, **bwd)
    if x.report is not None:
        x.report["certified"] = ok
    return seg_chain_bwd(M, ds_ext, dht, plan, launch=launch, drop=ok)
