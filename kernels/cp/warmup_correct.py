"""warmup_correct: FlashKDA's intra-device CP on one device, with a rigorous bound and no host sync.

Every sequence longer than a segment is cut into segments (one varlen batch). A segment's entering state
is the previous segment's end state. `kernels.common.decay_bound` bounds, per (segment, head) and from the
gates on the device, the state that a warmup window (the last `window` chunks of the previous segment)
drops; a segment is good when that bound is <= `tol` times the state norm for every head. `fallback`
(host-visible, chosen per call) says what happens to the segments that are not good:

- `"auto"` (default): decided PER SEGMENT on the device. Good segments take their entering state from the
  window alone (E_win); for failing ones the exact map (M, S_ext) of the whole previous segment comes from
  one masked `transition` (`need` = the failing segments' predecessors: on the triton backend the kernels
  skip the WY prep and the serial pass of every other segment, so M costs only where it is needed). Both
  are combined branch-free as one affine chain per sequence, S0[i+1] = A[i] S0[i] + B[i] with A[i] = M[i]
  (zeros where not needed) and B[i] = where(fail[i+1], S_ext[i], E_win[i+1]): one `seg_chain` kernel
  launch on the triton backend, one `baddbmm` per segment position on torch.
- `"exact"`: exact maps of every segment and the serial correction (`kernels.cp.intra`), exact in fp32
  (the cost of exact intra-device CP); `fallback_count` says how many segments needed M at this window.
- `"none"` (FlashKDA's scheme): windows only, no M; `violations` counts the failing segments left on the
  warmup estimate: the result is certified within `tol` exactly when `violations == 0`.

Then one varlen forward over all segments runs from the corrected states. No `.item()`, no Python branch
on a device value: the report holds device tensors; `report.to_dict()` reads them (call it after timing).

Training: with inputs that require grad the output carries the gradient of the function the step computes
(`_backward`: the fallback decisions held fixed; the chain of exact links run backwards with M^T, the
windows' backward for the warmup links), through `kernels.cp.step_grad`. Its error against the exact
gradient is measured by the engine like the forward's.
"""

from __future__ import annotations

import functools
import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from kernels.backends import resolve_backend
from kernels.common.decay_bound import log_span_bound, log_window_bound, token_terms, window_certified
from kernels.configs import cdiv
from kernels.cp import intra, prims, step_grad
from kernels.cp.context import host_bounds
from kernels.dispatch import needs_grad
from kernels.plan import LaunchPlan, default_plan
from kernels.vocabulary import MODE_OPTIONS

__all__ = ["FALLBACKS", "WarmupPlan", "WarmupReport", "warmup_correct"]

logger = logging.getLogger(__name__)

FALLBACKS: tuple[str, ...] = ("auto", "exact", "none")
DEFAULT_TOL = MODE_OPTIONS["warmup_correct"]["tol"]
DEFAULT_WINDOW_CHUNKS = 2


