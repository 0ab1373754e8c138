"""Intra-device sequence parallelism with EXACT maps: split long pieces into sub-segments and chain their maps.

A piece (a sequence, or the part of one that a rank holds) longer than `seg_len` is cut into sub-segments
of `seg_len` tokens (a multiple of the chunk size). One varlen `transition` call gives every needed
sub-segment's affine map (M_j, E_j); a serial chain over sub-segment positions, batched over pieces and
heads (one `baddbmm` per position), gives every sub-segment's entering state

    X_0 = [I | 0],   X_{j+1} = M_j X_j + [0 | E_j]       (X_j = [Mp_j | Ep_j], the map of sub-segments < j)
    S0_j = Mp_j h0 + Ep_j                                 (h0: the piece's entering state, 0 if it starts here)

and the piece's total map X_n (what a CP rank all-gathers). Then one varlen forward over all sub-segments
runs with those initial states, every (sub-segment, head) chain in parallel. Exact in fp32 (no truncation).
Without an entering state and without a needed total the chain runs on the V columns only.

All structure is host metadata (`build_plan`, cached); a step launches a fixed sequence of kernels and
reads no device value.
"""

from __future__ import annotations

import functools
import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor

from kernels.configs import cdiv
from kernels.cp import prims
from kernels.plan import LaunchPlan

__all__ = ["CHUNK", "PieceSpec", "SplitPlan", "auto_segment_len", "build_plan", "chain_states", "initial_states", "totals"]

logger = logging.getLogger(__name__)

CHUNK = 64  # the kernels' chunk size: sub-segments are cut at multiples of it


@dataclass(frozen=True)
class PieceSpec:
    """A piece of the local token axis: [start, end); `cont`: gets an entering state; `carries`: its total map is needed."""

    start: int
    end: int
    cont: bool = False
    carries: bool = False


@dataclass(frozen=True)
class Run:
    """One transition call: tokens [start, end) of the local axis, cut at `bounds` (rebased to start at 0)."""

    start: int
    end: int
    bounds: tuple[int, ...]


@dataclass(frozen=True, eq=False)
class SplitPlan:
    """Host plan of a split + exact chain (see the module docstring). Index tensors are cached per device."""

    sub_bounds: tuple[int, ...]            # forward bounds over the local axis (all sub-segments of all pieces)
    piece_first_sub: tuple[int, ...]
    piece_nsub: tuple[int, ...]
    chain: tuple[int, ...]                 # pieces that need the chain, in token order (chain position = index here)
    with_m: bool                           # chain carries the M columns (an entering state or a total is needed)
    steps: int                             # chain length: max maps over chain pieces
    num_maps: int
    map_pos: tuple[int, ...]               # padded position j*n + i of each map (maps in token order)
    runs: tuple[Run, ...]
    select: tuple[int, ...] | None         # rows of the concatenated run outputs that are maps (None: all, in order)
    state_subs: tuple[int, ...]            # sub-segments whose entering state comes from the chain
    state_pos: tuple[int, ...]             # their padded X position
    state_chain: tuple[int, ...]           # their chain position
    total_pos: tuple[int | None, ...]      # per chain position: padded X position of the total (None unless carries)
    _dev: dict[tuple[str, str], Tensor] = field(default_factory=dict, repr=False, compare=False)

    @property
    def num_subs(self) -> int:
        return len(self.sub_bounds) - 1

    def index(self, name: str, device: torch.device) -> Tensor:
        key = (name, str(device))
        t = self._dev.get(key)
        if t is None:
            t = torch.tensor(getattr(self, name), dtype=torch.int64, device=device)
            self._dev[key] = t
        return t


def auto_segment_len(lengths: Sequence[int], H: int, device: torch.device) -> int | None:
    """Sub-segment length for intra-device splitting, or None for no split (CPU, or nothing long enough).

    FlashQLA's rule of thumb (anchors/cp-schemes.md §1.3): serial length L* ~ 3 sqrt(H n_chunks / SM) chunks,
    rounded to a power of two, at least 8 chunks; a sequence is split only if it is at least twice that.
    """
    if device.type != "cuda" or not lengths:
        return None
    from kernels.common.seqsplit import device_sms  # (imports Triton: not at this module's import)

    sm = device_sms(device)
    n_chunks = sum(cdiv(n, CHUNK) for n in lengths)
    L = 3.0 * math.sqrt(H * n_chunks / sm)
    L = max(8, 2 ** round(math.log2(max(L, 1.0))))
    seg = L * CHUNK
    return seg if max(lengths) >= 2 * seg else None


