"""Helpers shared by the figure modules: mode order and colours, facets (by W and, for points across hosts, by
topology: `topology_tag`), the `none` baseline, dtype sizes, and the backend of each series (a sweep page showing every backend draws ours and a peer's implementation of a mode on the
same axes: `backend_label`, `series_name`, `backend_marker`).

Pure functions over result rows (the flat dicts of `db.crud.list_results`); nothing here touches plotly state
beyond building an empty placeholder figure.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Sequence
from typing import Any

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from db.topology import Topology
from kernels.vocabulary import DTYPE_BYTES, EXACT_MODES, MODES

_PALETTE = ("#7f7f7f", "#1f77b4", "#ff7f0e", "#d62728", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#17becf", "#bcbd22")
_SYMBOLS = ("circle", "square", "diamond", "triangle-up", "x", "star", "cross", "triangle-down")
_DTYPE_ALIASES = {"bf16": "bfloat16", "fp16": "float16", "half": "float16", "fp32": "float32", "float": "float32"}
# the axes that pick a series apart from mode; the baseline `none` matches on these plus T and lb
SHAPE_KEYS = ("op", "backend", "B", "H", "K", "V", "dtype", "direction")


def mode_rank(mode: str) -> tuple[int, str]:
    return (MODES.index(mode), "") if mode in MODES else (len(MODES), mode)


def sort_modes(modes: Iterable[str]) -> list[str]:
    return sorted(set(modes), key=mode_rank)


def mode_color(mode: str) -> str:
    if mode in MODES:
        return _PALETTE[MODES.index(mode)]
    return _PALETTE[len(MODES) + sum(map(ord, mode)) % (len(_PALETTE) - len(MODES))]


def symbol(i: int) -> str:
    return _SYMBOLS[i % len(_SYMBOLS)]


def dtype_bytes(dtype: str | None) -> int:
    name = str(dtype).lower()
    return DTYPE_BYTES.get(_DTYPE_ALIASES.get(name, name), 2)


def measured(rows: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """Rows of finished points that carry a timing."""
    return [r for r in rows if r.get("status", "done") == "done" and _finite(r.get("median_ms"))]


def _finite(x: Any) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x)


def facet_values(rows: Iterable[dict[str, Any]], key: str) -> list[Any]:
    return sorted({r[key] for r in rows if r.get(key) is not None})


def run_W(row: dict[str, Any]) -> int:
    """The CP size a row ran at (1 when unset)."""
    return row.get("W") or 1


def topology_tag(row: dict[str, Any]) -> str:
    """What tells a multi-host point apart on a figure: "" for a point on one host (every W=1 point, the `none`
    baseline included, and every point stored before issue 29), else its topology's label (`db.topology.Topology.
    label`, "2x2 loopback+tcp/lo"). A figure of one-host points only looks as it did; speedups of every topology are
    over the same one-host W=1 `none` of the shape (`none_medians`)."""
    topo = Topology.of_row(row)
    return topo.label if topo.hosts > 1 else ""


def with_topology(text: str, tag: str) -> str:
    """`text` (a trace name, a facet title) followed by a multi-host point's topology: "ring · 2x2 loopback+tcp/lo"."""
    return f"{text} · {tag}" if tag else text


def cp_facets(rows: Sequence[dict[str, Any]], *, none_is_reference: bool = True) -> list[tuple[int, str]]:
    """The (CP size W, `topology_tag`) facets: every W a row ran at, one-host first, then each multi-host topology
    at that W. With `none_is_reference` (figures that draw `none` as a dashed reference in every facet) a W=1 facet
    that would hold `none` alone is left out."""
    ran = [r for r in rows if not (none_is_reference and r["mode"] == "none")]
    return sorted({(run_W(r), topology_tag(r)) for r in ran}) or sorted({(run_W(r), topology_tag(r)) for r in rows})


def cp_sizes(rows: Sequence[dict[str, Any]], *, none_is_reference: bool = True) -> list[int]:
    """The CP sizes to facet by (`cp_facets`' W, whatever the topology)."""
    return sorted({W for W, _ in cp_facets(rows, none_is_reference=none_is_reference)})


def is_reference(row: dict[str, Any], *, W: int) -> bool:
    """`none` (one device) drawn in a facet of another CP size: a labelled reference line, not a point of it."""
    return row["mode"] == "none" and run_W(row) == 1 and W != 1


REFERENCE_NAME = "none (1 device)"


def backend_label(row: dict[str, Any]) -> str:
    """What tells a row's implementation apart: its backend, plus the backend options it ran with that are set
    (`params.backend_options`, e.g. FLA's Hopper-guard opt-in: `fla+bypass_hopper_guard`; a value other than true
    as `name=value`: our recompute policy `triton+keep=wy+states`). A figure's frame stores
    it in the key "backend_label"; the helpers below read that key when present."""
    if "backend_label" in row:
        return str(row["backend_label"])
    opts = (row.get("params") or {}).get("backend_options") or {}
    on = [k if v is True else f"{k}={v}" for k, v in sorted(opts.items()) if v is not False and v is not None]
    return "+".join([str(row.get("backend")), *on])


def dispatched_to(row: dict[str, Any]) -> str | None:
    """The implementation FLA's dispatch ran for a `fla_dispatch` row (its report's `fla_dispatch.op`: flash_qla,
    tilelang, flash_kda or triton; `runners.peers.fla_dispatch`), with the kernels its dispatch sent elsewhere (the
    report's `calls`, kernel -> implementation): "triton (+1 tilelang kernel)" where FLA's KDA backward ran one of
    its kernels on TileLang; None for other rows. A figure's frame stores it in the key "dispatched_to"; read that
    when present."""
    if "dispatched_to" in row:
        return row["dispatched_to"] or None
    record = (row.get("report") or {}).get("fla_dispatch")
    if not (isinstance(record, dict) and record.get("op")):
        return None
    op = str(record["op"])
    elsewhere = [str(v) for v in (record.get("calls") or {}).values() if v and str(v) != op]
    if not elsewhere:
        return op
    n = len(elsewhere)
    return f"{op} (+{n} {'/'.join(sorted(set(elsewhere)))} kernel{'s' if n > 1 else ''})"


def ran_label(row: dict[str, Any], label: str) -> str:
    """`label` naming a row, followed by what FLA's dispatch ran where it is a `fla_dispatch` row: a user who sees
    "fla_dispatch · none → flash_qla" knows it is FlashQLA (with its own intra-card CP) under FLA's op."""
    ran = dispatched_to(row)
    return f"{label} → {ran}" if ran else label


def backend_labels(rows: Iterable[dict[str, Any]]) -> list[str]:
    """The distinct backend labels of `rows`, in order of first appearance (the spec's order of its backends)."""
    return list(dict.fromkeys(backend_label(r) for r in rows))


def shows_backend(labels: Sequence[str]) -> bool:
    """Whether series names carry the backend: a figure of several backends (or of one run with peer options,
    which must be seen), so that ours and a peer's implementation of a mode are told apart on the same axes."""
    return len(labels) > 1 or any("+" in label for label in labels)


def series_name(mode: str, label: str, labels: Sequence[str]) -> str:
    """A trace's name: its mode, or "<mode> · <backend label>" when `shows_backend(labels)`."""
    return f"{mode} · {label}" if shows_backend(labels) else mode


def backend_marker(symbol_name: str, label: str, labels: Sequence[str]) -> str:
    """The marker of a series: filled for the first backend, open for the others (the colour stays the mode's)."""
    return symbol_name if not labels or labels.index(label) == 0 else f"{symbol_name}-open"


def series_key(mode: str, label: str, labels: Sequence[str]) -> tuple[int, int]:
    """Legend order of a (mode, backend label) series: the mode's rank, then the backend's place in `labels`."""
    return mode_rank(mode), list(labels).index(label)


def mode_series(rows: Iterable[dict[str, Any]]) -> list[tuple[tuple[str, str, int], list[dict[str, Any]]]]:
    """Rows grouped into one series per (mode, backend label, B), in legend order (mode rank, backends in order of
    appearance, then B); rows keep their order."""
    series: dict[tuple[str, str, int], list[dict[str, Any]]] = defaultdict(list)
    for r in rows:
        series[(r["mode"], backend_label(r), r["B"])].append(r)
    order = list(dict.fromkeys(k[1] for k in series))
    return sorted(series.items(), key=lambda kv: (*series_key(kv[0][0], kv[0][1], order), kv[0][2]))


def in_facet(row: dict[str, Any], *, W: int, lb: float | None = None, topology: str | None = None) -> bool:
    """The row ran at CP size W (and decay bound lb, and on the `topology_tag` topology, when given): the only rows a
    facet of W plots as its own."""
    return run_W(row) == W and (lb is None or row["lb"] == lb) and (topology is None or topology_tag(row) == topology)


def is_exact(row: dict[str, Any]) -> bool:
    """Exact in fp32 (kernels/cp/README.md §3): the exact schemes, tail_exchange with `fallback: true_cp` and
    warmup_correct with `fallback: exact`; tail_exchange's and warmup_correct's other policies are approximate."""
    opts = (row.get("params") or {}).get("mode_options") or {}
    if row["mode"] == "tail_exchange":
        return opts.get("fallback") == "true_cp"
    if row["mode"] == "warmup_correct":
        return opts.get("fallback") == "exact"
    return row["mode"] in EXACT_MODES or row["mode"] not in MODES


def baseline_key(row: dict[str, Any]) -> tuple[Any, ...]:
    return (*(row.get(k) for k in SHAPE_KEYS), row.get("T"), row.get("lb"))


def unreliable(row: dict[str, Any]) -> str | None:
    """Why a row's measurement is unreliable (its stop rule did not converge: `measurements.unreliable`), or None."""
    return row.get("unreliable") or None


def none_medians(rows: Iterable[dict[str, Any]]) -> dict[tuple[Any, ...], float]:
    """Median ms of the `none` mode per shape (the fastest if several runs share a shape), from reliable runs only:
    no speedup is ever taken over an unreliable baseline (`noisy_baselines` says which shapes lack one)."""
    out: dict[tuple[Any, ...], float] = {}
    for r in rows:
        if r["mode"] == "none" and _finite(r.get("median_ms")) and not unreliable(r):
            k = baseline_key(r)
            out[k] = min(out.get(k, math.inf), r["median_ms"])
    return out


def noisy_baselines(rows: Iterable[dict[str, Any]]) -> dict[tuple[Any, ...], str]:
    """Per shape whose `none` runs are all unreliable, why (the first run's reason): no speedup there."""
    rows = list(rows)
    good = none_medians(rows)
    out: dict[tuple[Any, ...], str] = {}
    for r in rows:
        if r["mode"] == "none" and (why := unreliable(r)) and baseline_key(r) not in good:
            out.setdefault(baseline_key(r), why)
    return out


def speedup(row: dict[str, Any], baselines: dict[tuple[Any, ...], float]) -> float | None:
    base = baselines.get(baseline_key(row))
    if base is None or not row.get("median_ms"):
        return None
    return base / row["median_ms"]


def facet_title(W: int, lb: float, n_lb: int, topology: str = "") -> str:
    return with_topology(f"W={W}" if n_lb <= 1 else f"W={W} · lb={lb:g}", topology)


def single_value_log_range(values: Iterable[Any]) -> list[float] | None:
    """A log axis over one distinct value autoranges over decades; give it half a decade each side instead."""
    distinct = {v for v in values if isinstance(v, (int, float)) and v > 0}
    if len(distinct) != 1:
        return None
    centre = math.log10(distinct.pop())
    return [centre - 0.5, centre + 0.5]


def tokens_label(T: int) -> str:
    """8192 -> "8K", 131072 -> "128K", 1000 -> "1000": how the pages name a sequence length."""
    return f"{T // 1024}K" if T >= 1024 and T % 1024 == 0 else str(T)


def t_ticks(values: Iterable[Any]) -> dict[str, Any]:
    """A log T axis labelled at the measured lengths ("8K", "64K"; at most 12 labels, every other one beyond),
    instead of plotly's abbreviated minor ticks ("2", "3", ... meaning 20K, 30K)."""
    Ts = sorted({int(v) for v in values if isinstance(v, (int, float)) and v > 0})
    Ts = Ts if len(Ts) <= 12 else Ts[::2]
    return {"tickvals": Ts, "ticktext": [tokens_label(T) for T in Ts]}


def ms_ticks(values: Iterable[Any]) -> dict[str, Any]:
    """A log time axis labelled on the 1-2-5 sequence spanning the values ("0.5", "1", "2", "5", "10", ...), one
    step beyond each end, instead of plotly's abbreviated minor ticks."""
    vs = [float(v) for v in values if isinstance(v, (int, float)) and v > 0]
    if not vs:
        return {}
    lo, hi = min(vs), max(vs)
    ticks: list[float] = []
    for d in range(math.floor(math.log10(lo)) - 1, math.ceil(math.log10(hi)) + 1):
        ticks += [m * 10.0 ** d for m in (1, 2, 5)]
    first, last = max(t for t in ticks if t <= lo), min(t for t in ticks if t >= hi)  # the decades bracket lo and hi
    ticks = [t for t in ticks if first <= t <= last]
    return {"tickvals": ticks, "ticktext": [f"{t:.3g}" for t in ticks]}


def per_step_grid(table: Sequence[dict[str, Any]]) -> tuple[go.Figure, list[Any]]:
    """Two stacked panels (rows 1 and 2) per CP size W (columns, from the rows' `facet_W`), x shared, and the W
    values in column order: the layout of the per-step count figures (collectives, host syncs)."""
    Ws = facet_values(table, "facet_W")
    fig = make_subplots(rows=2, cols=len(Ws), shared_xaxes=True, subplot_titles=[f"W={W}" for W in Ws],
                        horizontal_spacing=0.05, vertical_spacing=0.08)
    return fig, Ws


def log_t_axis(fig: go.Figure, table: Iterable[dict[str, Any]]) -> None:
    """Log T on every x axis of a `per_step_grid`, titled under the bottom row."""
    fig.update_xaxes(type="log", range=single_value_log_range(r["T"] for r in table), **t_ticks(r["T"] for r in table))
    fig.update_xaxes(title_text="T (tokens)", row=2)


def empty_figure(title: str, message: str = "no data yet") -> go.Figure:
    fig = go.Figure()
    fig.update_layout(title=title, height=220, template="plotly_white", xaxis={"visible": False}, yaxis={"visible": False},
                      annotations=[{"text": message, "showarrow": False, "font": {"size": 16}}])
    return fig


def base_layout(fig: go.Figure, title: str, *, height: int) -> go.Figure:
    fig.update_layout(title=title, template="plotly_white", height=height, legend={"title": {"text": "mode"}},
                      margin={"l": 60, "r": 20, "t": 70, "b": 50}, hovermode="closest")
    return fig