@dataclass(frozen=True, eq=False)
class WarmupPlan:
    """Host plan of one call shape: segments, windows, index tensors (cached per device)."""

    cu_seqlens: tuple[int, ...]
    seg_len: int | None
    window_chunks: int
    bounds: tuple[int, ...]          # segment bounds (the forward's varlen batch)
    first: tuple[bool, ...]          # per segment: first of its sequence (enters with a zero state)
    win_start: tuple[int, ...]       # per segment: window start c in the PREVIOUS segment (0 for first segments)
    win_end: tuple[int, ...]         # per segment: window end b = segment start (0 for first segments)
    seq_start: tuple[int, ...]       # per segment: start of its sequence
    win_rows: tuple[int, ...]        # segments that get a warmup state (not first), in order
    win_bounds: tuple[int, ...]      # bounds of the gathered windows
    _dev: dict[tuple[str, str], Tensor] = field(default_factory=dict, repr=False, compare=False)

    @property
    def num_segments(self) -> int:
        return len(self.bounds) - 1

    @property
    def window_tokens(self) -> tuple[int, ...]:
        return tuple(b - c for c, b in zip(self.win_start, self.win_end, strict=True))

    def index(self, name: str, device: torch.device) -> Tensor:
        key = (name, str(device))
        t = self._dev.get(key)
        if t is None:
            if name == "gather":
                vals = [t for r in self.win_rows for t in range(self.win_start[r], self.win_end[r])]
            elif name == "prev_start":                    # the previous segment of each win row: [start, end)
                vals = [self.bounds[r - 1] for r in self.win_rows]
            elif name == "prev_end":
                vals = [self.bounds[r] for r in self.win_rows]
            elif name == "prev_rows":
                vals = [r - 1 for r in self.win_rows]
            elif name in ("map_pos", "state_pos"):
                vals = list(self.chain_layout[1 if name == "map_pos" else 2])
            elif name == "valid":
                vals = [self.win_start[r] > self.seq_start[r] for r in self.win_rows]
            elif name == "seg_ptr":                       # sequence n owns segments [seg_ptr[n], seg_ptr[n+1])
                vals = [i for i, f in enumerate(self.first) if f] + [self.num_segments]
            else:
                vals = [getattr(self, name)[r] for r in self.win_rows] if name in ("win_start", "win_end") else \
                    list(getattr(self, name))
            dtype = torch.bool if name == "valid" else torch.int32 if name == "seg_ptr" else torch.int64
            t = torch.tensor(vals, dtype=dtype, device=device)
            self._dev[key] = t
        return t

    @functools.cached_property
    def chain_layout(self) -> tuple[tuple[int, int], tuple[int, ...], tuple[int, ...]]:
        """Padded layout of the per-sequence chain of `"auto"`: ((steps, n), map position, state position) per win row.

        n = split sequences; the segment at position j >= 1 of split sequence c has its predecessor's map at
        padded position (j-1) n + c and its entering state at X position j n + c (X[0] = 0).
        """
        pos_in_seq, seq_of = [], []
        c = -1
        for f in self.first:
            if f:
                j = 0
            else:
                j += 1
                if j == 1:
                    c += 1
            pos_in_seq.append(j)
            seq_of.append(c)
        n = c + 1
        steps = max(pos_in_seq, default=0)
        maps = tuple((pos_in_seq[r] - 1) * n + seq_of[r] for r in self.win_rows)
        states = tuple(pos_in_seq[r] * n + seq_of[r] for r in self.win_rows)
        return (steps, n), maps, states

    def pieces(self) -> tuple[intra.PieceSpec, ...]:
        cu = self.cu_seqlens
        return tuple(intra.PieceSpec(a, b) for a, b in zip(cu[:-1], cu[1:], strict=True))


@functools.lru_cache(maxsize=256)
def _plan(cu: tuple[int, ...], seg_len: int | None, window_chunks: int) -> WarmupPlan:
    bounds, first, ws, we, ss = [0], [], [], [], []
    for a, b in zip(cu[:-1], cu[1:], strict=True):
        n = b - a
        cnt = 1 if seg_len is None or n <= seg_len else cdiv(n, seg_len)
        step = seg_len if seg_len is not None else n
        for j in range(cnt):
            s0, s1 = a + j * step, min(a + (j + 1) * step, b)
            bounds.append(s1)
            first.append(j == 0)
            ss.append(a)
            if j == 0:
                ws.append(0)
                we.append(0)
            else:
                prev0 = a + (j - 1) * step
                ws.append(max(prev0, s0 - window_chunks * intra.CHUNK))
                we.append(s0)
    rows = tuple(i for i, f in enumerate(first) if not f)
    wb = [0]
    for r in rows:
        wb.append(wb[-1] + we[r] - ws[r])
    return WarmupPlan(cu_seqlens=cu, seg_len=seg_len, window_chunks=window_chunks, bounds=tuple(bounds), first=tuple(first),
                      win_start=tuple(ws), win_end=tuple(we), seq_start=tuple(ss), win_rows=rows, win_bounds=tuple(wb))


