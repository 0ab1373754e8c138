"""Gate-certified warmup in the intra-device split: drop a segment map M where the gates provably forget it.

In the split forward (`kernels.common.seqsplit`) segment s+1 enters with S_{s+1} = M_s S_s + S_ext_s; the
transition pass computes (M_s, S_ext_s) of every non-last segment from zero on the augmented [K, K+V] state, a
serial walk of the whole segment on (K+V)/BV programs per head. When the gates decay, the state entering s+1 is
almost the state E_win that the last `w` chunks of segment s build from zero: S_{s+1} = M_win S_{c-1} + E_win
(c: the window start). Per (non-last segment, head), on the device, no host sync:

1. `chunk_state_final_fwd` walks only the windows (w chunks, V/BV programs per head): E_win.
2. `kernels.common.decay_bound` bounds ||M_win S_{c-1}||_F from the gates, beta and the key and value norms of every
   earlier token (an initial state enters as a write at its sequence's first token); the pair is certified when
   the bound is <= tol/(1+tol) ||E_win||_F, so the dropped part is <= tol ||S_exact||_F (warmup_correct's rule
   and its tol, `kernels.vocabulary.MODE_OPTIONS["warmup_correct"]["tol"]`). The forwards have the WY pass sum the
   bound's per-token terms per chunk (`wy_*_fwd(bnd=...)`, fp32 rounded up: windows are whole chunks, so the
   chunk sums give the same bound), and the certification reads those [NT, H, 2] sums instead of k, v and g, in one
   Triton launch (`kernels.common.warm_certify`; the per-token form, without chunk sums, stays in torch).
3. the transition pass runs with the certified (segment, head) programs masked (`need` per head): they walk no
   chunk and store M = 0 and S_ext = 0; the others compute the exact pair.
4. S_ext = where(certified, E_win, S_ext): the chain (`seg_chain_fwd(drop=certified)`) then takes S_{s+1} = E_win
   where certified (no [K, K] product) and the exact fold elsewhere. Weak gates (some heads of real models) keep the
   exact path.

The window w (`warm_chunks`) is a host constant of the call; it must be shorter than a segment, else the split
runs exactly (`window_plan` returns None). Both forward paths share steps 2-4 (`certified_transitions`, given the
path's two passes as callables): the WY path (`warm_transitions`: `chunk_state_final_fwd`, then
`chunk_state_transition_fwd(need=)`) and GDN's fused path (`kernels.ops.gdn.fused.gdn_fused_fwd`: its
pass in state-only mode over the windows, then its TRANSITION mode with `need`; the Ag pass sums the bound,
`wy_gdn_ag(bnd=, v=)`). `WarmInputs.report` (a dict, optional) receives the device tensor
`certified` [NS - N, H]: read it after the call (tests, benchmarks), never inside a step.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

from kernels.common.chunk_state import SeqLayout, chunk_state_final_fwd, chunk_state_transition_fwd
from kernels.common.decay_bound import log_window_bound, token_terms, window_certified
from kernels.common.index import ChunkIndex
from kernels.common.warm_certify import certify_chunk_windows
from kernels.plan import LaunchPlan
from kernels.vocabulary import MODE_OPTIONS

__all__ = [
    "with_chunk_bound",
    "WARM_CHUNKS",
    "WARM_DEFAULT",
    "WARM_TOL",
    "WarmInputs",
    "WindowPlan",
    "certified_transitions",
    "certify_windows",
    "fold_initial_states",
    "warm_inputs",
    "warm_transitions",
    "window_plan",
]

# the window (chunks of 64 tokens: 128 tokens) of a WarmInputs built without one
WARM_CHUNKS = 2
# the forwards' window per forward path when the caller gives none (`chunk_gdn_fwd(warm_chunks=None)`); 0 = exact
# maps. H200, GDN B=1 (kernels/NOTES.md, "The warm split on the fused path", session 11): the fused path at 4 chunks
# 3.57 -> 2.55 ms at T=128K and 1.01 -> 0.81 ms at 32K; the WY path gained 10 % at 128K only and stays exact
WARM_DEFAULT = {"fused": 4, "wy": 0}
# the relative state error a certified window may leave (warmup_correct's default tol)
WARM_TOL = float(MODE_OPTIONS["warmup_correct"]["tol"])


@dataclass(frozen=True, eq=False)
class WarmInputs:
    """What the certification reads: the op's raw inputs (`[B, T, H, ...]`, as the forward got them), the window in
    chunks, the tolerance and an optional dict that receives `certified` (bool `[NS - N, H]`, device)."""

    op: str
    k: Tensor
    v: Tensor
    g: Tensor
    beta: Tensor
    window_chunks: int = WARM_CHUNKS
    tol: float = WARM_TOL
    report: dict[str, Tensor] | None = None
    chunk_bound: Tensor | None = None  # fp32 [NT_total, H, 2]: the WY pass's (L, W) per chunk; None: read k, v here


def warm_inputs(
    op: str,
    k: Tensor,
    v: Tensor,
    g: Tensor,
    beta: Tensor,
    warm_chunks: int | None,
    *,
    path: str = "wy",
    report: dict[str, Tensor] | None = None,
) -> WarmInputs | None:
    """The forwards' `warm_chunks` (None: WARM_DEFAULT of the forward `path`, "fused" or "wy"; 0: off -> None) as the
    split's WarmInputs (then `with_chunk_bound` for the WY or Ag pass to fill)."""
    chunks = WARM_DEFAULT[path] if warm_chunks is None else warm_chunks
    if isinstance(chunks, bool) or not isinstance(chunks, int) or chunks < 0:
        raise ValueError(f"warm_chunks must be None or an int >= 0, got warm_chunks={warm_chunks!r}")
    if not chunks:
        return None
    return WarmInputs(op, k, v, g, beta, window_chunks=chunks, report=report)


