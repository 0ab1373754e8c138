"""The regression workflow behind `cpbench regress SUITE --baseline REF` (runners/cli/regress.py is the verb):
run a fixed suite, compare every key with its baseline, report, store. `run_regression` is the whole flow.

    cpbench regress nightly --baseline nightly-baseline --record-baseline     # record the baseline
    cpbench regress nightly --baseline nightly-baseline --report-dir reports  # compare with it
    cpbench regress nightly-cpu --baseline 12,13,14 --runs 3 --screen-runs 0              # packaged suite, sweep ids

SUITE is a spec file or the name of a packaged suite (runners/suites/NAME.yaml). REF is a baseline file, sweep ids
or a tag (`runners.baseline`). Each *run* is one sweep of the suite, worked in this process (the queue is shared:
a worker elsewhere on the same store may take points too, so keep regression runs on a store of their own or on
the same machine class). The rounds follow runners/regress.py:

1. screen: `--screen-runs` runs of the whole suite; keys clearly unchanged are SAME, the rest go on;
2. confirm: `--runs` fresh runs of the flagged keys only -> SLOW / FAST / SAME / INCONCLUSIVE;
3. rerun: INCONCLUSIVE keys again with twice the runs, at most `--max-reruns` times.

Deterministic signals are compared in every round. The verdicts are stored (`regression_results`, one row per key),
written as Markdown and JUnit XML into `--report-dir`, and printed; the exit status is 1 on a confirmed SLOW or a
CHANGED signal, 0 otherwise (INCONCLUSIVE never fails). `--record-baseline` runs `--runs` full runs tagged REF and
compares nothing; `--init-baseline` does the same only when no sweep carries the tag REF yet.
"""

from __future__ import annotations

import dataclasses
import importlib.resources
import logging
import re
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from runners.baseline import RUN_TAG_PREFIX, Side, collect_runs, resolve_baseline, save_baseline_file, tagged_sweeps
from runners.errors import CpbenchError, SpecError
from runners.regress import KeyVerdict, Policy, Run, decide
from runners.report import ReportMeta, write_reports
from runners.spec import SweepSpec, load_spec

__all__ = ["RegressOutcome", "load_suite", "run_regression"]

logger = logging.getLogger(__name__)

Echo = Callable[[str], None]


@dataclasses.dataclass
class RegressOutcome:
    """What one `cpbench regress` invocation did."""

    run_id: str
    verdicts: list[KeyVerdict]
    new_sweeps: list[int]
    baseline: Side | None
    reports: tuple[Path, Path] | None
    recorded: bool = False

    @property
    def failed(self) -> bool:
        return any(v.failed for v in self.verdicts)


def load_suite(suite: str) -> SweepSpec:
    """A spec file path, or the name of a packaged suite (`nightly`, `nightly-cpu`)."""
    p = Path(suite)
    if p.suffix.lower() in (".yaml", ".yml", ".json") or p.exists():
        return load_spec(p)
    root = importlib.resources.files("runners") / "suites"
    packaged = root / f"{suite}.yaml"
    if packaged.is_file():
        with importlib.resources.as_file(packaged) as path:
            return load_spec(path)
    names = sorted(x.name[: -len(".yaml")] for x in root.iterdir() if x.name.endswith(".yaml"))
    raise SpecError(f"suite {suite!r} is neither a spec file nor a packaged suite (packaged: {', '.join(names)})")


def _device_name(devices: int | None) -> tuple[str, int]:
    from runners.worker import detect_devices

    info = detect_devices(devices)
    return (info.names[0] if info.kind == "cuda" and info.names else "cpu"), info.count


def _submit(session: Any, spec: SweepSpec, *, keys: set[str] | None, max_W: int, owner: str | None = None) -> int:
    """Store one run of the suite as a sweep; with `keys`, only those keys' points (the rest of the grid is left out)."""
    from runners.engine import submit_spec
    from runners.grid import available_backends

    return submit_spec(session, spec, max_W=max_W, backends=available_backends(), keys=keys, owner=owner).id


