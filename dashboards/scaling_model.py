"""The scaling model: every CP scheme's forward and fwd+bwd time at W ranks on `hosts` hosts, from kernel rates and an
alpha-beta model of the links (pure arithmetic, no torch: the /scaling page and the figures use it).

time(mode) = compute on the critical path + the collectives on it, for one layer:

- **compute**: `fixed_s * calls + per_token_head_s * N * H / model_speedup(mode, W, T=N)`, N = B T tokens; the rate
  (`KernelRate`) is fitted per shape family from the W=1 `none` points (`fit_rates`: t = fixed + rate N H, least
  squares over the lengths measured) or taken from `DEFAULT_RATES` (H200 anchors); `model_speedup` of
  `dashboards.cost_model` says how much of the sequence is on the critical path (headwise N/W heads-share, ring the
  whole chain, true_cp and tail_exchange a shard plus their transition or warmup); `calls` is the primitive calls
  on that path (a fixed cost each: launch and host overhead). The training step uses the fwd+bwd rate with the
  same structure (the backward mirrors the forward: kernels/cp/README.md §7).
- **communication**: the collectives `dashboards.cost_model.comm_cost` counts (its bytes are the profiler's, to
  the byte), each on its links (`dashboards.links`: an alpha-beta model per link class, within a host and between
  hosts, and the share of each collective's traffic that crosses hosts). A step's collectives run one after
  another (none overlaps compute), so their times add.

`predict(...)` gives a `Prediction` (compute, comm, total seconds and the `CommCost`); `held_against(rows, ...)`
puts every measured point beside its prediction (error = predicted / measured - 1); `best_schemes(...)` the
fastest scheme per (T, W, hosts).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from dashboards.cost_model import CommCost, comm_cost, model_speedup, rank_hops
from dashboards.links import DEFAULT_PARAMS, CommParams, collective_time, p2p_load
from db.topology import Topology
from kernels.vocabulary import DTYPE_BYTES, EXACT_MODES, MODES, SINGLE_DEVICE, TAIL_EXCHANGE_WINDOW_CHUNKS

__all__ = [
    "DEFAULT_RATES",
    "HELD_COLUMNS",
    "KernelRate",
    "Prediction",
    "ROW_KEYS",
    "best_schemes",
    "choose_rate",
    "cp_modes",
    "fit_rates",
    "held_against",
    "predict",
    "predict_row",
    "rate_family",
]

# the grid the /scaling page predicts over: T up to 4M tokens, W up to 128 ranks, on 1 to 16 hosts
SCALING_TS = (8192, 32768, 131072, 524288, 1048576, 2097152, 4194304)
SCALING_WS = (1, 2, 4, 8, 16, 32, 64, 128)
SCALING_HOSTS = (1, 2, 4, 8, 16)


# ---------------------------------------------------------------------------------------------------- kernel rates
@dataclass(frozen=True)
class KernelRate:
    """One device's step time t = fixed_s + per_token_head_s * N * H (N tokens, H heads), fitted on `points`."""

    fixed_s: float
    per_token_head_s: float
    source: str = ""
    points: int = 0

    def time(self, tokens: float, heads: float, calls: int = 1) -> float:
        return self.fixed_s * calls + self.per_token_head_s * tokens * heads


# the point's own columns `held_against` repeats, and all its columns
ROW_KEYS = ("id", "mode", "op", "backend", "B", "T", "H", "K", "V", "W", "layout", "direction", "dtype", "median_ms")
HELD_COLUMNS = (
    *ROW_KEYS,
    "hosts",
    "ranks_per_host",
    "interconnect",
    "topology",
    "predicted_ms",
    "compute_ms",
    "comm_ms",
    "error",
)
FAMILY_KEYS = ("op", "backend", "dtype", "H", "K", "V", "direction")


def rate_family(row: Mapping[str, Any]) -> tuple[Any, ...]:
    """The shape family whose W=1 `none` points give a row its kernel rate."""
    return tuple(row.get(k) or ("fwd" if k == "direction" else None) for k in FAMILY_KEYS)