def with_chunk_bound(x: WarmInputs | None, num_chunks: int) -> WarmInputs | None:
    """x with an empty fp32 `[num_chunks, H, 2]` `chunk_bound` for `wy_gdn_fwd(bnd=...)` to fill (None stays None)."""
    if x is None:
        return None
    bnd = torch.empty(num_chunks, x.v.shape[2], 2, dtype=torch.float32, device=x.k.device)
    return dataclasses.replace(x, chunk_bound=bnd)


@dataclass(eq=False)
class WindowPlan:
    """The warmup windows of a split's transitions (device tensors built once per (split plan, window)).

    layout: program i walks the window of transition i, the last `window_chunks` chunks of its segment.
    starts / ends: int64 `[NW]` flat token indices [c, b) of the windows, chunk_starts / chunk_ends their global
    chunk indices; valid: bool `[NW]` (all True: a window starts after its sequence's first token). seq_bos /
    seq_first_chunk / seq_ids: int64, the first token, the first chunk and the index of every non-empty sequence
    (where an initial state enters the bound).
    """

    window_chunks: int
    layout: SeqLayout
    starts: Tensor
    ends: Tensor
    valid: Tensor
    seq_bos: Tensor
    seq_ids: Tensor
    chunk_starts: Tensor
    chunk_ends: Tensor
    seq_first_chunk: Tensor


def window_plan(
    index: ChunkIndex,
    bounds: list[int],
    chunk_bounds: list[int],
    transitions: list[int],
    window_chunks: int,
    *,
    seg_chunks: int,
    cache: dict[int, WindowPlan | None],
) -> WindowPlan | None:
    """The windows of the transitions (segment ids into `bounds`), or None when a window would not be shorter than
    a segment (`window_chunks >= seg_chunks`) or there are no transitions. Host lists only; kept in `cache` (the
    split plan's `windows`) per window length."""
    if window_chunks in cache:
        return cache[window_chunks]
    if window_chunks < 1 or window_chunks >= seg_chunks or not transitions:
        cache[window_chunks] = None
        return None
    C = index.chunk_size
    pts, cpts = [], []
    for s in transitions:  # a non-last segment ends on a chunk boundary and is seg_chunks > window_chunks long
        b, cb = bounds[s + 1], chunk_bounds[s + 1]
        pts += [b - window_chunks * C, b]
        cpts += [cb - window_chunks, cb]
    cu = index.cu_seqlens_cpu
    live = [n for n in range(index.num_seqs) if cu[n + 1] > cu[n]]
    dev = index.device

    def t(x: list[int], dtype: torch.dtype = torch.int64) -> Tensor:
        return torch.tensor(x, dtype=dtype, device=dev)

    nw = len(transitions)
    layout = SeqLayout(
        len(pts) - 1, t(pts, torch.int32), t(cpts, torch.int32), seq_map=t(list(range(0, 2 * nw, 2)), torch.int32)
    )
    co = index.chunk_offsets_cpu
    plan = WindowPlan(
        window_chunks=window_chunks,
        layout=layout,
        starts=t(pts[0::2]),
        ends=t(pts[1::2]),
        valid=torch.ones(nw, dtype=torch.bool, device=dev),
        seq_bos=t([cu[n] for n in live]),
        seq_ids=t(live),
        chunk_starts=t(cpts[0::2]),
        chunk_ends=t(cpts[1::2]),
        seq_first_chunk=t([co[n] for n in live]),
    )
    cache[window_chunks] = plan
    return plan