def _sweep_status(session: Any, sweep_id: int) -> str:
    from db import crud

    sweep = crud.get_sweep(session, sweep_id=sweep_id)
    if sweep is None:
        raise CpbenchError(f"regression sweep {sweep_id} is gone from the store")
    return sweep.status


class _LocalWorker:
    """One worker in a background thread for the whole invocation, so its rank gangs are spawned once and reused
    by every round (a round's sweeps are worked in queue order). It owns the run's sweeps (`owner`): it claims only
    them, and no other worker on the store does, so every timing of a regression run comes from this one worker."""

    def __init__(self, url: str, devices: int | None) -> None:
        from runners.engine import new_owner

        self.url, self.devices, self.owner = url, devices, new_owner("regress")
        self.stop = threading.Event()
        self.thread: threading.Thread | None = None
        self.error: BaseException | None = None

    def _main(self) -> None:
        from runners.worker import run_worker

        try:
            run_worker(self.url, devices=self.devices, stop_event=self.stop, owner=self.owner)
        except BaseException as err:  # noqa: BLE001 - handed to the waiting thread, which raises it
            self.error = err

    def wait(self, ids: Sequence[int], poll_s: float = 0.2) -> None:
        """Work until every sweep in `ids` is done or cancelled."""
        from db.session import session_scope

        if self.thread is None:
            self.thread = threading.Thread(target=self._main, name="cpbench-regress-worker", daemon=True)
            self.thread.start()
        while True:
            with session_scope(self.url) as s:
                if all(_sweep_status(s, sid) in ("done", "cancelled") for sid in ids):
                    return
            if not self.thread.is_alive():
                raise CpbenchError(f"the regression worker stopped before sweeps {list(ids)} were done: {self.error!r}")
            time.sleep(poll_s)

    def close(self) -> None:
        if self.thread is not None:
            self.stop.set()
            self.thread.join()
            self.thread = None


def _run_round(url: str, worker: _LocalWorker, spec: SweepSpec, *, n_runs: int, keys: set[str] | None,
               tags: Sequence[str], max_W: int, echo: Echo, label: str) -> tuple[list[int], dict[str, list[Run]]]:
    """Submit `n_runs` sweeps of the suite (or of `keys`), work them here, and read back their runs."""
    from db.session import session_scope

    tagged = spec.model_copy(update={"tags": list(dict.fromkeys([*spec.tags, *tags]))})
    with session_scope(url) as s:
        ids = [_submit(s, tagged, keys=keys, max_W=max_W, owner=worker.owner) for _ in range(n_runs)]
    what = "the whole suite" if keys is None else f"{len(keys)} key(s)"
    echo(f"{label}: {n_runs} run(s) of {what}: sweeps {', '.join(map(str, ids))}")
    worker.wait(ids)
    with session_scope(url) as s:
        cancelled = [sid for sid in ids if _sweep_status(s, sid) == "cancelled"]
        if cancelled:
            raise CpbenchError(f"regression sweeps {cancelled} were cancelled; the run is incomplete")
        runs, _ = collect_runs(s, sweep_ids=ids, keys=keys)
    return ids, runs


def _merge(old: KeyVerdict | None, new: KeyVerdict) -> KeyVerdict:
    """The later round's verdict, keeping every deterministic change seen in earlier rounds."""
    if old is None or not old.changes:
        return new
    changes = list(new.changes) + [c for c in old.changes if c not in new.changes]
    return dataclasses.replace(new, changes=tuple(changes))


def _only_skipped(runs: Iterable[Run]) -> bool:
    runs = list(runs)
    return bool(runs) and all(r.signals.get("status") == "skipped" for r in runs)


