"""Every `cpbench` verb given a bad argument prints one line on stderr (no traceback) and exits 1; the Triton
interpreter is turned on by the CLI itself for CPU runs.

Scenarios: a bad value, a missing argument, an unknown option or sub-command, a missing file, an unknown sweep, for
each verb (run, submit, worker, status, results, db, serve, configs, tune, regress, bench) and an unknown verb;
`use_interpreter_if_cpu` sets TRITON_INTERPRET=1 for the kernel verbs on the CPU and only then, never overriding a
value the user set; `available_backends` offers triton only with a GPU or the interpreter; a triton-backend sweep
run by `cpbench run` in a fresh process without a GPU and without TRITON_INTERPRET finishes its point.
Issue 28's command lines, each run as a real `cpbench` process: a malformed `--db`, an unreachable PostgreSQL URL
(run, status, serve), `serve --port` out of range, `tune --device cuda` on a CPU host, a negative tune shape, a bad
tune budget or kernel, tune against an unmigrated store (before any kernel runs), an empty token file: one line on
stderr, exit 1; `worker --name '[/x]'` prints its name as given at exit.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from runners.cli import triton_cpu
from runners.cli.triton_cpu import use_interpreter_if_cpu, verb_of
from tests.runners.engine_fixtures import REPO, store_url, write_spec  # noqa: F401
from tests.utils.cli import cpbench as _cli

BAD = {
    "results-not-an-id": (("results", "abc"), "Invalid value for 'sweep'"),
    "results-missing-id": (("results",), "Missing argument"),
    "results-unknown-sweep": (("results", "99999", "--db", "{db}"), "no sweep with id 99999"),
    "status-not-an-id": (("status", "abc"), "Invalid value for 'sweep'"),
    "run-missing-spec": (("run", "nosuch.yaml", "--db", "{db}"), "nosuch.yaml not found"),
    "run-zero-devices": (("run", "{spec}", "--devices", "0", "--db", "{db}"), "'--devices'"),
    "run-unknown-option": (("run", "{spec}", "--frob"), "No such option: --frob"),
    "submit-missing-spec": (("submit", "nosuch.yaml", "--db", "{db}"), "nosuch.yaml not found"),
    "worker-zero-devices": (("worker", "--devices", "0"), "'--devices'"),
    "worker-bad-lease": (("worker", "--lease-s", "soon"), "'--lease-s'"),
    "db-unknown-command": (("db", "frob"), "No such command 'frob'"),
    "serve-bad-port": (("serve", "--port", "eighty"), "'--port'"),
    "configs-missing-value": (("configs", "export", "--device"), "requires an argument"),
    "configs-unknown-command": (("configs", "frob"), "No such command 'frob'"),
    "tune-unknown-op": (("tune", "--op", "xyz", "--shape", "B=1,T=64", "--db", "{db}"), "op must be one of"),
    "tune-bad-shape": (("tune", "--op", "gdn", "--shape", "T=abc", "--db", "{db}"), "T must be an integer"),
    "regress-unknown-suite": (("regress", "nosuch", "--baseline", "x", "--db", "{db}"), "neither a spec file"),
    "bench-unknown-target": (("bench", "frob"), "unknown bench target 'frob'"),
    "gc-bad-age": (("gc", "--min-age-s", "old"), "'--min-age-s'"),
    "unknown-verb": (("frob",), "No such command 'frob'"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_argument_one_line_exit_1(case: str, store_url: str, tmp_path: Path) -> None:  # noqa: F811
    args, expected = BAD[case]
    spec = write_spec(tmp_path)
    code, out, err = _cli(*(a.format(db=store_url, spec=spec) for a in args))
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 1, (case, code, err)
    assert len(lines) == 1 and lines[0].startswith("error:"), (case, err)
    assert expected in lines[0], (case, lines[0])
    assert "Traceback" not in err and out == ""


def test_run_refuses_a_plugin_module_unless_the_setting_allows_it(store_url: str, tmp_path: Path,  # noqa: F811
                                                                  plugin_modules: Any) -> None:
    ref = "tests.plugins.torch_peer:PEER"
    spec = write_spec(tmp_path, backends=[ref], ops=["kda"], axes={"T": 64, "K": 16, "V": 16})
    plugin_modules("")
    code, out, err = _cli("run", str(spec), "--db", store_url, "--cpu", "--devices", "1")
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 1 and len(lines) == 1 and lines[0].startswith("error:"), err
    assert f"backend '{ref}' is refused" in lines[0] and "CPBENCH_PLUGIN_MODULES" in lines[0]

    plugin_modules("tests.plugins.torch_peer")
    code, out, err = _cli("run", str(spec), "--db", store_url, "--cpu", "--devices", "1")
    assert code == 0, err
    assert "torchpeer" in out


def test_every_verb_has_a_bad_argument_case() -> None:
    from bench_server.cli import app

    verbs = {c.name for c in app.registered_commands} | {g.name for g in app.registered_groups}
    covered = {verb_of(args) for args, _ in BAD.values()}
    assert verbs and verbs <= covered, verbs - covered


@pytest.mark.parametrize(("argv", "cuda", "expected"), [
    (["run", "spec.yaml"], False, True),
    (["-v", "worker", "--once"], False, True),
    (["tune", "--op", "gdn", "--device", "cpu"], True, True),  # a GPU host, but this run is on the CPU
    (["run", "spec.yaml", "--cpu"], True, True),
    (["run", "spec.yaml"], True, False),  # the GPU runs Triton
    (["serve"], False, False),  # serving runs no kernel
    (["serve", "--demo"], False, True),
    (["status"], False, False),
    (["run", "--help"], False, False),
])
def test_interpreter_set_for_cpu_kernel_runs(argv: list[str], cuda: bool, expected: bool,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.setattr(triton_cpu, "_triton_imported", lambda: False)
    assert use_interpreter_if_cpu(argv, cuda_available=lambda: cuda) is expected
    assert (os.environ.get("TRITON_INTERPRET") == "1") is expected


def test_interpreter_leaves_user_value(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    assert use_interpreter_if_cpu(["run", "x.yaml"], cuda_available=lambda: False) is False
    assert os.environ["TRITON_INTERPRET"] == "0"


def test_triton_backend_offered_only_with_gpu_or_interpreter(monkeypatch: pytest.MonkeyPatch) -> None:
    import runners.grid as grid

    monkeypatch.setattr(grid, "_cuda", lambda: False)
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert "triton" in grid.available_backends()
    monkeypatch.delenv("TRITON_INTERPRET")
    assert "triton" not in grid.available_backends()
    monkeypatch.setattr(grid, "_cuda", lambda: True)
    assert "triton" in grid.available_backends()


def test_triton_run_on_cpu_without_interpreter_env(store_url: str, tmp_path: Path) -> None:  # noqa: F811
    """A fresh `cpbench run` (no TRITON_INTERPRET, CUDA hidden) of a triton point: the CLI turns the interpreter on."""
    spec = write_spec(tmp_path, backends=["triton"], axes={"T": 64, "H": 1, "K": 16, "V": 16, "dtype": "float32"},
                      timing={"min_samples": 1, "max_samples": 2, "min_time_s": 0.0, "warmup_s": 0.0, "timeout_s": 5},
                      check={"reference_tokens": 64})
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.update(CUDA_VISIBLE_DEVICES="", PYTHONPATH=str(REPO))
    proc = subprocess.run([sys.executable, "-m", "runners.cli", "run", str(spec), "--db", store_url, "--format", "json"],
                          env=env, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = json.loads(proc.stdout)
    assert [(r["backend"], r["status"]) for r in rows] == [("triton", "done")], rows
    assert rows[0]["err_vs_reference"] < 1e-4


def test_default_log_leaves_out_what_a_user_cannot_act_on(monkeypatch: pytest.MonkeyPatch) -> None:
    import logging
    import warnings

    from runners.cli import logs

    monkeypatch.delenv("KINETO_LOG_LEVEL", raising=False)
    monkeypatch.delenv("PYTHONWARNINGS", raising=False)
    monkeypatch.setattr(logging.getLogger("alembic"), "level", logging.NOTSET)
    with warnings.catch_warnings():
        logs.quiet(1)  # -v: everything stays
        assert "KINETO_LOG_LEVEL" not in os.environ and logging.getLogger("alembic").level == logging.NOTSET
        logs.quiet(0)
        assert os.environ["KINETO_LOG_LEVEL"] == logs.KINETO_SILENT
        assert logs.ALL_GATHER_WARNING in os.environ["PYTHONWARNINGS"]
        assert logging.getLogger("alembic").getEffectiveLevel() == logging.WARNING
        with warnings.catch_warnings(record=True) as seen:
            warnings.warn(f"{logs.ALL_GATHER_WARNING}. Please use `all_gather_single` instead.", FutureWarning, stacklevel=1)
            warnings.warn("another FutureWarning", FutureWarning, stacklevel=1)
        assert [str(w.message) for w in seen] == ["another FutureWarning"]
    monkeypatch.setenv("KINETO_LOG_LEVEL", "1")  # the user's choice is kept
    logs.quiet(0)
    assert os.environ["KINETO_LOG_LEVEL"] == "1"


UNREACHABLE_PG = "postgresql+psycopg://cpbench:secret@127.0.0.1:1/cpbench"  # nothing listens on port 1
TUNE = ("tune", "--op", "gdn", "--shape", "B=1,T=64,H=1,K=16,V=16,dtype=float32")
ONE_LINE = {
    "db-not-a-url": (("status", "--db", "notaurl"), "invalid store URL"),
    "run-unreachable-postgres": (("run", "{spec}", "--db", UNREACHABLE_PG), "store unreachable"),
    "status-unreachable-postgres": (("status", "--db", UNREACHABLE_PG), "store unreachable"),
    "serve-unreachable-postgres": (("serve", "--port", "0", "--db", UNREACHABLE_PG), "store unreachable"),
    "serve-port-too-large": (("serve", "--port", "99999", "--db", "{db}"), "'--port'"),
    "serve-port-negative": (("serve", "--port", "-5", "--db", "{db}"), "'--port'"),
    "tune-cuda-on-cpu-host": ((*TUNE, "--device", "cuda", "--db", "{db}"), "no CUDA device"),
    "tune-negative-shape": (("tune", "--op", "gdn", "--shape", "B=1,T=-64", "--db", "{db}"), "T must be a positive"),
    "tune-negative-budget": ((*TUNE, "--budget", "-1", "--db", "{db}"), "'--budget'"),
    "tune-unknown-kernel": ((*TUNE, "--kernel", "nosuch", "--db", "{db}"), "unknown kernel(s) nosuch"),
    "tune-unmigrated-store": ((*TUNE, "--db", "{raw}"), "is not migrated"),
    "serve-empty-token-file": (("serve", "--port", "0", "--db", "{db}"), "is empty"),
}


def _cpbench_process(args: tuple[str, ...], cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    """`cpbench ARGS` as a real process on the CPU (the user's view: stderr, exit code)."""
    full = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "PYTHONPATH": str(REPO), **env}
    return subprocess.run([sys.executable, "-m", "bench_server", *args], env=full, capture_output=True, text=True,
                          timeout=120, cwd=cwd)


