"""One profiled step: collective counts and bytes, host syncs, kernel launches, peak memory, a Chrome trace.

`profile_step` runs the (already warm) step once under `torch.profiler` inside a `cpbench::step` range on each
rank; `merge_ranks` folds the per-rank summaries into the point's profile. Counting rules:

- Collectives. Each call shows up under up to three names: the dispatcher op (`c10d::_allgather_base_`,
  `c10d::allgather_`, `_c10d_functional::all_gather_into_tensor`), the backend's event (`gloo:all_gather`,
  `nccl:all_gather`) and maybe a user range (`cp::all_gather`). One layer is counted, never several: the
  dispatcher ops when the step has any, else the backend events (anchors/cpu-feasibility.md §3). Kinds:
  all_gather, all_to_all, all_reduce, reduce_scatter, send, recv, broadcast (barriers are not counted); a
  dispatcher op of no known kind is listed by name in `unclassified` (a new collective is never silently missed).
  Bytes are the local input of each call (`record_shapes`): from the backend events where they carry shapes
  (gloo's `Input Dims`), else from the `*_base_` dispatcher ops' input argument.
- Host syncs: `aten::_local_scalar_dense` (one per `.item()`, `float(t)`, `bool(t)`; `aten::item` wraps it and
  is listed but not counted twice) + CUDA runtime synchronisations (`cudaStreamSynchronize`,
  `cudaDeviceSynchronize`, `cudaEventSynchronize`, ...) not inside such an item + device-to-host copies
  (`Memcpy DtoH`) beyond the runtime syncs (a blocking copy comes with one). CPU events count only inside the
  step's range.
- Kernel launches: GPU kernel events (memcpy/memset, NCCL's `nccl:*` and user annotations excluded); 0 on CPU.
- Peak memory: `torch.cuda.max_memory_allocated` over the step on CUDA; None on the CPU.
- Per direction (`by_direction`): a training step (`runners.training.train_step`) runs its forward inside a
  `cpbench::fwd` range and its backward inside `cpbench::bwd` (`direction_range`: only while profiled). Each counted event (collective, sync, D2H copy)
  goes to the direction whose range started last at or before the event's start: by time, not by the parent
  chain, so the backward's events on CUDA's autograd thread (no parent in the caller's ranges) and the GPU's copies
  that trail the CPU go to the direction that issued them; events before any range (resetting the gradients) go
  to the forward. The same naming layer as the totals is counted, so the directions sum to the totals. A step
  without a `cpbench::bwd` range (a forward point) has no split: `by_direction` is empty.

Merging ranks: group collectives, launches and peak memory are per rank (max over ranks); point-to-point
send/recv and host syncs are totals over the gang (a ring of W ranks shows W-1 sends and W-1 recvs); each
direction of `by_direction` is merged the same way.
"""

from __future__ import annotations

import bisect
import gzip
import logging
import os
import shutil
import tempfile
from collections.abc import Callable, Iterable, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from kernels.cp.modes import merge_rank_counts
from kernels.vocabulary import PHASES

__all__ = ["BWD_RANGE", "FWD_RANGE", "PROFILE_DIRECTIONS", "ProfileSummary", "classify_collective", "direction_range",
           "merge_ranks", "profile_step", "summarize_events"]

logger = logging.getLogger(__name__)

