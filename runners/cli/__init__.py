"""The `cpbench` command (typer + rich): one verb per module, each exposing `register(app)`.

    cpbench db upgrade                          migrate the store (SQLite file by default, CPBENCH_DATABASE_URL)
    cpbench run runners/suites/demo.yaml        submit a sweep and work it here until done; progress bar, result table
    cpbench submit SPEC                         queue a sweep for workers
    cpbench worker [--once]                     work the queue (persistent rank gangs; SIGTERM releases the point)
    cpbench status [SWEEP]                      sweeps, workers, or one sweep's progress and failures
    cpbench results SWEEP --format table|csv|json
    cpbench serve [--demo]                      the API and dashboards (added by `bench_server.cli`, see below)
    cpbench configs export -o autotune.json     tuned configs as the autotune JSON; `cpbench tune` fills the store
    cpbench regress SUITE --baseline REF        nightly regression
    cpbench bench kernels|cp [ARGS...]          the GPU benchmarks of the kernel suite

Verbs written elsewhere (`configs` with `tune`, `regress`, `bench`) are added when their module is importable.
`serve` belongs to the server: `bench_server.cli` (the `cpbench` script) adds it to this app, so the import graph
stays one-way (bench_server -> runners); `python -m runners.cli` is the engine's command without `serve`. Every verb
that uses the store takes `--db URL` (alias `--database-url`).
User mistakes (`CpbenchError`, an unmigrated store, a malformed or unreachable store URL, a bad verb, option or
value) print one red line and exit 1; anything else is a bug and keeps its traceback. The verbs that run kernels on the CPU turn the Triton interpreter
on themselves (`runners.cli.triton_cpu`). `-v` logs at INFO, `-vv` at DEBUG (to stderr); without it, lines a user
cannot act on stay out (`runners.cli.logs`).
"""

from __future__ import annotations

import importlib
import logging
import sys
from collections.abc import Sequence

import click
import pydantic
import typer
from rich.console import Console
from rich.markup import escape

from runners.errors import CpbenchError

__all__ = ["app", "main"]

logger = logging.getLogger(__name__)

app = typer.Typer(
    name="cpbench",
    help="Benchmark and tune context-parallel GDN/KDA kernels: sweeps, workers, results.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

VERBS = ("run", "submit", "worker", "status", "results", "db", "gc")
OPTIONAL_VERBS = ("configs", "regress", "bench")


@app.callback()
def _root(
    verbose: int = typer.Option(0, "--verbose", "-v", count=True, help="log INFO (-v) or DEBUG (-vv) to stderr"),
) -> None:
    """cpbench: CP kernel benchmarking service."""
    from runners.cli.logs import quiet

    quiet(verbose)  # alembic INFO, Kineto's USDT lines, torch's all_gather FutureWarning: only at -v
    if verbose:
        level = logging.INFO if verbose == 1 else logging.DEBUG
        logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)
        logging.getLogger().setLevel(level)


def _register_all() -> None:
    for verb in VERBS:
        importlib.import_module(f"runners.cli.{verb}").register(app)
    for verb in OPTIONAL_VERBS:
        module_name = f"runners.cli.{verb}"
        try:
            module = importlib.import_module(module_name)
        except ModuleNotFoundError as err:
            if err.name == module_name:
                continue
            logger.warning("cpbench %s is unavailable: %s", verb, err)
            continue
        module.register(app)


_register_all()


def _fail(message: str) -> None:
    Console(stderr=True, highlight=False, soft_wrap=True).print(f"[bold red]error:[/bold red] {escape(message)}")
    raise SystemExit(1)


def _settings_error(err: pydantic.ValidationError) -> str | None:
    """One line for a bad CPBENCH_* environment variable (a settings class failed to load), else None."""
    if not err.title.endswith("Settings"):
        return None
    parts = []
    for e in err.errors():
        name = "CPBENCH_" + "_".join(str(x) for x in e.get("loc", ()))
        parts.append(f"{name}={e.get('input')!r}: {e.get('msg')}")
    return "invalid setting " + "; ".join(parts) + " (see ENVIRONMENT.md)"


def _click_errors() -> tuple[tuple[type[BaseException], ...], tuple[type[BaseException], ...]]:
    """(usage/parameter errors, aborts) of click and of the click that typer vendors (typer >= 0.17, `typer._click`),
    whichever parses the command line."""
    usage: list[type[BaseException]] = [click.exceptions.ClickException]
    aborts: list[type[BaseException]] = [click.exceptions.Abort]
    for module, names in (("typer._click.exceptions", ("ClickException",)), ("typer.exceptions", ("Abort",))):
        try:
            found = importlib.import_module(module)
        except ImportError:
            continue
        for name in names:
            if isinstance(cls := getattr(found, name, None), type):
                (usage if name == "ClickException" else aborts).append(cls)
    return tuple(usage), tuple(aborts)


def _usage_line(err: BaseException) -> str:
    """One line for a bad command line: the parser's message and where the help is."""
    message = " ".join(str(getattr(err, "format_message", lambda: str(err))()).split())
    ctx = getattr(err, "ctx", None)
    where = ctx.command_path if ctx is not None and getattr(ctx, "command_path", None) else "cpbench"
    return f"{message} (see `{where} --help`)"


def _store_error(err: BaseException) -> str | None:
    """One line for a store the command cannot use (a malformed URL, an unreachable server), else None."""
    from sqlalchemy import exc as sa_exc

    from db.retry import StoreUnavailable

    if isinstance(err, sa_exc.ArgumentError):
        return f"invalid store URL (--db / CPBENCH_DATABASE_URL): {' '.join(str(err).split())}"
    if isinstance(err, (sa_exc.OperationalError, sa_exc.InterfaceError)):
        first = str(getattr(err, "orig", None) or err).strip().splitlines()[:1]
        return f"store unreachable: {first[0] if first else type(err).__name__} (check --db / CPBENCH_DATABASE_URL)"
    if isinstance(err, StoreUnavailable):
        return f"store unavailable: {' '.join(str(err).split())}"
    return None


def main(argv: Sequence[str] | None = None) -> None:
    """Run the app (the `cpbench` script is `bench_server.cli:main`, which adds `serve` first); `argv` defaults to `sys.argv[1:]`."""
    from db.errors import StoreNotMigratedError
    from runners.cli.triton_cpu import use_interpreter_if_cpu

    args = list(argv) if argv is not None else sys.argv[1:]
    use_interpreter_if_cpu(args)  # before any verb imports Triton
    usage_errors, aborts = _click_errors()
    try:
        rc = app(args=args, prog_name="cpbench", standalone_mode=False)
    except (CpbenchError, StoreNotMigratedError) as err:
        _fail(" ".join(str(err).split("\n")))
    except pydantic.ValidationError as err:
        line = _settings_error(err)
        if line is None:
            raise
        _fail(line)
    except usage_errors as err:  # a bad verb, option or value: one line, exit 1, like every user error
        if type(err).__name__ == "NoArgsIsHelpError":  # `cpbench` or `cpbench db` alone: the help, as asked
            err.show()  # type: ignore[attr-defined]
            raise SystemExit(0) from None
        _fail(_usage_line(err))
    except aborts:
        _fail("aborted")
    except Exception as err:  # a store the command cannot reach or parse: a user error; anything else is a bug
        line = _store_error(err)
        if line is None:
            raise
        _fail(line)
    except KeyboardInterrupt:
        _fail("interrupted")
    if isinstance(rc, int) and rc != 0:
        raise SystemExit(rc)