def certify_windows(x: WarmInputs, wp: WindowPlan, E_win: Tensor, h0: Tensor | None) -> tuple[Tensor, Tensor]:
    """(certified, not certified), bool `[NW, H]` on the device: the window's dropped state is provably <= tol
    ||S_exact||_F (module doc); the second, the pairs whose exact transitions run."""
    B, T = x.k.shape[0], x.k.shape[1]
    if x.chunk_bound is not None:  # per chunk, the same bound from the WY pass's sums (windows are whole chunks):
        # one launch (`kernels.common.warm_certify`) where no initial state enters; k and v not read again
        ell, log_u = x.chunk_bound[..., 0], x.chunk_bound[..., 1]  # fp32 [NT_total, H] views
        if h0 is not None and wp.seq_first_chunk.numel():
            ell = ell.double()
            log_u = fold_initial_states(ell, log_u.double(), wp.seq_first_chunk, wp.seq_ids, h0)
        return certify_chunk_windows(ell, log_u, wp.chunk_starts, wp.chunk_ends, wp.valid, E_win, x.tol)[1:]
    flat = [y.reshape(1, B * T, *y.shape[2:]) for y in (x.k, x.v, x.g, x.beta)]  # per token: one flat token axis
    ell, log_u = token_terms(x.op, *flat)  # fp64 [B*T, H]
    if h0 is not None and wp.seq_bos.numel():
        log_u = fold_initial_states(ell, log_u, wp.seq_bos, wp.seq_ids, h0)
    lb = log_window_bound(ell, log_u, wp.ends, wp.starts, wp.valid)  # [NW, H]
    ok = window_certified(lb, torch.linalg.vector_norm(E_win, dim=(-2, -1)).double().log(), x.tol)
    return ok, ~ok


def fold_initial_states(ell: Tensor, log_u: Tensor, first: Tensor, seq_ids: Tensor, h0: Tensor) -> Tensor:
    """log_u (fp64) with each sequence's initial state as one more write at its first token (chunk) `first`: the
    state after it is A h0 + its writes, ||A h0|| <= exp(l) ||h0||."""
    h0_log = torch.linalg.vector_norm(h0.index_select(0, seq_ids), dim=(-2, -1)).double().log()
    at = log_u.index_select(0, first)
    return log_u.index_copy(0, first, torch.logaddexp(at, ell.index_select(0, first) + h0_log))


# (window layout) -> E_win fp32 `[NW, H, K, V]`: each window's state from zero (step 1)
WindowStates = Callable[[SeqLayout], Tensor]
# (need: bool `[NW, H]`, E_win) -> (M, S_ext) of the transitions, the pairs whose flag is False walking nothing and
# storing M = 0, S_ext = their E_win (step 3; in the launch since session 32: no torch `where` after it)
MaskedTransitions = Callable[[Tensor, Tensor], tuple[Tensor, Tensor]]


def certified_transitions(
    x: WarmInputs, wp: WindowPlan, h0: Tensor | None, *, window_states: WindowStates, masked_transitions: MaskedTransitions
) -> tuple[Tensor, Tensor, Tensor]:
    """(M, S_ext, certified) of the split's transitions from a forward path's two passes (steps 1-4 of the module doc):
    M = 0 and S_ext = E_win for the certified (segment, head) pairs (bool `[NW, H]`), the exact pair elsewhere."""
    E_win = window_states(wp.layout)
    ok, need = certify_windows(x, wp, E_win, h0)
    M, S_ext = masked_transitions(need, E_win)
    if x.report is not None:
        x.report["certified"] = ok
    return M, S_ext, ok


def warm_transitions(
    k: Tensor,
    w: Tensor,
    u: Tensor,
    g: Tensor,
    *,
    transitions: SeqLayout,
    wp: WindowPlan,
    BT: int,
    gate_vector: bool,
    x: WarmInputs,
    h0: Tensor | None,
    launch: LaunchPlan | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """(M, S_ext, certified) of the split's transitions on the WY path's passes (`certified_transitions`; the certified
    pairs' serial walks are skipped, `seg_chain_fwd(drop=certified)` then skips their products too)."""
    pass_args = {"BT": BT, "gate_vector": gate_vector, "launch": launch}
    return certified_transitions(
        x,
        wp,
        h0,
        window_states=lambda layout: chunk_state_final_fwd(k, w, u, g, layout=layout, **pass_args),
        masked_transitions=lambda need, E_win: chunk_state_transition_fwd(
            k, w, u, g, layout=transitions, need=need, skipped=E_win, **pass_args
        ),
    )