@dataclass(eq=False)
class WarmupReport:
    """What warmup_correct did. Host fields are plain values; device fields are tensors (read them after timing).

    Per segment s (the forward's varlen sequences, `segment_bounds`): `window[s]` tokens of the previous
    segment build its warmup estimate (0: first segment of a sequence, entering with zeros); `log_bound[s, h]`
    the log of the bound on the state that window drops; `ok[s, h]` whether bound <= tol * ||state||_F;
    `fell_back[s]` whether the segment took the exact map of its whole previous segment instead of the
    window (`"auto"`: the failing segments; `"exact"`: every non-first segment; `"none"`: never);
    `state_err_bound[s, h]` a bound on ||S0_used - S0_exact||_F (0 for `"exact"`).
    """

    tol: float
    fallback: str
    window_chunks: int
    segment_bounds: tuple[int, ...]
    window: tuple[int, ...]
    log_bound: Tensor              # fp64 [S, H]
    ok: Tensor                     # bool [S, H]
    fallback_count: Tensor         # int64 []: segments where some head fails the bound at this window
    violations: Tensor             # int64 []: failing segments left on the warmup estimate ("none"), else 0
    state_err_bound: Tensor        # fp64 [S, H]
    initial_states: Tensor | None  # fp32 [S, H, K, V]
    fell_back: Tensor | None = None  # bool [S]

    @property
    def num_segments(self) -> int:
        return len(self.segment_bounds) - 1

    def to_dict(self) -> dict[str, Any]:
        """Host copy of the report (reads device values: call after the timed region)."""
        lb = self.log_bound.max().item() if self.log_bound.numel() else float("-inf")
        err = self.state_err_bound.max().item() if self.state_err_bound.numel() else 0.0
        fell = [] if self.fell_back is None else torch.nonzero(self.fell_back.cpu()).flatten().tolist()
        return {
            "tol": self.tol, "fallback": self.fallback, "window_chunks": self.window_chunks,
            "segments": self.num_segments, "segment_bounds": list(self.segment_bounds), "window": list(self.window),
            "max_bound": math.exp(lb) if lb > -math.inf else 0.0, "fallback_count": int(self.fallback_count.item()),
            "fallback_segments": fell, "violations": int(self.violations.item()), "max_state_err_bound": err,
        }


def _seg_len(segments: int | str, cu: tuple[int, ...], H: int, device: torch.device) -> int | None:
    lengths = [b - a for a, b in zip(cu[:-1], cu[1:], strict=True)]
    longest = max(lengths)
    if segments == "auto":
        if device.type == "cuda":
            return intra.auto_segment_len(lengths, H, device)
        segments = 4
    if isinstance(segments, bool) or not isinstance(segments, int) or segments < 1:
        raise ValueError(f"segments must be 'auto' or an int >= 1, got segments={segments!r}")
    if segments == 1:
        return None
    seg = cdiv(longest, segments * intra.CHUNK) * intra.CHUNK
    return seg if seg < longest else None