STEP_RANGE = "cpbench::step"
FWD_RANGE = "cpbench::fwd"  # a training step's forward (runners.training.train_step)
BWD_RANGE = "cpbench::bwd"  # a training step's backward
# the phases a training step's profile is split into (kernels.vocabulary.PHASES) -> their record_function ranges
PROFILE_DIRECTIONS = dict(zip(PHASES, (FWD_RANGE, BWD_RANGE), strict=True))
_RANGES = (STEP_RANGE, FWD_RANGE, BWD_RANGE)
DISPATCH_PREFIXES = ("c10d::", "_c10d_functional::", "c10d_functional::")
BACKEND_PREFIXES = ("gloo:", "nccl:", "mpi:", "ucc:", "xccl:")
# (prefix of the op name with underscores removed, kind); first match wins
_KINDS = (
    ("allgather", "all_gather"),
    ("alltoall", "all_to_all"),
    ("allreduce", "all_reduce"),
    ("reducescatter", "reduce_scatter"),
    ("send", "send"),
    ("recv", "recv"),
    ("broadcast", "broadcast"),
    ("barrier", "barrier"),
)
# dispatcher ops whose argument 1 is the local input tensor (argument 0 is the output)
_BASE_OP_INPUT_ARG = ("c10d::_allgather_base_", "c10d::alltoall_base_", "c10d::_reduce_scatter_base_")
ITEM_EVENTS = ("aten::_local_scalar_dense",)
SYNC_RUNTIME = (
    "cudaStreamSynchronize",
    "cudaDeviceSynchronize",
    "cudaEventSynchronize",
    "cuStreamSynchronize",
    "cuCtxSynchronize",
    "cuEventSynchronize",
)
_DTYPE_BYTES = {
    "float": 4, "double": 8, "c10::Half": 2, "c10::BFloat16": 2, "long int": 8, "long": 8, "int": 4,
    "short int": 2, "signed char": 1, "unsigned char": 1, "bool": 1, "c10::Float8_e4m3fn": 1, "c10::Float8_e5m2": 1,
}


@dataclass
class ProfileSummary:
    """What one profiled step did on one rank (or, after `merge_ranks`, on the gang)."""

    collectives: dict[str, int] = field(default_factory=dict)
    collective_bytes: dict[str, int] = field(default_factory=dict)
    host_syncs: int = 0
    sync_events: dict[str, int] = field(default_factory=dict)
    kernel_launches: int = 0
    peak_memory_bytes: int | None = None
    trace_path: str | None = None
    per_rank: list[dict[str, Any]] = field(default_factory=list)
    unclassified: list[str] = field(default_factory=list)
    # a training step's split: {"fwd": {collectives, collective_bytes, host_syncs}, "bwd": {...}}; {} without one
    by_direction: dict[str, dict[str, Any]] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def direction_range(direction: str) -> AbstractContextManager[Any]:
    """The profiler range of a training step's `direction` ("fwd" or "bwd"); a no-op while no profiler runs (a
    range costs microseconds of host time even then, and the timed steps run unprofiled)."""
    if direction not in PROFILE_DIRECTIONS:
        raise ValueError(f"direction must be one of {tuple(PROFILE_DIRECTIONS)}, got direction={direction!r}")
    if not torch.autograd._profiler_enabled():
        return nullcontext()
    return torch.profiler.record_function(PROFILE_DIRECTIONS[direction])


def classify_collective(name: str) -> tuple[str, str] | None:
    """`(layer, kind)` of a profiler event name, layer "dispatch" or "backend"; None if not a collective."""
    for layer, prefixes in (("dispatch", DISPATCH_PREFIXES), ("backend", BACKEND_PREFIXES)):
        for p in prefixes:
            if name.startswith(p):
                op = name[len(p):].replace("_", "").lower()
                for stem, kind in _KINDS:
                    if op.startswith(stem):
                        return layer, kind
                return None
    return None


def _numel(shape: Sequence[int]) -> int:
    n = 1
    for d in shape:
        n *= int(d)
    return n


def _input_bytes(evt: Any, arg: int) -> int:
    shapes = getattr(evt, "input_shapes", None) or []
    dtypes = getattr(evt, "input_dtypes", None) or []
    if len(shapes) <= arg or not shapes[arg] or not all(isinstance(d, int) for d in shapes[arg]):
        return 0
    dt = dtypes[arg] if len(dtypes) > arg else "float"
    return _numel(shapes[arg]) * _DTYPE_BYTES.get(str(dt), 4)


def _in_window(evt: Any, window: tuple[float, float] | None) -> bool:
    if window is None:
        return True
    tr = evt.time_range
    return tr.start >= window[0] and tr.end <= window[1]


def _has_ancestor(evt: Any, names: Iterable[str]) -> bool:
    names = tuple(names)
    parent = getattr(evt, "cpu_parent", None)
    while parent is not None:
        if parent.name in names:
            return True
        parent = getattr(parent, "cpu_parent", None)
    return False


def _is_device_event(evt: Any) -> bool:
    dt = getattr(evt, "device_type", None)
    return dt is not None and getattr(dt, "name", str(dt)) not in ("CPU",)