def run_regression(
    suite: str,
    *,
    baseline: str,
    runs: int = 5,
    screen_runs: int = 2,
    max_reruns: int = 2,
    report_dir: str | Path = "regress-report",
    database_url: str | None = None,
    tags: Sequence[str] = (),
    save_baseline: str | Path | None = None,
    record_baseline: bool = False,
    init_baseline: bool = False,
    policy: Policy | None = None,
    devices: int | None = None,
    echo: Echo = logger.info,
) -> RegressOutcome:
    """The whole `cpbench regress` flow (module docstring); returns the verdicts, and raises CpbenchError on misuse."""
    from db.migrate import require_migrated
    from db.session import resolve_url, session_scope

    if runs < 1 or screen_runs < 0 or max_reruns < 0:
        raise CpbenchError(f"--runs must be >= 1, --screen-runs and --max-reruns >= 0; got runs={runs}, "
                           f"screen_runs={screen_runs}, max_reruns={max_reruns}")
    spec = load_suite(suite)
    url = resolve_url(database_url)
    require_migrated(url)
    policy = policy or Policy()
    run_id = f"{datetime.now(timezone.utc):%Y%m%dT%H%M%SZ}-{uuid.uuid4().hex[:6]}"
    base_tags = ["regress", f"{RUN_TAG_PREFIX}{run_id}", *tags]
    device, max_W = _device_name(devices)

    is_tag = not (re.fullmatch(r"\d+(\s*,\s*\d+)*", baseline) or baseline.lower().endswith(".json") or Path(baseline).is_file())
    if (record_baseline or init_baseline) and not is_tag:
        raise CpbenchError(f"--record-baseline/--init-baseline need --baseline to be a tag, got {baseline!r}")
    if init_baseline and not record_baseline:
        with session_scope(url) as s:
            record_baseline = not tagged_sweeps(s, baseline)
        if record_baseline:
            echo(f"no sweep is tagged {baseline!r} yet: recording this run as the baseline")

    worker = _LocalWorker(url, devices)
    try:
        return _regress(url, spec, worker, run_id=run_id, baseline=baseline, runs=runs, screen_runs=screen_runs,
                        max_reruns=max_reruns, report_dir=report_dir, base_tags=base_tags, save_baseline=save_baseline,
                        record_baseline=record_baseline, policy=policy, device=device, max_W=max_W, echo=echo)
    finally:
        worker.close()


def _regress(url: str, spec: SweepSpec, worker: _LocalWorker, *, run_id: str, baseline: str, runs: int,
             screen_runs: int, max_reruns: int, report_dir: str | Path, base_tags: list[str],
             save_baseline: str | Path | None, record_baseline: bool, policy: Policy, device: str, max_W: int,
             echo: Echo) -> RegressOutcome:
    if record_baseline:
        return _record(url, spec, worker, run_id=run_id, baseline=baseline, runs=runs, base_tags=base_tags,
                       save_baseline=save_baseline, device=device, max_W=max_W, echo=echo)
    return _compare(url, spec, worker, run_id=run_id, baseline=baseline, runs=runs, screen_runs=screen_runs,
                    max_reruns=max_reruns, report_dir=report_dir, base_tags=base_tags, save_baseline=save_baseline,
                    policy=policy, device=device, max_W=max_W, echo=echo)


def _record(url: str, spec: SweepSpec, worker: _LocalWorker, *, run_id: str, baseline: str, runs: int,
            base_tags: list[str], save_baseline: str | Path | None, device: str, max_W: int, echo: Echo) -> RegressOutcome:
    """`--record-baseline`: `runs` full runs tagged with the baseline tag; nothing is compared."""
    ids, new_runs = _run_round(url, worker, spec, n_runs=runs, keys=None, tags=[*base_tags, baseline], max_W=max_W,
                               echo=echo, label="record")
    side = Side(ref=baseline, runs=new_runs, sweep_ids=ids, device=device, suite=spec.name)
    if save_baseline:
        echo(f"baseline written to {save_baseline_file(save_baseline, side)}")
    echo(f"recorded baseline {baseline!r}: {len(new_runs)} keys x {runs} run(s), sweeps {', '.join(map(str, ids))}")
    return RegressOutcome(run_id=run_id, verdicts=[], new_sweeps=ids, baseline=side, reports=None, recorded=True)