def warmup_correct(
    op: str,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    g: Tensor,
    beta: Tensor,
    *,
    cu_seqlens: Tensor | Sequence[int],
    segments: int | str = "auto",
    tol: float = DEFAULT_TOL,
    backend: str = "auto",
    scale: float | None = None,
    window: int | str = "auto",
    fallback: str = "auto",
    plan: LaunchPlan | None = None,
) -> tuple[Tensor, WarmupReport]:
    """Intra-device CP forward of a B = 1 varlen batch on one device: segments, warmup/correction, one varlen forward.

    Args:
        op (str):
            `"gdn"` or `"kda"`.
        q, k, v, g, beta (torch.Tensor):
            `[1, T, H, K]`, `[1, T, H, K]`, `[1, T, HV, V]`, `[1, T, HV]` (gdn) or `[1, T, HV, K]` (kda), `[1, T, HV]`
            (grouped value heads: HV a multiple of H, query/key head `h // (HV / H)` serves value head h).
        cu_seqlens (torch.Tensor | Sequence[int]):
            host bounds `[N+1]` (a CUDA tensor is refused: reading it would sync).
        segments (int | str):
            number of segments of the longest sequence (every sequence is cut at the same segment length), or
            `"auto"` (CUDA: from the SM count and H; CPU: 4). Default: `"auto"`.
        tol (float):
            bound on the relative error of every warmup-built entering state, ||dS||_F <= tol ||S||_F per head,
            0 < tol < 1. Default: `1e-3`.
        backend (str):
            primitive backend (`"auto"`: triton on CUDA, torch elsewhere). Default: `"auto"`.
        scale (float | None):
            output scale. Default: `None` (K ** -0.5).
        window (int | str):
            warmup chunks (of 64 tokens) per segment, or `"auto"` (2). Default: `"auto"`.
        fallback (str):
            `"auto"` (per segment, on the device: the window where the bound holds, the exact map of the whole
            previous segment where it does not; `violations` = 0), `"exact"` (exact M for every segment: the
            cost of exact intra-device CP) or `"none"` (warmup only: certified iff `report.violations == 0`).
            Default: `"auto"`.
        plan (LaunchPlan | None):
            the launch plan of the primitives (`kernels.plan`; kept for the backward). Default: `None`
            (`kernels.default_plan()`).

    Returns:
        o (torch.Tensor): `[1, T, HV, V]` in q's dtype.
        report (WarmupReport): see its docstring.
    """
    cu = host_bounds(cu_seqlens)
    if len(cu) < 2 or cu[0] != 0 or any(b <= a for a, b in zip(cu[:-1], cu[1:], strict=True)):
        raise ValueError(f"cu_seqlens must be strictly increasing from 0 with >= 2 entries, got cu_seqlens={list(cu)}")
    if not isinstance(q, Tensor) or q.dim() != 4 or q.shape[0] != 1 or q.shape[1] != cu[-1]:
        shape = tuple(q.shape) if isinstance(q, Tensor) else type(q).__name__
        raise ValueError(f"q must be [1, T, H, K] with T = cu_seqlens[-1] = {cu[-1]}, got q.shape={shape}")
    if isinstance(tol, bool) or not isinstance(tol, (int, float)) or not 0.0 < tol < 1.0:
        raise ValueError(f"tol must be a float in (0, 1), got tol={tol!r}")
    if fallback not in FALLBACKS:
        raise ValueError(f"fallback must be one of {FALLBACKS}, got fallback={fallback!r}")
    if window == "auto":
        window = DEFAULT_WINDOW_CHUNKS
    if isinstance(window, bool) or not isinstance(window, int) or window < 1:
        raise ValueError(f"window must be 'auto' or an int >= 1 (chunks of {intra.CHUNK} tokens), got window={window!r}")
    if v.dim() != 4 or v.shape[2] % q.shape[2]:
        raise ValueError(f"v.shape[2] (value heads HV) must be a multiple of q.shape[2]={q.shape[2]}, "
                         f"got v.shape={tuple(v.shape)}")
    group_size = v.shape[2] // q.shape[2]
    if group_size > 1 and resolve_backend(backend, q.device) != "triton":
        # grouped value heads on torch: every step runs on HV heads (autograd sums each q/k head's G grads); triton's
        # primitives take them as they are (the kernels read the shared q/k head)
        q, k = q.repeat_interleave(group_size, dim=2), k.repeat_interleave(group_size, dim=2)
    launch = plan if plan is not None else default_plan()  # one plan for the forward and its backward
    if needs_grad(q, k, v, g, beta):
        out: dict[str, Any] = {}
        o = step_grad.apply(_Train, q, k, v, g, beta, op=op, group=None, ctx=None, backend=backend, launch=launch,
                            scale=scale, options={"cu": cu, "segments": segments, "tol": tol, "window": window,
                                                  "fallback": fallback, "out": out})
        return o, out["report"]
    o, report, _ = _run(op, q, k, v, g, beta, cu, segments, tol, backend, scale, window, fallback, launch)
    return o, report


