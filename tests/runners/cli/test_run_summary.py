"""`cpbench run` ends with one summary line, and `cpbench results` shows each point's direction (issue 28).

Scenarios (in process, SQLite, the CPU):
- a sweep whose every point is skipped (headwise with H % W != 0, W above the two ranks present) says so, with each
  skip reason counted, and measures nothing;
- a point whose stop rule ran out of samples before the noise target is done but unreliable: the summary counts it
  (`1 done (1 unreliable ...), 0 skipped, 0 failed`), the table marks it and says why;
- the results table has a direction column (`fwd`).
"""

from __future__ import annotations

from pathlib import Path

from tests.runners.engine_fixtures import store_url, write_spec  # noqa: F401
from tests.utils.cli import cpbench as _cli


def _last_line(err: str) -> str:
    return [line for line in err.splitlines() if line.strip()][-1]


def test_a_sweep_whose_every_point_is_skipped_says_so_with_the_reasons(store_url: str, tmp_path: Path) -> None:  # noqa: F811
    spec = write_spec(tmp_path, modes=["headwise"], axes={"H": 3, "W": [2, 4]})
    code, out, err = _cli("run", str(spec), "--db", store_url, "--cpu", "--devices", "2")
    assert code == 0, err
    line = _last_line(err)
    assert line.startswith("sweep 1 (tiny): every point (2) was skipped, nothing was measured: "), line
    assert line.count("1 x ") == 2 and "W=4 is more than the 2 device(s) present" in line, line
    assert "headwise" in line and "H=3" in line, line


def test_run_summary_counts_unreliable_points_and_results_show_direction(store_url: str, tmp_path: Path) -> None:  # noqa: F811
    spec = write_spec(tmp_path, timing={"min_samples": 2, "max_samples": 3, "max_rel_iqr": 1e-12})
    code, out, err = _cli("run", str(spec), "--db", store_url, "--cpu", "--devices", "1")
    assert code == 0, err
    assert _last_line(err) == "sweep 1 (tiny): 1 done (1 unreliable: stop rule not converged), 0 skipped, 0 failed", err
    assert "done, unreliable" in out and "max_samples" in out, out
    code, out, _ = _cli("results", "1", "--db", store_url)
    assert code == 0
    header = next(line for line in out.splitlines() if " op " in line)
    assert "direction" in header and " fwd " in out, out