@pytest.mark.parametrize("case", list(ONE_LINE))
def test_issue_28_command_lines_one_line_exit_1(case: str, store_url: str, tmp_path: Path) -> None:  # noqa: F811
    args, expected = ONE_LINE[case]
    spec, empty = write_spec(tmp_path), tmp_path / "empty_token"
    empty.write_text("")
    empty.chmod(0o600)  # private, so the emptiness is what is refused (a shared file is refused first)
    raw = f"sqlite:///{tmp_path / 'raw.db'}"
    proc = _cpbench_process(tuple(a.format(db=store_url, spec=spec, raw=raw) for a in args), tmp_path,
                            CPBENCH_TOKEN_FILE=str(empty))
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert proc.returncode == 1, (case, proc.returncode, proc.stderr[-3000:])
    assert len(lines) == 1 and lines[0].startswith("error:"), (case, proc.stderr[-3000:])
    assert expected in lines[0], (case, lines[0])
    assert "secret" not in proc.stderr and proc.stdout == "", (case, proc.stdout)


def test_worker_name_with_markup_is_printed_as_given(store_url: str, tmp_path: Path) -> None:  # noqa: F811
    proc = _cpbench_process(("worker", "--once", "--name", "[/x]", "--db", store_url), tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr and "worker [/x]:" in proc.stderr, proc.stderr