def _run(op: str, q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, cu: tuple[int, ...], segments: Any,
         tol: float, backend: str, scale: float | None, window: int, fallback: str,
         launch: LaunchPlan | None = None) -> tuple[Tensor, WarmupReport, Any]:
    """The checked step: (o, report, (plan, S0, fell_back)) for the backward; launch: the launch plan (None: the
    default plan)."""
    launch = launch if launch is not None else default_plan()
    H, K, V = v.shape[2], k.shape[3], v.shape[3]
    dev = k.device
    plan = _plan(cu, _seg_len(segments, cu, H, dev), window)
    nseg = plan.num_segments
    ell, log_u = token_terms(op, k, v, g, beta)
    rows = plan.index("win_rows", dev)
    lb = log_window_bound(ell, log_u, plan.index("win_end", dev), plan.index("win_start", dev), plan.index("valid", dev))
    fell_rows = None
    if fallback == "exact":
        S0, ref_log = _exact_states(op, k, v, g, beta, plan, backend=backend, launch=launch, H=H, K=K, V=V)
        ok_rows = lb <= ref_log + math.log(tol)
    else:
        E_win, ref_log = _window_maps(op, k, v, g, beta, plan, backend=backend, launch=launch, H=H)
        ok_rows = window_certified(lb, ref_log, tol)
        if fallback == "none":
            S0 = _scatter(plan, E_win, H=H, K=K, V=V, device=dev)
        else:
            fell_rows = (~ok_rows).any(1)
            S0 = _auto_states(op, k, v, g, beta, plan, E_win, fell_rows, backend=backend, launch=launch, H=H, K=K, V=V)
    log_bound = torch.full((nseg, H), float("-inf"), dtype=torch.float64, device=dev)
    ok = torch.ones(nseg, H, dtype=torch.bool, device=dev)
    fell_back = torch.zeros(nseg, dtype=torch.bool, device=dev)
    if plan.win_rows:
        log_bound.index_copy_(0, rows, lb)
        ok.index_copy_(0, rows, ok_rows)
        if fallback == "exact":
            fell_back.index_fill_(0, rows, True)
        elif fell_rows is not None:
            fell_back.index_copy_(0, rows, fell_rows)
    failed = (~ok).any(1).sum()
    zero = torch.zeros((), dtype=torch.int64, device=dev)
    if fallback == "none":
        err, violations = log_bound.exp(), failed
    elif fallback == "exact":
        err, violations = torch.zeros_like(log_bound), zero
    else:
        err, violations = _auto_err_bound(plan, ell, log_bound, fell_back, device=dev).exp(), zero
    o, _ = prims.fwd(op, q, k, v, g, beta, plan.bounds, h0=S0, backend=backend, launch=launch, scale=scale)
    report = WarmupReport(tol=float(tol), fallback=fallback, window_chunks=window, segment_bounds=plan.bounds,
                          window=plan.window_tokens, log_bound=log_bound, ok=ok, fallback_count=failed,
                          violations=violations, state_err_bound=err, initial_states=S0, fell_back=fell_back)
    return o, report, (plan, S0, fell_back)


class _Train:
    """The step_grad protocol for warmup_correct (one device; `options` carries the checked call arguments)."""

    @staticmethod
    def forward_saved(op: str, q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, *, group: Any, ctx: Any,
                      backend: str, launch: LaunchPlan, scale: float | None,
                      options: dict[str, Any]) -> tuple[Tensor, Any]:
        o, report, saved = _run(op, q, k, v, g, beta, options["cu"], options["segments"], options["tol"], backend,
                                scale, options["window"], options["fallback"], launch)
        options["out"]["report"] = report
        return o, saved

    @staticmethod
    def backward_saved(op: str, q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, do: Tensor, saved: Any, *,
                       group: Any, ctx: Any, backend: str, launch: LaunchPlan, scale: float | None,
                       options: dict[str, Any]) -> tuple[Tensor, ...]:
        return _backward(op, q, k, v, g, beta, do, saved, backend=backend, launch=launch, scale=scale,
                         fallback=options["fallback"])