def _compare(url: str, spec: SweepSpec, worker: _LocalWorker, *, run_id: str, baseline: str, runs: int,
             screen_runs: int, max_reruns: int, report_dir: str | Path, base_tags: list[str],
             save_baseline: str | Path | None, policy: Policy, device: str, max_W: int, echo: Echo) -> RegressOutcome:
    """The screen, confirm and rerun rounds against the baseline, then the stored verdicts and the reports."""
    from db import crud
    from db.session import session_scope

    with session_scope(url) as s:
        base = resolve_baseline(s, baseline)
    if base.device and base.device != device:
        raise CpbenchError(f"the baseline {baseline!r} was measured on {base.device!r} but this machine is {device!r}; "
                           "timings are only compared on the same device")
    from runners.grid import expand

    suite_keys = {p["key"] for p in expand(spec)}
    base_runs = {k: v for k, v in base.runs.items() if k in suite_keys}
    notes: list[str] = []
    if len(base_runs) < len(base.runs):
        notes.append(f"{len(base.runs) - len(base_runs)} baseline key(s) are not in this suite and were ignored.")

    final: dict[str, KeyVerdict] = {}
    decided_in: dict[str, int] = {}
    all_new: dict[str, list[Run]] = {}
    new_ids: list[int] = []
    no_baseline: set[str] = set()

    def judge(stage: str, ids: list[int], new: dict[str, list[Run]], keys: Iterable[str]) -> list[str]:
        for k, rs in new.items():
            all_new.setdefault(k, []).extend(rs)
        base_sub = {k: base_runs[k] for k in keys if k in base_runs and not (_only_skipped(base_runs[k]) and _only_skipped(new.get(k, ())))}
        verdicts, rerun = decide(base_sub, new, policy=policy, stage=stage)  # type: ignore[arg-type]
        for v in verdicts:
            final[v.key] = _merge(final.get(v.key), v)
            decided_in[v.key] = ids[0]
        return rerun

    pending: set[str] | None = None
    if screen_runs:
        ids, new = _run_round(url, worker, spec, n_runs=screen_runs, keys=None, tags=base_tags, max_W=max_W,
                              echo=echo, label="screen")
        new_ids += ids
        no_baseline = {k for k in new if k not in base_runs and not _only_skipped(new[k])}
        pending = set(judge("screen", ids, new, base_runs))
    k = runs
    for attempt in range(max_reruns + 1):
        if pending is not None and not pending:
            break
        label = "confirm" if attempt == 0 else f"rerun {attempt}"
        ids, new = _run_round(url, worker, spec, n_runs=k, keys=pending, tags=base_tags, max_W=max_W,
                              echo=echo, label=label)
        new_ids += ids
        if pending is None:
            no_baseline = {key for key in new if key not in base_runs and not _only_skipped(new[key])}
        pending = set(judge("confirm", ids, new, pending if pending is not None else base_runs))
        k *= 2

    verdicts = sorted(final.values(), key=lambda v: v.key)
    if not verdicts:
        notes.append("Nothing was compared: no key of this suite has a baseline.")
    skipped_both = len(base_runs) - len(verdicts)
    if skipped_both > 0:
        notes.append(f"{skipped_both} key(s) were skipped on both sides (e.g. W above the devices) and not judged.")
    meta = ReportMeta(suite=spec.name, run_id=run_id, baseline_ref=baseline, baseline_sweeps=base.sweep_ids,
                      new_sweeps=new_ids, device=device, no_baseline=sorted(no_baseline), notes=notes)
    with session_scope(url) as s:
        crud.store_regression_results(s, rows=[{
            "run_id": run_id, "suite": spec.name, "sweep_id": decided_in.get(v.key), "baseline_ref": baseline,
            "key": v.key, "verdict": v.status, "ratio": v.ratio, "effect_log": v.effect_log, "p_welch": v.p_welch,
            "p_mannwhitney": v.p_mannwhitney, "q_value": v.q_value,
            "detail": {**v.as_detail(), "baseline_sweeps": list(base.sweep_ids), "new_sweeps": new_ids},
        } for v in verdicts])
    reports = write_reports(verdicts, meta, report_dir)
    if save_baseline:
        path = save_baseline_file(save_baseline, Side(ref=run_id, runs=all_new, sweep_ids=new_ids, device=device,
                                                      suite=spec.name))
        echo(f"this run's measurements written to {path}")
    return RegressOutcome(run_id=run_id, verdicts=verdicts, new_sweeps=new_ids, baseline=base, reports=reports)
