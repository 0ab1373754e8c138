"""The `cpbench` command run in process for tests: (exit code, stdout, stderr)."""

from __future__ import annotations

import contextlib
import io

__all__ = ["cpbench"]


def cpbench(*args: str) -> tuple[int, str, str]:
    """`cpbench ARGS` (the whole command: runners' verbs and `serve`), its exit code and what it printed."""
    from bench_server.cli import main

    out, err = io.StringIO(), io.StringIO()
    code = 0
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            main(list(args))
        except SystemExit as e:
            code = int(e.code or 0)
    return code, out.getvalue(), err.getvalue()
