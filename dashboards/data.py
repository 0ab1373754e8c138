"""Queries for the dashboards: the store's rows as tidy lists of flat dicts (no plotly here).

- `sweep_rows(session, sweep_id, limit=)`: a sweep's results (`db.crud.list_results` rows);
- `slice_options(rows)` / `apply_slice(rows, selection)`: the axes a sweep page lets the user fix (op, backend,
  H, K, V, dtype, direction, layout), so every figure compares modes on one shape family; the backend axis also
  offers ALL ("all", the default when a sweep holds several backends): every backend at once, which the figures
  draw side by side ("<mode> · <backend>", `dashboards.figures.common.series_name`); a sweep whose points differ in
  how the step is called (`gate`, the safe gate's `lower_bound`, `l2norm_in_kernel`: in the point's params, issue 25)
  offers those too, so a page never mixes a precomputed-gate point with an in-kernel-gate one, and likewise the
  value heads `HV` of a sweep with several (grouped value heads: HV=16 and HV=32 points are not one shape);
- `tuning_rows(session, ...)`: tuning trials with `chosen` set on the winner stored in tuned_configs;
  `tuned_config_rows(session, ...)`;
- `display_status(status, progress)` and `sweep_index(session, name=, tag=, status=)`: the sweeps list, filtered by
  name substring, tag and shown status, with the sweeps of one regression run collapsed into one group;
- `history_rows(session, ...)`: per benchmark key, its result in every nightly sweep (tagged "nightly", or used by
  a regression run), with the verdict of the regression run that judged that sweep and, when its measurement is
  unreliable (its stop rule did not converge), why.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from sqlalchemy.orm import Session

from db import crud
from db.models import RegressionResult, Sweep, TuningTrial
from kernels.vocabulary import REGRESS_RUN_TAG, regress_run

__all__ = [
    "ALL",
    "ALL_AXES",
    "INDEX_STATUSES",
    "HISTORY_KEYS",
    "INDEX_LIMIT",
    "SLICE_AXES",
    "apply_slice",
    "display_status",
    "history_keys",
    "history_rows",
    "slice_options",
    "sweep_index",
    "sweep_rows",
    "tuned_config_rows",
    "tuning_rows",
]

INDEX_LIMIT = 500  # sweeps the index page reads at most (newest first), as the API's largest page

SLICE_AXES = ("op", "backend", "H", "K", "V", "dtype", "direction", "layout")
# the slice axes whose values the figures can tell apart on the same axes: they also offer ALL (first, the default)
# when the sweep has several values; "all" is no backend's name (runners.peers reserves it)
ALL_AXES = ("backend",)
# axes read from a point's params, with the default an older point (which lacks the key) has (runners.point's
# `_NEW_DEFAULTS`: dashboards do not import runners); offered only where a sweep holds several values
# HV: the value heads of grouped-value-head points (in params only where HV != H; None: the row's H)
PARAM_AXES: dict[str, Any] = {"gate": "precomputed", "lower_bound": -5.0, "l2norm_in_kernel": False, "HV": None}
ALL = "all"
NIGHTLY_TAG = "nightly"
HISTORY_KEYS = 12  # benchmark keys the history page draws at most (the page says when there are more)


def sweep_rows(session: Session, sweep_id: int, *, limit: int) -> list[dict[str, Any]]:
    """A sweep's result rows, at most `limit` (the server passes CPBENCH_MAX_POINTS_PER_SWEEP: a sweep holds no more)."""
    rows, _ = crud.list_results(session, sweep_id=sweep_id, skip=0, limit=limit)
    return rows


def _axis(r: Mapping[str, Any], a: str) -> Any:
    """A row's value on slice axis `a`: its column, or for a PARAM_AXES axis its params' value (else the default)."""
    if a in PARAM_AXES:
        value = (r.get("params") or {}).get(a, PARAM_AXES[a])
        return r.get("H") if a == "HV" and value is None else value
    return r.get(a)