def _line(points: Sequence[tuple[float, float]]) -> tuple[float, float]:
    """(intercept, slope) of the least-squares line through (x, y) points; through 0 with one x or a negative
    intercept."""
    xs = {x for x, _ in points}
    if len(xs) > 1:
        n = len(points)
        mx, my = sum(x for x, _ in points) / n, sum(y for _, y in points) / n
        slope = sum((x - mx) * (y - my) for x, y in points) / sum((x - mx) ** 2 for x, _ in points)
        if slope > 0 and my - slope * mx >= 0:
            return my - slope * mx, slope
    return 0.0, sum(y for _, y in points) / sum(x for x, _ in points)


def fit_rates(rows: Iterable[Mapping[str, Any]], *, source: str = "") -> dict[tuple[Any, ...], KernelRate]:
    """Per shape family (`rate_family`), the rate fitted on its finished W=1 `none` points: median ms over
    B T tokens and H heads."""
    groups: dict[tuple[Any, ...], list[tuple[float, float]]] = {}
    for r in rows:
        if r.get("mode") == "none" and (r.get("W") or 1) == 1 and r.get("status", "done") == "done" and r.get("median_ms"):
            groups.setdefault(rate_family(r), []).append((float(r["B"] * r["T"] * r["H"]), float(r["median_ms"]) / 1e3))
    out = {}
    for fam, pts in groups.items():
        fixed, rate = _line(pts)
        out[fam] = KernelRate(fixed, rate, source, len(pts))
    return out


def _anchor(op: str, direction: str, t64k_ms: float, t128k_ms: float, source: str) -> tuple[tuple[Any, ...], KernelRate]:
    fixed, rate = _line([(65536 * 16, t64k_ms / 1e3), (131072 * 16, t128k_ms / 1e3)])
    return (op, "triton", "bfloat16", 16, 128, 128, direction), KernelRate(fixed, rate, source, 2)


# H200 anchors (one sequence, H=16, K=V=128, bf16, triton): `none` at T = 64K and 128K
DEFAULT_RATES: dict[tuple[Any, ...], KernelRate] = dict(
    [
        _anchor("gdn", "fwd", 2.508, 4.801, "benchmarks/results/cp_h200.md (H200)"),
        _anchor("kda", "fwd", 4.540, 8.878, "benchmarks/results/cp_h200.md (H200)"),
        _anchor("gdn", "fwd+bwd", 9.71, 18.92, "benchmarks/results/kernels_train_h200.md (H200)"),
        _anchor("kda", "fwd+bwd", 24.91, 49.50, "benchmarks/results/kernels_train_h200.md (H200)"),
    ]
)


# ------------------------------------------------------------------------------------------------------ prediction
@dataclass(frozen=True)
class Prediction:
    """A scheme's predicted step: compute and communication on the critical path, seconds."""

    mode: str
    compute_s: float
    comm_s: float
    cost: CommCost

    @property
    def total_s(self) -> float:
        return self.compute_s + self.comm_s

    @property
    def total_ms(self) -> float:
        return self.total_s * 1e3


def _calls(mode: str, W: int, layout: str) -> int:
    """Primitive calls on the critical path: a fixed cost each."""
    if mode == "ring":
        return W if layout == "contiguous" else 2 * W
    if mode in ("true_cp", "tail_exchange"):
        return 1 if W == 1 and layout == "contiguous" else 2
    return 1