def _backward(op: str, q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, do: Tensor, saved: Any, *,
              backend: str, launch: LaunchPlan, scale: float | None, fallback: str) -> tuple[Tensor, ...]:
    """The gradient of the function the step computes (README §7), with a[r] = fell_back[r] held fixed:

        S0[r] = a[r] ht[r-1] + (1 - a[r]) E_win[r]          (ht[r-1]: segment r-1's final state, run from S0[r-1])

    1. G[r], the gradient of S0[r] from segment r's own outputs (dht = 0): under fallback "none" the dh0 of the one
       varlen backward; otherwise the state gradient alone (`prims.state_grad`: on triton the WY prep and the reverse
       state pass, not a whole backward);
    2. the reverse chain dht[r] = a[r+1] (G[r+1] + M[r+1]^T dht[r+1]) per sequence, M from one masked transition
       (need[r] = a[r+1], as the forward's), never differentiated; then ONE varlen backward with do and that dht
       (skipped under fallback "none", where a = 0 and step 1's backward is the one);
    3. dE_win[r] = (1 - a[r]) (G[r] + M[r]^T dht[r]) enters the windows' backward (do = 0, zero start), whose
       k, v, g, beta gradients add at the window tokens; skipped under "exact", where a = 1.
    """
    plan, S0, a = saved
    dev = k.device
    xs = (q, k, v, g, beta)
    if not plan.win_rows or fallback == "none":
        out = prims.bwd(op, *xs, do, plan.bounds, h0=S0, backend=backend, launch=launch, scale=scale)
        grads = list(out[:5])
        if not plan.win_rows:
            return tuple(grads)
        G = out[5]
        assert G is not None and S0 is not None
        D = G
    else:
        G = prims.state_grad(op, *xs, do, plan.bounds, backend=backend, launch=launch, scale=scale)
        nseg = plan.num_segments
        need = torch.zeros(nseg, dtype=torch.bool, device=dev)
        need[:-1] = a[1:]
        M, _ = prims.trans(op, k, v, g, beta, plan.bounds, backend=backend, launch=launch, need=need)
        dht = torch.zeros_like(G)
        D = G.clone()
        af = a.to(G.dtype)[:, None, None, None]
        for r in range(nseg - 2, -1, -1):          # serial over segments (host loop, device values only)
            if plan.first[r + 1]:
                continue
            dht[r] = af[r + 1] * D[r + 1]
            D[r] = G[r] + M[r].transpose(-1, -2) @ dht[r]
        grads = list(prims.bwd(op, *xs, do, plan.bounds, h0=S0, dht=dht, backend=backend, launch=launch, scale=scale)[:5])
    if fallback != "exact":
        rows = plan.index("win_rows", dev)
        dE = ((1.0 - a.to(G.dtype)[:, None, None, None]) * D).index_select(0, rows)
        idx = plan.index("gather", dev)
        kw, vw, gw, bw = (x.index_select(1, idx) for x in (k, v, g, beta))
        dw = prims.bwd(op, torch.zeros_like(kw), kw, vw, gw, bw,
                       torch.zeros(*vw.shape, dtype=q.dtype, device=dev), plan.win_bounds, dht=dE,
                       backend=backend, launch=launch, scale=scale)[1:5]
        for gr, d in zip(grads[1:], dw, strict=True):
            gr.index_add_(1, idx, d)
    return tuple(grads)


def _window_maps(op: str, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, plan: WarmupPlan, *, backend: str, launch: LaunchPlan,
                 H: int) -> tuple[Tensor | None, Tensor]:
    """E_win `[n_win, H, K, V]` of every window (the end state from a zero start), and log ||E_win||_F (fp64)."""
    dev = k.device
    if not plan.win_rows:
        return None, torch.empty(0, H, dtype=torch.float64, device=dev)
    idx = plan.index("gather", dev)
    kw, vw, gw, bw = (x.index_select(1, idx) for x in (k, v, g, beta))
    _, E = prims.trans(op, kw, vw, gw, bw, plan.win_bounds, backend=backend, launch=launch)
    return E, torch.linalg.vector_norm(E, dim=(-2, -1)).double().log()


def _scatter(plan: WarmupPlan, rows: Tensor | None, *, H: int, K: int, V: int, device: torch.device) -> Tensor | None:
    """Entering states `[S, H, K, V]` with the win rows' states in place and zeros for first segments."""
    if rows is None:
        return None
    S0 = torch.zeros(plan.num_segments, H, K, V, dtype=torch.float32, device=device)
    S0.index_copy_(0, plan.index("win_rows", device), rows)
    return S0


