"""`cpbench db import` (runners/results_import.py): rows exported by `cpbench results -f json|csv` from one store fill
the unmeasured points with the same keys of a sweep in another, through the real CLI on real SQLite stores.

Scenario: store A runs a small CPU sweep (torch backend, two T) with a worker; its results are exported as JSON and
CSV. Store B holds a larger sweep (three T: a superset of A's keys); importing A's export fills B's two matching
points with A's summaries, profiles, environment and report (plus where they came from), leaves the third queued
for a worker, and a second import changes nothing. Bad input (not an export, no such sweep) is one line.
"""

from __future__ import annotations

import contextlib
import io
import json
import subprocess
from pathlib import Path

import pytest

from tests.runners.engine_fixtures import pg_store_url, write_spec  # noqa: F401

pytestmark = pytest.mark.multiproc

SUMMARY = ("n", "median_ms", "p10_ms", "p90_ms", "iqr_ms", "mean_ms", "min_ms", "max_ms", "clock", "stop_reason",
           "err_vs_none", "err_vs_reference", "host_syncs", "kernel_launches", "collectives", "device_name", "torch",
           "git_sha", "host")  # fmt: skip


def _cli(*args: str, ok: bool = True) -> subprocess.CompletedProcess[str]:
    """`cpbench ARGS` in this process (`runners.cli.main`: its one-line errors and exit codes), output captured."""
    from runners.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            main(list(args))
            code = 0
        except SystemExit as e:
            code = int(e.code or 0)
    assert (code == 0) == ok, out.getvalue() + err.getvalue()
    return subprocess.CompletedProcess(list(args), code, out.getvalue(), err.getvalue())


def _rows(url: str, sweep: int = 1) -> dict[str, dict]:
    return {r["key"]: r for r in json.loads(_cli("results", str(sweep), "-f", "json", "--db", url).stdout)}


def _store(tmp_path: Path, name: str, spec: Path) -> str:
    url = f"sqlite:///{tmp_path / name}"
    _cli("db", "upgrade", "--db", url)
    _cli("submit", str(spec), "--db", url)
    return url


def test_an_export_fills_the_same_keys_of_another_stores_sweep(tmp_path: Path) -> None:
    small = write_spec(tmp_path, "small.yaml", axes={"T": [128, 192]})
    large = write_spec(tmp_path, "large.yaml", axes={"T": [128, 192, 256]})
    a = _store(tmp_path, "a.db", small)
    _cli("worker", "--once", "--cpu", "--devices", "1", "--db", a)
    measured = _rows(a)
    assert [r["status"] for r in measured.values()] == ["done", "done"]
    (tmp_path / "a.json").write_text(_cli("results", "1", "-f", "json", "--db", a).stdout)
    (tmp_path / "a.csv").write_text(_cli("results", "1", "-f", "csv", "--db", a).stdout)

    for fmt in ("json", "csv"):
        b = _store(tmp_path, f"b_{fmt}.db", large)
        out = _cli("db", "import", str(tmp_path / f"a.{fmt}"), "--sweep", "1", "--db", b).stdout
        assert f"a.{fmt}: imported 2 row(s) into sweep 1" in out, out
        got = _rows(b)
        assert sorted(r["status"] for r in got.values()) == ["done", "done", "queued"]
        for key, want in measured.items():
            row = got[key]
            assert {f: row[f] for f in SUMMARY} == {f: want[f] for f in SUMMARY}, key
            assert row["peak_memory_bytes"] == want["peak_memory_bytes"] and row["attempts"] == want["attempts"] == 1
            imported = row["report"].pop("imported")
            assert imported == {"from": f"a.{fmt}", "sweep_id": 1, "point_id": want["point_id"],
                                "measured_at": want["measured_at"]}  # fmt: skip
            assert row["report"] == want["report"] and row["configs"] == want["configs"]
            assert row["measured_at"] == want["measured_at"], "an imported row keeps when it was measured"
        again = _cli("db", "import", str(tmp_path / f"a.{fmt}"), "--sweep", "1", "--db", b).stdout
        assert "imported 0 row(s)" in again and "left out 2 already measured there" in again, again

    # the point left queued is a worker's as usual; the sweep is done when it is
    _cli("worker", "--once", "--cpu", "--devices", "1", "--db", b)
    assert [r["status"] for r in _rows(b).values()] == ["done"] * 3
    assert "│ done " in _cli("status", "--db", b).stdout


