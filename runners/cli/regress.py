"""`cpbench regress SUITE --baseline REF`: the verb; the workflow is `runners.regress_workflow.run_regression`.

    cpbench regress nightly --baseline nightly-baseline --record-baseline     # record the baseline
    cpbench regress nightly --baseline nightly-baseline --report-dir reports  # compare with it

Prints the verdict table and the report paths; exit status 1 on a confirmed SLOW or a CHANGED signal.
"""

from __future__ import annotations

from pathlib import Path

import typer

from runners.errors import CpbenchError
from runners.regress import Policy
from runners.regress_workflow import run_regression
from runners.report import console_table

__all__ = ["register"]


def regress_command(
    suite: str = typer.Argument(..., help="spec file, or a packaged suite name (nightly, nightly-cpu)"),
    baseline: str = typer.Option(..., "--baseline", "-b", help="tag, sweep id(s) '12,13', or a baseline JSON file"),
    runs: int = typer.Option(5, "--runs", min=1, help="runs per key in the confirm round (doubled on each rerun)"),
    screen_runs: int = typer.Option(2, "--screen-runs", min=0, help="runs of the whole suite in the screen round; 0: no screen"),
    max_reruns: int = typer.Option(2, "--max-reruns", min=0, help="reruns of INCONCLUSIVE keys after the confirm round"),
    report_dir: Path = typer.Option(Path("regress-report"), "--report-dir", help="where regress.md and regress-junit.xml go"),
    database_url: str | None = typer.Option(None, "--db", "--database-url", help="default: CPBENCH_DATABASE_URL"),
    tag: list[str] = typer.Option([], "--tag", help="extra tag on this run's sweeps; repeatable"),
    save_baseline: Path | None = typer.Option(None, "--save-baseline", help="also write this run's measurements as a baseline file"),
    record_baseline: bool = typer.Option(False, "--record-baseline", help="record --runs full runs tagged with the --baseline tag; compare nothing"),
    init_baseline: bool = typer.Option(False, "--init-baseline", help="record the baseline if no sweep carries its tag yet, else compare"),
    min_effect: float = typer.Option(0.01, "--min-effect", help="floor of the practical threshold (0.01 = 1%)"),
    alpha: float = typer.Option(0.05, "--alpha", help="Benjamini-Hochberg level across keys"),
    devices: int | None = typer.Option(None, "--devices", help="cap on GPUs (or CPU ranks) the runs use"),
) -> None:
    """Run a fixed suite and compare it with a baseline: exit 1 on a confirmed SLOW or a changed deterministic signal."""
    from runners.cli.common import out_console

    try:
        policy = Policy(alpha=alpha, min_effect=min_effect, max_effect=max(Policy().max_effect, min_effect))
    except ValueError as err:
        raise CpbenchError(str(err)) from None
    out = run_regression(suite, baseline=baseline, runs=runs, screen_runs=screen_runs, max_reruns=max_reruns,
                         report_dir=report_dir, database_url=database_url, tags=tag, save_baseline=save_baseline,
                         record_baseline=record_baseline, init_baseline=init_baseline, policy=policy, devices=devices,
                         echo=typer.echo)
    if out.recorded:
        return
    out_console().print(console_table(out.verdicts, title=f"cpbench regress {out.run_id} vs {baseline}"))
    md, xml = out.reports or (None, None)
    n_fail = sum(v.failed for v in out.verdicts)
    typer.echo(f"reports: {md} {xml}")
    typer.echo(f"{'FAIL' if n_fail else 'PASS'}: {n_fail} of {len(out.verdicts)} keys failed (SLOW or CHANGED)")
    if n_fail:
        raise typer.Exit(code=1)


def register(app: typer.Typer) -> None:
    """Add `regress` to the cpbench app (called by runners/cli/__init__.py)."""
    app.command("regress")(regress_command)