def _tally(host: Sequence[Any], device: Sequence[Any], layer: str | None = None) -> dict[str, Any]:
    """Collectives (counts, bytes; of `layer`, else the dispatcher layer when present), host syncs and their
    events of a set of events; `layer` is the layer counted."""
    by_layer: dict[str, dict[str, int]] = {"dispatch": {}, "backend": {}}
    bytes_by_layer: dict[str, dict[str, int]] = {"dispatch": {}, "backend": {}}
    unclassified: list[str] = []
    for e in host:
        c = classify_collective(e.name)
        if c is None:
            if e.name.startswith(DISPATCH_PREFIXES):
                unclassified.append(e.name)
            continue
        lay, kind = c
        by_layer[lay][kind] = by_layer[lay].get(kind, 0) + 1
        if lay == "backend":
            nbytes = _input_bytes(e, 0)
        else:
            nbytes = _input_bytes(e, 1) if e.name in _BASE_OP_INPUT_ARG else 0
        bytes_by_layer[lay][kind] = bytes_by_layer[lay].get(kind, 0) + nbytes
    if layer is None:
        layer = "dispatch" if by_layer["dispatch"] else "backend"
    collectives = {k: n for k, n in sorted(by_layer[layer].items()) if k != "barrier"}
    # per kind: the backend layer's bytes where it records them, else the dispatcher's (gloo's reduce-scatter
    # event carries no input shape; its `c10d::_reduce_scatter_base_` does)
    collective_bytes = {k: bytes_by_layer["backend"].get(k, 0) or bytes_by_layer["dispatch"].get(k, 0) for k in collectives}

    sync_events: dict[str, int] = {}
    host_syncs = 0
    for e in host:
        if e.name in ("aten::item", *ITEM_EVENTS, *SYNC_RUNTIME):
            sync_events[e.name] = sync_events.get(e.name, 0) + 1
        if e.name in ITEM_EVENTS or e.name in SYNC_RUNTIME and not _has_ancestor(e, ITEM_EVENTS):
            host_syncs += 1
    d2h = [e for e in device if e.name.startswith("Memcpy DtoH")]
    if d2h:
        sync_events["Memcpy DtoH"] = len(d2h)
        # a blocking D2H copy comes with a runtime sync counted above; count only the copies beyond those
        host_syncs += max(0, len(d2h) - sum(sync_events.get(n, 0) for n in SYNC_RUNTIME))
    return {"layer": layer, "collectives": collectives, "collective_bytes": collective_bytes, "host_syncs": host_syncs,
            "sync_events": sync_events, "unclassified": sorted(unclassified)}


def _split(host: Sequence[Any], device: Sequence[Any], ranges: Sequence[Any], layer: str) -> dict[str, dict[str, Any]]:
    """`by_direction` of a training step (see the module docstring); {} when the step has no backward range. Each
    event goes to the direction whose range started last at or before it starts ("fwd" before any range)."""
    if not any(r.name == BWD_RANGE for r in ranges):
        return {}
    names = {r: d for d, r in PROFILE_DIRECTIONS.items()}
    starts = sorted((r.time_range.start, names[r.name]) for r in ranges)
    times = [t for t, _ in starts]
    parts: dict[str, tuple[list[Any], list[Any]]] = {d: ([], []) for d in PROFILE_DIRECTIONS}
    for side, events in enumerate((host, device)):
        for e in events:
            i = bisect.bisect_right(times, e.time_range.start)
            parts[starts[i - 1][1] if i else "fwd"][side].append(e)
    out = {}
    for d, (h, dev) in parts.items():
        t = _tally(h, dev, layer)
        out[d] = {k: t[k] for k in ("collectives", "collective_bytes", "host_syncs")}
    return out