def test_rows_of_other_keys_are_reported_not_imported(tmp_path: Path) -> None:
    from runners.results_import import import_rows

    url = _store(tmp_path, "c.db", write_spec(tmp_path, axes={"T": [128]}))
    key = next(iter(_rows(url)))
    row = {"key": "gdn/none/torch/B=1,T=999", "status": "done", "clock": "wall", "n": 3, "median_ms": 1.0,
           "p10_ms": 0.9, "p90_ms": 1.1, "iqr_ms": 0.1, "mean_ms": 1.0, "min_ms": 0.9, "max_ms": 1.1}  # fmt: skip
    summary = import_rows(url, 1, [row, {**row, "key": key, "status": "skipped"}], source="x.csv")
    assert (summary.imported, summary.not_in_sweep, summary.not_done) == ([], [row["key"]], 1)
    assert "left out 1 not in the sweep: gdn/none/torch/B=1,T=999" in summary.lines(1)
    with pytest.raises(ValueError, match=r"^x.csv: the done row of .* lacks median_ms$"):
        import_rows(url, 1, [{**row, "key": key, "median_ms": None}], source="x.csv")
    assert _rows(url)[key]["status"] == "queued"  # nothing half-written


@pytest.mark.parametrize(
    ("text", "suffix", "needle"),
    [
        ("a,b\n1,2\n", ".csv", "not a `cpbench results` export: it lacks the column(s) key, status, clock"),
        ('{"key": 1}', ".json", "not a `cpbench results -f json` export"),
        ("[{", ".json", "not JSON"),
        ("", ".txt", "the suffix must be .json or .csv"),
        (
            "key,status,clock,n,median_ms,p10_ms,p90_ms,iqr_ms,mean_ms,min_ms,max_ms,measured_at\n"
            "k,done,wall,3,1,1,1,0,1,1,1,yesterday\n",
            ".csv",
            "column 'measured_at' holds 'yesterday', not an ISO 8601 time",
        ),
    ],
)
def test_a_file_that_is_not_an_export_is_one_line(tmp_path: Path, text: str, suffix: str, needle: str) -> None:
    url = _store(tmp_path, "d.db", write_spec(tmp_path))
    bad = tmp_path / f"bad{suffix}"
    bad.write_text(text)
    proc = _cli("db", "import", str(bad), "--sweep", "1", "--db", url, ok=False)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and needle in lines[0], proc.stderr
    proc = _cli("db", "import", str(bad), "--sweep", "9", "--db", url, ok=False)
    assert needle in proc.stderr  # the file is read before the store is touched
    good = tmp_path / "empty.csv"
    good.write_text("key,status\n")
    proc = _cli("db", "import", str(good), "--sweep", "9", "--db", url, ok=False)
    assert proc.stderr.strip() == "error: no sweep 9 in this store (`cpbench status` lists them)"


def test_import_into_a_postgresql_store(tmp_path: Path, pg_store_url: str) -> None:  # noqa: F811
    """The same fill on PostgreSQL (the points are read FOR UPDATE there): a done row's summary and profile land on
    the matching point, and the sweep is done when nothing is left queued."""
    from runners.results_import import import_rows

    _cli("submit", str(write_spec(tmp_path, axes={"T": [128]})), "--db", pg_store_url)
    (key,) = _rows(pg_store_url)
    row = {"key": key, "status": "done", "clock": "wall", "n": 3, "median_ms": 1.25, "p10_ms": 1.2, "p90_ms": 1.3,
           "iqr_ms": 0.05, "mean_ms": 1.25, "min_ms": 1.2, "max_ms": 1.3, "host_syncs": 0, "kernel_launches": 7,
           "collectives": {"all_gather": 1}, "device_name": "NVIDIA H200", "torch": "2.11.0", "host": "gpu-7"}  # fmt: skip
    assert import_rows(pg_store_url, 1, [row], source="h200.csv").imported == [key]
    got = _rows(pg_store_url)[key]
    assert (got["status"], got["median_ms"], got["n"], got["kernel_launches"], got["collectives"]) == (
        "done",
        1.25,
        3,
        7,
        {"all_gather": 1},
    )
    assert (got["device_name"], got["host"], got["report"]["imported"]["from"]) == ("NVIDIA H200", "gpu-7", "h200.csv")
    assert "│ done " in _cli("status", "--db", pg_store_url).stdout