@functools.lru_cache(maxsize=512)
def build_plan(pieces: tuple[PieceSpec, ...], seg_len: int | None) -> SplitPlan:
    """The cached plan for pieces (contiguous, in token order, covering the local axis) and a sub-segment length."""
    if seg_len is not None and (seg_len < CHUNK or seg_len % CHUNK):
        raise ValueError(f"segment length must be a positive multiple of {CHUNK}, got {seg_len}")
    sub_bounds = [pieces[0].start] if pieces else [0]
    first, nsub = [], []
    for p in pieces:
        n = p.end - p.start
        cnt = 1 if seg_len is None or n <= seg_len else cdiv(n, seg_len)
        first.append(len(sub_bounds) - 1)
        nsub.append(cnt)
        sub_bounds.extend(min(p.start + (j + 1) * (seg_len or n), p.end) for j in range(cnt))
    chain = tuple(i for i, p in enumerate(pieces) if nsub[i] > 1 or p.cont or p.carries)
    with_m = any(pieces[i].cont or pieces[i].carries for i in chain)
    n = len(chain)
    nmaps = [nsub[i] - 1 + int(pieces[i].carries) for i in chain]
    steps = max(nmaps, default=0)
    map_subs, map_pos = [], []
    state_subs, state_pos, state_chain = [], [], []
    total_pos: list[int | None] = []
    for c, i in enumerate(chain):
        for j in range(nmaps[c]):
            map_subs.append(first[i] + j)
            map_pos.append(j * n + c)
        for j in range(nsub[i]):
            state_subs.append(first[i] + j)
            state_pos.append(j * n + c)
            state_chain.append(c)
        total_pos.append(nmaps[c] * n + c if pieces[i].carries else None)
    runs, select = _runs(tuple(sub_bounds), map_subs)
    return SplitPlan(sub_bounds=tuple(sub_bounds), piece_first_sub=tuple(first), piece_nsub=tuple(nsub), chain=chain,
                     with_m=with_m, steps=steps, num_maps=len(map_subs), map_pos=tuple(map_pos), runs=runs, select=select,
                     state_subs=tuple(state_subs), state_pos=tuple(state_pos), state_chain=tuple(state_chain),
                     total_pos=tuple(total_pos))