def slice_options(rows: Iterable[dict[str, Any]]) -> dict[str, list[Any]]:
    """For each slice axis, the values present (sorted), ALL first on an ALL_AXES axis with several values; `none`'s
    layout is ignored (it runs on one device); a PARAM_AXES axis only where the rows hold several values."""
    axes = (*SLICE_AXES, *PARAM_AXES)
    out: dict[str, set[Any]] = {a: set() for a in axes}
    for r in rows:
        for a in axes:
            if a == "layout" and r.get("mode") == "none":
                continue
            if _axis(r, a) is not None:
                out[a].add(_axis(r, a))
    return {a: ([ALL] if a in ALL_AXES and len(v) > 1 else []) + sorted(v) for a, v in out.items()
            if v and (a not in PARAM_AXES or len(v) > 1)}


def _coerce(value: Any, like: Any) -> Any:
    if isinstance(like, bool) and isinstance(value, str):
        return value.lower() in ("true", "1")
    if isinstance(like, bool) or value is None:
        return value
    try:
        return type(like)(value)
    except (TypeError, ValueError):
        return value


def apply_slice(rows: Sequence[dict[str, Any]], selection: Mapping[str, Any]) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Rows on one value of each slice axis: `selection[axis]` where given and present, else the first value (ALL
    where offered: that axis keeps every value).

    Returns (rows, the selection used). Query-string values are coerced to the axis' type.
    """
    options = slice_options(rows)
    chosen: dict[str, Any] = {}
    for axis, values in options.items():
        want = _coerce(selection.get(axis), values[0])
        chosen[axis] = want if want in values else values[0]
    fixed = {a: v for a, v in chosen.items() if not (a in ALL_AXES and v == ALL)}
    kept = [r for r in rows
            if all(_axis(r, a) == v for a, v in fixed.items() if not (a == "layout" and r.get("mode") == "none"))]
    return kept, chosen


# the statuses the sweeps list shows and filters by: a finished sweep is "failed" when no point finished and some
# failed, "done with failures" when some did each (the store keeps "done" for both: every point was worked)
INDEX_STATUSES = ("queued", "running", "done", "done with failures", "failed", "cancelled")


def display_status(status: str, progress: Mapping[str, int]) -> str:
    """The status to show for a sweep stored as `status` with point counts `progress`."""
    if status != "done" or not progress.get("failed"):
        return status
    return "done with failures" if progress.get("done") else "failed"


def sweep_index(session: Session, *, name: str | None = None, tag: str | None = None, status: str | None = None,
                limit: int = INDEX_LIMIT) -> list[dict[str, Any]]:
    """Groups of sweeps, newest first: one group per regression run (its sweeps share a `regress-run:` tag), one
    per other sweep. A group is {"sweep": newest, "progress" (`crud.sweeps_progress`: per status, `total`,
    `unreliable`), "status" (shown), "members": [{"sweep", "progress",
    "status"}, ...] (newest first), "run": the run id or None, "tags": the newest's tags but the run tag}; the
    group's progress sums its members'.

    `name` keeps sweeps whose name contains it (case-insensitive), `tag` those carrying it, `status` those whose
    shown status (`display_status`) is it ("failed" also keeps "done with failures")."""
    sweeps, _ = crud.list_sweeps(session, skip=0, limit=limit, tag=tag or None)
    if name:
        sweeps = [s for s in sweeps if name.lower() in s.name.lower()]
    progress = crud.sweeps_progress(session, sweep_ids=[s.id for s in sweeps])
    members = [{"sweep": s, "progress": progress[s.id], "status": display_status(s.status, progress[s.id])} for s in sweeps]
    if status:
        members = [m for m in members if m["status"] == status or (status == "failed" and m["status"] == "done with failures")]
    groups: dict[Any, dict[str, Any]] = {}
    for m in members:
        run = regress_run(m["sweep"].tags)
        key = ("run", run) if run else ("sweep", m["sweep"].id)
        if key not in groups:
            groups[key] = {"sweep": m["sweep"], "run": run, "members": [], "progress": dict.fromkeys(m["progress"], 0),
                           "tags": [t for t in (m["sweep"].tags or []) if not t.startswith(REGRESS_RUN_TAG)]}
        g = groups[key]
        g["members"].append(m)
        for k, v in m["progress"].items():
            g["progress"][k] += v
    for g in groups.values():
        shown = [m["status"] for m in g["members"]]
        active = [s for s in shown if s in ("running", "queued")]
        g["status"] = active[0] if active else display_status(g["sweep"].status if len(shown) == 1 else "done", g["progress"])
    return list(groups.values())


def _trial_dict(t: TuningTrial) -> dict[str, Any]:
    return {c: getattr(t, c) for c in ("id", "sweep_id", "device_name", "kernel", "key", "key_str", "config", "strategy",
                                       "rung", "status", "median_ms", "n", "error", "created_at")}


def tuning_rows(session: Session, *, sweep_id: int | None = None, device_name: str | None = None,
                kernel: str | None = None) -> list[dict[str, Any]]:
    """Tuning trials, oldest first; `chosen` is True on the trial whose config is the stored winner of its key."""
    trials = crud.list_trials(session, kernel=kernel, sweep_id=sweep_id, device_name=device_name)
    winners = {(c.kernel, c.key_str, c.device_name): c.config for c in crud.list_tuned_configs(session, device_name=device_name)}
    rows = []
    for t in trials:
        row = _trial_dict(t)
        row["chosen"] = t.status == "ok" and winners.get((t.kernel, t.key_str, t.device_name)) == t.config
        rows.append(row)
    return rows


def tuned_config_rows(session: Session, *, device_name: str | None = None) -> list[dict[str, Any]]:
    """The winning configs with their margin over the runner-up and over the default config."""
    out = []
    for c in crud.list_tuned_configs(session, device_name=device_name):
        out.append({
            "kernel": c.kernel, "key": c.key_str, "device_name": c.device_name, "config": c.config,
            "median_ms": c.median_ms, "default_ms": c.default_ms, "runner_up_ms": c.runner_up_ms,
            "vs_runner_up": c.runner_up_ms / c.median_ms if c.runner_up_ms and c.median_ms else None,
            "vs_default": c.default_ms / c.median_ms if c.default_ms and c.median_ms else None,
            "sweep_id": c.sweep_id, "measured_at": c.measured_at,
        })
    return out


def _nightly_sweeps(session: Session) -> dict[int, Sweep]:
    judged = {r.sweep_id for r in crud.list_regression_results(session) if r.sweep_id is not None}
    return {s.id: s for s in crud.sweeps_by_age(session) if s.id in judged or NIGHTLY_TAG in (s.tags or [])}


def history_keys(session: Session, *, contains: str | None = None, limit: int = HISTORY_KEYS) -> list[str]:
    """Benchmark keys to show: those with a non-SAME verdict first (newest first), then any judged or nightly key."""
    verdicts = [(r.key, r.verdict) for r in reversed(crud.list_regression_results(session))]
    flagged = [k for k, v in verdicts if v != "SAME"]
    judged = [k for k, _ in verdicts]
    sweeps = list(_nightly_sweeps(session))
    nightly = crud.point_keys(session, sweep_ids=sweeps) if sweeps else []
    out: list[str] = []
    for k in (*flagged, *judged, *nightly):
        if k not in out and (contains is None or contains in k):
            out.append(k)
    return out[:limit]


def history_rows(session: Session, *, keys: Sequence[str]) -> list[dict[str, Any]]:
    """One row per (key, nightly sweep) with the point's median and the verdict given to that sweep's result."""
    sweeps = _nightly_sweeps(session)
    if not keys or not sweeps:
        return []
    verdicts: dict[tuple[str, int], RegressionResult] = {}
    for v in crud.list_regression_results(session, key=list(keys)):
        if v.sweep_id is not None:
            verdicts[(v.key, v.sweep_id)] = v  # the latest verdict on that sweep wins
    noisy = crud.unreliable_reasons(session, keys=keys, sweep_ids=list(sweeps))
    out: dict[tuple[str, int], dict[str, Any]] = {}
    for key, mode, sweep_id, med, p10, p90, device in crud.done_medians(session, keys=keys, sweep_ids=list(sweeps)):
        if (key, sweep_id) in out:  # repetitions of one key in a sweep: keep the first
            continue
        s, v = sweeps[sweep_id], verdicts.get((key, sweep_id))
        out[(key, sweep_id)] = {
            "key": key, "mode": mode, "device_name": device, "sweep_id": sweep_id, "sweep_name": s.name, "at": s.created_at,
            "median_ms": med, "p10_ms": p10, "p90_ms": p90, "verdict": v.verdict if v else None,
            "ratio": v.ratio if v else None, "q_value": v.q_value if v else None, "run_id": v.run_id if v else None,
            "baseline_ref": v.baseline_ref if v else None, "unreliable": noisy.get((key, sweep_id)),
        }
    return list(out.values())