def predict(
    mode: str,
    *,
    topo: Topology,
    rate: KernelRate,
    B: int,
    T: int,
    H: int,
    K: int,
    V: int,
    params: CommParams = DEFAULT_PARAMS,
    dtype_bytes: int = 2,
    op: str = "gdn",
    layout: str = "contiguous",
    direction: str = "fwd",
    window: int = TAIL_EXCHANGE_WINDOW_CHUNKS,
    lengths: Sequence[int] | None = None,
    devices_per_host: int | None = None,
) -> Prediction | None:
    """The step time of `mode` at W = topo.W (see the module doc); None where no model covers it (warmup_correct,
    a one-device mode at W > 1, a mode outside the vocabulary). `rate` is the fwd or fwd+bwd rate of `direction`.
    `devices_per_host`: where a host's ranks share fewer devices than they are (CPU ranks on a few cores), the
    compute of the schemes whose ranks work at once (all but ring's chain) takes ranks_per_host / devices_per_host
    times longer; None: one device per rank (GPUs)."""
    if mode not in MODES or mode == "warmup_correct" or (mode in SINGLE_DEVICE and topo.W > 1):
        return None
    W = topo.W
    N = sum(lengths) if lengths else B * T
    cost = comm_cost(
        mode,
        B=B,
        T=T,
        H=H,
        K=K,
        V=V,
        W=W,
        dtype_bytes=dtype_bytes,
        op=op,
        layout=layout,
        lengths=lengths,
        direction=direction,
        warmup_chunks=window,
    )
    if cost is None:
        return None
    speedup = model_speedup(mode, W, T=N, warmup_chunks=window) or 1.0
    compute = rate.time(N / speedup, H, _calls(mode, W, layout))
    if devices_per_host and mode != "ring":  # ring's chain keeps one rank busy at a time
        compute *= max(1.0, topo.ranks_per_host / devices_per_host)
    comm = 0.0
    for kind, payload in cost.payload_bytes.items():
        if kind in ("all_gather", "all_to_all", "reduce_scatter"):
            comm += collective_time(kind, payload, topo, params, calls=cost.collectives[kind])
    if "send" in cost.payload_bytes:
        hops = rank_hops(list(lengths) if lengths else [T] * B, W, layout)
        message = cost.payload_bytes["send"] / cost.collectives["send"]
        per_direction = p2p_load(hops, message, topo, serial=mode == "ring").time(params)
        comm += per_direction * (2 if direction == "fwd+bwd" else 1)
    return Prediction(mode, compute, comm, cost)


def _window(row: Mapping[str, Any]) -> int:
    w = ((row.get("params") or {}).get("mode_options") or {}).get("window")
    return w if isinstance(w, int) and w > 0 else TAIL_EXCHANGE_WINDOW_CHUNKS


def _dtype_bytes(row: Mapping[str, Any]) -> int:
    return DTYPE_BYTES.get(str(row.get("dtype")), 2)


def predict_row(
    row: Mapping[str, Any], rate: KernelRate, params: CommParams, devices_per_host: int | None = None
) -> Prediction | None:
    """`predict` at a stored point's shape, mode and topology."""
    opts = (row.get("params") or {}).get("mode_options") or {}
    mode = "true_cp" if row["mode"] == "tail_exchange" and opts.get("fallback") == "true_cp" else row["mode"]
    return predict(
        mode,
        B=row["B"],
        T=row["T"],
        H=row["H"],
        K=row["K"],
        V=row["V"],
        topo=Topology.of_row(row),
        rate=rate,
        params=params,
        dtype_bytes=_dtype_bytes(row),
        op=row.get("op") or "gdn",
        layout=row.get("layout") or "contiguous",
        direction=row.get("direction") or "fwd",
        window=_window(row),
        lengths=(row.get("params") or {}).get("lengths"),
        devices_per_host=devices_per_host,
    )


