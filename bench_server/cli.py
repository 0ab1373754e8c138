"""The `cpbench` command: the engine's verbs (`runners.cli`) plus `serve` (`bench_server.serve`).

The command's root sits here, at the top of the dependency graph (bench_server -> runners -> kernels.cp -> kernels),
because only here may both halves be imported: runners builds its verbs without knowing the server, and this
module adds the server's verb to the same typer app. `python -m bench_server` runs it too.
"""

from __future__ import annotations

from collections.abc import Sequence

from bench_server import serve
from runners.cli import app
from runners.cli import main as _run

__all__ = ["app", "main"]

serve.register(app)


def main(argv: Sequence[str] | None = None) -> None:
    """Entry point of the `cpbench` script; `argv` defaults to `sys.argv[1:]`."""
    _run(argv)
