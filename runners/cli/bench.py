"""`cpbench bench kernels|cp|train [ARGS...]`: the GPU benchmarks of the kernel suite (not tests; figures go to benchmarks/results/).

    cpbench bench kernels --ops gdn,kda            # our Triton forward vs FLA vs FlashQLA vs the floor (runners/bench/kernels.py)
    cpbench bench kernels --preset issue26 --deadline 540   # issue 26's grid, cut cleanly before 600 s
    cpbench bench kernels --dry-run --out /tmp/b   # CPU interpreter, tiny shapes: checks the script runs
    cpbench bench cp --world 2                     # every CP scheme on 2 GPUs vs FLA's CP (runners/bench/cp.py)
    cpbench bench train                            # our forward+backward vs FLA's and FlashQLA's (runners/bench/kernels_train.py)
    cpbench bench comm --world 8                   # the links' alpha/beta for the scaling model (runners/bench/comm.py)

Everything after the target is handed to that module's own argument parser; `cpbench bench kernels --help` lists it.
Both write into `--out` (default benchmarks/results/); give CPU smoke runs another folder. `--dry-run` runs the
Triton interpreter: this verb sets TRITON_INTERPRET=1 itself before the kernels are imported.
"""

from __future__ import annotations

import importlib
import os
import sys

import typer

from runners.errors import CpbenchError

__all__ = ["register"]

TARGETS = {
    "kernels": "runners.bench.kernels",
    "cp": "runners.bench.cp",
    "train": "runners.bench.kernels_train",
    "comm": "runners.bench.comm",
}


def bench(
    ctx: typer.Context,
    target: str | None = typer.Argument(None, help="kernels | cp | train | comm"),
) -> None:
    """Run a GPU benchmark of the kernel suite; extra arguments go to the benchmark."""
    if target is None or target in ("--help", "-h"):
        typer.echo(ctx.get_help())
        return
    if target not in TARGETS:
        raise CpbenchError(f"unknown bench target {target!r}; expected one of {sorted(TARGETS)}")
    if target == "kernels" and "--dry-run" in ctx.args and os.environ.get("TRITON_INTERPRET") != "1":
        if "triton" in sys.modules:
            raise CpbenchError("--dry-run needs TRITON_INTERPRET=1 set before Triton is imported; set it and rerun")
        os.environ["TRITON_INTERPRET"] = "1"  # read when the kernels are decorated, i.e. at import
        typer.echo("dry run: Triton interpreter on the CPU (TRITON_INTERPRET=1)", err=True)
    module = importlib.import_module(TARGETS[target])
    rc = module.main(list(ctx.args))
    if rc:
        raise typer.Exit(int(rc))


def register(app: typer.Typer) -> None:
    app.command(
        "bench",
        context_settings={"allow_extra_args": True, "ignore_unknown_options": True, "help_option_names": []},
        help="Run a GPU benchmark of the kernel suite (kernels | cp | train | comm); extra arguments go to the benchmark.",
    )(bench)