def held_against(
    rows: Iterable[Mapping[str, Any]],
    params: CommParams = DEFAULT_PARAMS,
    rates: Mapping[tuple[Any, ...], KernelRate] | None = None,
    devices_per_host: int | None = None,
) -> list[dict[str, Any]]:
    """Every finished, timed point beside its prediction: one dict per point with its topology label, measured and
    predicted ms (compute and comm apart) and the error predicted / measured - 1 (None where nothing predicts it:
    no W=1 `none` point of its family, or a mode the model leaves out). Rates come from the rows' own W=1 `none`
    points (`fit_rates`), `rates` filling the families they lack; `devices_per_host` as `predict`'s."""
    rows = [r for r in rows if r.get("status", "done") == "done" and r.get("median_ms")]
    fitted = {**(rates or {}), **fit_rates(rows)}
    out = []
    for r in rows:
        rate = fitted.get(rate_family(r))
        pred = predict_row(r, rate, params, devices_per_host) if rate is not None else None
        topo = Topology.of_row(r)
        out.append(
            {
                **{k: r.get(k) for k in ROW_KEYS},
                "hosts": topo.hosts,
                "ranks_per_host": topo.ranks_per_host,
                "interconnect": topo.interconnect,
                "topology": topo.label,
                "predicted_ms": None if pred is None else pred.total_ms,
                "compute_ms": None if pred is None else pred.compute_s * 1e3,
                "comm_ms": None if pred is None else pred.comm_s * 1e3,
                "error": None if pred is None else pred.total_ms / r["median_ms"] - 1.0,
            }
        )
    return out


def best_schemes(
    *,
    Ts: Sequence[int],
    Ws: Sequence[int],
    hosts: Sequence[int],
    rate: KernelRate,
    params: CommParams = DEFAULT_PARAMS,
    op: str = "gdn",
    H: int = 16,
    K: int = 128,
    V: int = 128,
    dtype_bytes: int = 2,
    direction: str = "fwd",
    layout: str = "contiguous",
    modes: Sequence[str] | None = None,
    max_ranks_per_host: int | None = None,
) -> list[dict[str, Any]]:
    """The predicted fastest scheme per (T, W, hosts) with W spread evenly over the hosts (skipped where W is not a
    multiple of hosts or needs more than `max_ranks_per_host` ranks on a host; headwise where H % W != 0): one dict
    per cell with every scheme's ms and the best's. `modes`: the schemes compared (default `cp_modes()`)."""
    modes = cp_modes() if modes is None else modes
    out = []
    for n_hosts in hosts:
        for W in Ws:
            if W % n_hosts or n_hosts > W or (max_ranks_per_host and W // n_hosts > max_ranks_per_host):
                continue
            topo = Topology(n_hosts, W // n_hosts)
            for T in Ts:
                ms = {}
                for mode in ("none", *modes) if W == 1 else modes:
                    if mode == "headwise" and H % W:
                        continue
                    p = predict(
                        mode,
                        B=1,
                        T=T,
                        H=H,
                        K=K,
                        V=V,
                        topo=topo,
                        rate=rate,
                        params=params,
                        dtype_bytes=dtype_bytes,
                        op=op,
                        layout=layout,
                        direction=direction,
                    )
                    if p is not None:
                        ms[mode] = p.total_ms
                best = min(ms, key=lambda m: ms[m]) if ms else None
                out.append(
                    {
                        "T": T,
                        "W": W,
                        "hosts": n_hosts,
                        "ranks_per_host": W // n_hosts,
                        "best": best,
                        "best_ms": ms.get(best) if best else None,
                        "ms": ms,
                    }
                )
    return out


def cp_modes(*, exact_only: bool = False) -> tuple[str, ...]:
    """The multi-device schemes the model compares (the vocabulary's order); `exact_only`: without the approximate
    ones (tail_exchange's default `fallback: none`)."""
    return tuple(m for m in MODES if m not in SINGLE_DEVICE and (m in EXACT_MODES or not exact_only))


def choose_rate(
    rates: Mapping[tuple[Any, ...], KernelRate], family: tuple[Any, ...]
) -> tuple[KernelRate | None, tuple[Any, ...] | None]:
    """The rate of `family` (a `rate_family` tuple), else of the first family of the same op and direction (the
    rate is per token and head, so it carries over to other H; K, V, dtype and backend do not): (rate, the family
    it belongs to), or (None, None)."""
    if family in rates:
        return rates[family], family
    op, direction = family[0], family[-1]
    for fam, rate in rates.items():
        if fam[0] == op and fam[-1] == direction:
            return rate, fam
    return None, None