def _runs(sub_bounds: tuple[int, ...], map_subs: list[int]) -> tuple[tuple[Run, ...], tuple[int, ...] | None]:
    """Group the needed sub-segments into transition calls; a gap is bridged (computed, discarded) when it is small."""
    groups: list[list[int]] = []
    for s in map_subs:
        if groups and groups[-1][-1] == s - 1:
            groups[-1].append(s)
        else:
            groups.append([s])
    merged: list[list[int]] = []   # runs as lists of sub indices including bridged gaps
    for grp in groups:
        if merged:
            prev = merged[-1]
            gap = sub_bounds[grp[0]] - sub_bounds[prev[-1] + 1]
            need = sum(sub_bounds[s + 1] - sub_bounds[s] for s in prev + grp)
            if gap <= max(CHUNK, need // 4):
                merged[-1] = prev + list(range(prev[-1] + 1, grp[-1] + 1))
                continue
        merged.append(list(grp))
    runs, rows, select, row = [], set(map_subs), [], 0
    for m in merged:
        a, b = sub_bounds[m[0]], sub_bounds[m[-1] + 1]
        bounds = (0, *(sub_bounds[s + 1] - a for s in m))
        runs.append(Run(a, b, bounds))
        for s in m:
            if s in rows:
                select.append(row)
            row += 1
    return tuple(runs), (None if row == len(map_subs) else tuple(select))


def chain_states(op: str, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, plan: SplitPlan, *, backend: str,
                 launch: LaunchPlan) -> Tensor | None:
    """The chain buffer X `[steps+1, n, H, K, K+V or V]` (fp32) of a plan, or None if no piece needs the chain."""
    n = len(plan.chain)
    if n == 0:
        return None
    H, K, V = v.shape[2], k.shape[3], v.shape[3]
    dev = k.device
    Cw = K + V if plan.with_m else V
    X = torch.empty(plan.steps + 1, n, H, K, Cw, dtype=torch.float32, device=dev)
    if plan.with_m:
        X[0, ..., K:].zero_()
        X[0, ..., :K].copy_(torch.eye(K, dtype=torch.float32, device=dev))
    else:
        X[0].zero_()
    if plan.steps == 0:
        return X
    Ms, Es = [], []
    for r in plan.runs:
        M, E = prims.trans(op, k[:, r.start:r.end], v[:, r.start:r.end], g[:, r.start:r.end], beta[:, r.start:r.end],
                           r.bounds, backend=backend, launch=launch)
        Ms.append(M)
        Es.append(E)
    M = Ms[0] if len(Ms) == 1 else torch.cat(Ms, 0)
    E = Es[0] if len(Es) == 1 else torch.cat(Es, 0)
    if plan.select is not None:
        sel = plan.index("select", dev)
        M, E = M.index_select(0, sel), E.index_select(0, sel)
    S = plan.steps
    dense = plan.num_maps == S * n and plan.map_pos == tuple(range(S * n))
    if dense:
        A = M.reshape(S * n, H, K, K)
    else:
        A = M.new_zeros(S * n, H, K, K)
        A.index_copy_(0, plan.index("map_pos", dev), M)
    if plan.with_m or not dense:
        B = M.new_zeros(S * n, H, K, Cw)
        B[..., Cw - V:].index_copy_(0, plan.index("map_pos", dev), E)
    else:
        B = E.reshape(S * n, H, K, V)
    A = A.view(S, n * H, K, K)
    B = B.view(S, n * H, K, Cw)
    Xf = X.view(S + 1, n * H, K, Cw)
    for j in range(S):
        torch.baddbmm(B[j], A[j], Xf[j], out=Xf[j + 1])
    return X


def initial_states(plan: SplitPlan, X: Tensor | None, h0: Tensor | None, *, H: int, K: int, V: int,
                   device: torch.device) -> Tensor | None:
    """Entering states `[num_subs, H, K, V]` fp32 of every sub-segment (None when all are zero).

    h0: `[n_chain, H, K, V]` entering state per chain position (zeros for pieces that start here), or None.
    """
    if X is None:
        return None
    Cw = X.shape[-1]
    rows = X.view(-1, H, K, Cw).index_select(0, plan.index("state_pos", device))
    if plan.with_m:
        S0 = rows[..., K:]
        if h0 is not None:
            S0 = torch.matmul(rows[..., :K], h0.index_select(0, plan.index("state_chain", device))) + S0
    else:
        S0 = rows
    if plan.state_subs == tuple(range(plan.num_subs)):
        return S0.contiguous()
    out = torch.zeros(plan.num_subs, H, K, V, dtype=torch.float32, device=device)
    out.index_copy_(0, plan.index("state_subs", device), S0)
    return out


def totals(plan: SplitPlan, X: Tensor, chain_pos: int) -> Tensor:
    """The total map `[H, K, K+V]` = [M | S_ext] of a carrying chain piece (a view into X)."""
    pos = plan.total_pos[chain_pos]
    if pos is None or not plan.with_m:
        raise ValueError(f"chain position {chain_pos} does not carry a total")
    H, K, Cw = X.shape[2], X.shape[3], X.shape[4]
    return X.view(-1, H, K, Cw)[pos]


def resolve_segment_len(segment_len: int | str | None, lengths: Sequence[int], H: int, device: torch.device) -> int | None:
    """An option value `None` (no split), `"auto"` (`auto_segment_len`) or an int (rounded up to a chunk multiple)."""
    if segment_len is None:
        return None
    if segment_len == "auto":
        return auto_segment_len(lengths, H, device)
    if isinstance(segment_len, bool) or not isinstance(segment_len, int) or segment_len < 1:
        raise ValueError(f"segment_len must be None, 'auto' or an int >= 1, got segment_len={segment_len!r}")
    return cdiv(segment_len, CHUNK) * CHUNK


def split_forward(op: str, q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, bounds: tuple[int, ...], *,
                  seg_len: int | None, backend: str, launch: LaunchPlan, scale: float | None) -> Tensor:
    """Forward of independent sequences (`bounds`, all entering with zeros), exactly split into sub-segments."""
    if seg_len is None or max(b - a for a, b in zip(bounds[:-1], bounds[1:], strict=True)) <= seg_len:
        return prims.fwd(op, q, k, v, g, beta, bounds, backend=backend, launch=launch, scale=scale)[0]
    plan = build_plan(tuple(PieceSpec(a, b) for a, b in zip(bounds[:-1], bounds[1:], strict=True)), seg_len)
    X = chain_states(op, k, v, g, beta, plan, backend=backend, launch=launch)
    S0 = initial_states(plan, X, None, H=v.shape[2], K=k.shape[3], V=v.shape[3], device=k.device)
    return prims.fwd(op, q, k, v, g, beta, plan.sub_bounds, h0=S0, backend=backend, launch=launch, scale=scale)[0]