def summarize_events(events: Sequence[Any]) -> ProfileSummary:
    """Counts of one rank's profiler events (`prof.events()`), limited to the `cpbench::step` range if present."""
    step = [e for e in events if e.name == STEP_RANGE and not _is_device_event(e)]
    window = (step[0].time_range.start, step[0].time_range.end) if step else None
    host = [e for e in events if not _is_device_event(e) and e.name not in _RANGES and _in_window(e, window)]
    device = [e for e in events if _is_device_event(e)]
    ranges = [e for e in events if e.name in (FWD_RANGE, BWD_RANGE) and not _is_device_event(e) and _in_window(e, window)]

    total = _tally(host, device)
    launches = sum(
        1 for e in device
        if not e.name.startswith(("Memcpy", "Memset", *BACKEND_PREFIXES)) and not getattr(e, "is_user_annotation", False)
    )
    return ProfileSummary(
        collectives=total["collectives"],
        collective_bytes=total["collective_bytes"],
        host_syncs=total["host_syncs"],
        sync_events=total["sync_events"],
        kernel_launches=launches,
        unclassified=total["unclassified"],
        by_direction=_split(host, device, ranges, total["layer"]),
    )


def profile_step(
    step: Callable[[], Any],
    *,
    device: torch.device,
    trace_path: str | os.PathLike[str] | None = None,
) -> ProfileSummary:
    """Run `step` once under the profiler; count (see module docstring); write a gzipped Chrome trace if asked."""
    from torch.profiler import ProfilerActivity, profile, record_function

    on_cuda = device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if on_cuda else [])
    if on_cuda:
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
    with profile(activities=activities, record_shapes=True) as prof:
        with record_function(STEP_RANGE):
            step()
        if on_cuda:
            torch.cuda.synchronize(device)
    summary = summarize_events(prof.events())
    if on_cuda:
        summary.peak_memory_bytes = int(torch.cuda.max_memory_allocated(device))
    if trace_path is not None:
        summary.trace_path = str(_export_trace(prof, Path(trace_path)))
    return summary


def _export_trace(prof: Any, path: Path) -> Path:
    """Write the Chrome trace gzipped at `path` (a `.json.gz`); returns the path."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix=".json", dir=path.parent)
    os.close(fd)
    try:
        prof.export_chrome_trace(tmp)
        with open(tmp, "rb") as src, gzip.open(path, "wb", compresslevel=6) as dst:
            shutil.copyfileobj(src, dst)
    finally:
        os.unlink(tmp)
    return path


def _merge_counts(parts: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """collectives / collective_bytes (`kernels.cp.modes.merge_rank_counts`, the rule kernels.cp states its
    expected gang counts by) and host_syncs (sum) of the ranks' `parts` (dicts with those
    keys)."""
    return {"collectives": merge_rank_counts(s["collectives"] for s in parts),
            "collective_bytes": merge_rank_counts(s["collective_bytes"] for s in parts),
            "host_syncs": sum(s["host_syncs"] for s in parts)}


def merge_ranks(summaries: Sequence[ProfileSummary]) -> ProfileSummary:
    """The gang's profile from each rank's: group collectives, launches, peak memory as max over ranks;
    send/recv counts and bytes, host syncs and sync events as totals; each direction of `by_direction` alike
    (kept only when every rank split its step). The trace is rank 0's."""
    if not summaries:
        return ProfileSummary()
    total = _merge_counts([asdict(s) for s in summaries])
    by_direction: dict[str, dict[str, Any]] = {}
    if all(s.by_direction for s in summaries):
        by_direction = {d: _merge_counts([s.by_direction[d] for s in summaries]) for d in PROFILE_DIRECTIONS}
    sync_events: dict[str, int] = {}
    for s in summaries:
        for n, c in s.sync_events.items():
            sync_events[n] = sync_events.get(n, 0) + c
    peaks = [s.peak_memory_bytes for s in summaries if s.peak_memory_bytes is not None]
    return ProfileSummary(
        collectives=total["collectives"],
        collective_bytes=total["collective_bytes"],
        host_syncs=total["host_syncs"],
        sync_events=sync_events,
        kernel_launches=max(s.kernel_launches for s in summaries),
        peak_memory_bytes=max(peaks) if peaks else None,
        trace_path=summaries[0].trace_path,
        per_rank=[
            {"collectives": s.collectives, "host_syncs": s.host_syncs, "kernel_launches": s.kernel_launches}
            for s in summaries
        ],
        unclassified=sorted({n for s in summaries for n in s.unclassified}),
        by_direction=by_direction,
    )