def _auto_states(op: str, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, plan: WarmupPlan, E_win: Tensor | None,
                 fell: Tensor, *, backend: str, launch: LaunchPlan, H: int, K: int, V: int) -> Tensor | None:
    """Per-segment choice on the device: S0[r] = fell[r] ? M[r-1] S0[r-1] + S_ext[r-1] : E_win[r].

    One masked transition over all segments gives (M, S_ext) only for the predecessors of failing segments
    (zeros elsewhere); the choice is the affine chain S0[r] = A S0[r-1] + B with A = masked M and
    B = where(fell, S_ext, E_win): on triton one `seg_chain` launch; on torch one `baddbmm` per segment position,
    batched over sequences and heads.
    """
    if E_win is None:
        return None
    dev = k.device
    need = torch.zeros(plan.num_segments, dtype=torch.bool, device=dev)
    need.index_copy_(0, plan.index("prev_rows", dev), fell)
    M, E = prims.trans(op, k, v, g, beta, plan.bounds, backend=backend, launch=launch, need=need)
    prev = plan.index("prev_rows", dev)
    M, E = M.index_select(0, prev), E.index_select(0, prev)                  # the win rows' predecessors
    B = torch.where(fell[:, None, None, None], E, E_win)
    if resolve_backend(backend, dev) == "triton" and K >= 16 and V >= 16:
        # one launch: each sequence's chain of win rows walked serially on the device (the torch path below
        # launches one batched matmul per segment position)
        from kernels.common.seqsplit import seg_chain_states

        return seg_chain_states(M.float(), B.float(), None, plan.index("seg_ptr", dev), num_segments=plan.num_segments,
                                launch=launch)
    (steps, n), map_pos, _ = plan.chain_layout
    if map_pos == tuple(range(steps * n)):
        A_all, B_all = M, B
    else:
        pos = plan.index("map_pos", dev)
        A_all = M.new_zeros(steps * n, H, K, K).index_copy_(0, pos, M)
        B_all = B.new_zeros(steps * n, H, K, V).index_copy_(0, pos, B)
    A_all, B_all = A_all.view(steps, n * H, K, K), B_all.view(steps, n * H, K, V)
    X = torch.empty(steps + 1, n * H, K, V, dtype=torch.float32, device=dev)
    X[0].zero_()
    for j in range(steps):
        torch.baddbmm(B_all[j], A_all[j], X[j], out=X[j + 1])
    states = X.view(-1, H, K, V).index_select(0, plan.index("state_pos", dev))
    return _scatter(plan, states, H=H, K=K, V=V, device=dev)


def _auto_err_bound(plan: WarmupPlan, ell: Tensor, log_bound: Tensor, fell: Tensor, *, device: torch.device) -> Tensor:
    """log of the bound on ||S0_used - S0_exact||_F per (segment, head) under `"auto"`, fp64 `[S, H]`.

    A window-built state errs by at most its window bound (log_bound) and does not depend on earlier
    states; a fallback state S0[r] = M[r-1] S0[r-1] + S_ext[r-1] carries the error of S0[r-1] through
    M[r-1], ||M||_2 <= exp(sum of l_t over segment r-1). So along each run of fallbacks the log error is the
    log bound of the run's last window-built (or first, exact: -inf) segment plus the summed span bounds:
    a segmented scan (cummax of the reset index, cumsum of the span logs), no loop.
    """
    S, H = log_bound.shape
    if not plan.win_rows:
        return log_bound
    span = torch.zeros(S, H, dtype=torch.float64, device=device)
    span.index_copy_(0, plan.index("win_rows", device),
                     log_span_bound(ell, plan.index("prev_start", device), plan.index("prev_end", device)))
    ar = torch.arange(S, device=device)
    reset = torch.cummax(torch.where(fell, 0, ar), 0).values                 # last non-fallback segment <= s
    C = torch.where(fell[:, None], span, 0.0).cumsum(0)
    return log_bound.index_select(0, reset) + C - C.index_select(0, reset)


def _exact_states(op: str, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, plan: WarmupPlan, *, backend: str,
                  launch: LaunchPlan, H: int, K: int, V: int) -> tuple[Tensor | None, Tensor]:
    """Exact entering states (exact maps + serial correction), and log ||S0||_F of the non-first segments."""
    dev = k.device
    sp = intra.build_plan(plan.pieces(), plan.seg_len)
    assert sp.sub_bounds == plan.bounds, "segment plans disagree"
    X = intra.chain_states(op, k, v, g, beta, sp, backend=backend, launch=launch)
    S0 = intra.initial_states(sp, X, None, H=H, K=K, V=V, device=dev)
    if S0 is None or not plan.win_rows:
        return S0, torch.empty(0, H, dtype=torch.float64, device=dev)
    norms = torch.linalg.vector_norm(S0.index_select(0, plan.index("win_rows", dev)), dim=(-2, -1)).double().log()
    return S0, norms
