"""`cpbench configs export` and `cpbench tune`: tuned launch configs out of the store, and a tuning run into it.

`cpbench tune` checks every argument (and that the store is migrated) before it runs anything, prints a header
naming what it searches and where the trials go, the progress of each kernel's search (`runners.cli.tune_progress`)
and a summary. It opens no store session while it measures; it stores (`db.crud.store_tuning`) and prints each
kernel's trials and winner as soon as that kernel is decided (the tuner's `on_result`), so a killed run keeps every
kernel decided before it, and a device crash the crashing kernel's trials too, then fails.
Its options' defaults are `runners.tuner.spec.TuneSpec`'s.

    cpbench configs export [--device "NVIDIA H200"] -o autotune.json [--db URL]   # "-o -" writes to stdout
    cpbench configs export --format fla -o DIR      # FLA's config-cache directory (FLA_CONFIG_DIR=DIR)
    cpbench configs export --format flash_qla [-o sm90.csv]   # FlashQLA's autocp coefficient CSV (see below)
    cpbench tune --op gdn --shape B=1,T=8192,H=16,K=128,V=128 [--shape ...] [--strategy halving] [--budget 12]
                 [--samples 20] [--kernel NAME] [--device cuda|cpu] [--seed 0] [--db URL]
    cpbench tune --backend fla --op kda --shape ...   # FLA's kernels, whole-op timing (runners.tuner.fla)
    cpbench tune --backend fla --direction fwd+bwd [--fla-bypass-hopper-guard] ...   # FLA's training step
    cpbench tune --backend flash_qla --op gdn --shape T=65536,H=16 --shape lengths=16384:16384,H=16
                 [--direction fwd+bwd] [--samples 10] [--flash-qla-splits decide|all]
        # FlashQLA's kernels timed per split size on this GPU (decide: the splits FlashQLA's decision prices and
        # those around them, few TileLang compiles; all: every split size), its auto-CP coefficients refit
        # (runners.tuner.flash_qla; a shape of several sequences or a second H sets the correction rows apart);
        # GPU with flash_qla installed only

A `--shape` takes B, T (or lengths=100:300), H, K, V, and optionally dtype (default bfloat16), lb, initial_state.

FlashQLA 0.1.3 reads its coefficients from `autocp/coefs/<arch>.csv` inside the installed flash_qla package and
has no environment variable for them: the export says where that file is; copy the refit file over it (keep the
shipped one), or pass it to FlashQLA's `decide(coefs=load_coefs(path, arch=...))` in a process.

`export` refuses CPU timings (`--allow-cpu` exists for tests only) and, when the store holds several devices,
asks for `--device`. The file's schema is documented in kernels/autotune.py; training jobs load it with
`CPBENCH_AUTOTUNE=autotune.json` or `kernels.use_autotune(path)`.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import typer

from runners.cli.tune_progress import TuneProgressPrinter
from runners.errors import CpbenchError
from runners.tuner.result import KernelResult, OnResult, TuneProgress, TuneResult
from runners.tuner.spec import STRATEGIES, TuneSpec

__all__ = ["parse_shape", "register"]

EXPORT_FORMATS = ("cpbench", "fla", "flash_qla")
TUNE_BACKENDS = ("triton", "fla", "flash_qla")
_DEFAULT_OUTPUT = "autotune.json"
configs_app = typer.Typer(help="Tuned launch configs: export the autotune JSON that training jobs load.", no_args_is_help=True)


def _session(database_url: str | None) -> Any:
    from db.session import session_scope

    return session_scope(database_url)


@configs_app.command("export")
def export_configs(
    output: str = typer.Option(_DEFAULT_OUTPUT, "-o", "--output", help="file to write; '-' for stdout; with "
                               "--format fla: the directory"),
    device: str | None = typer.Option(None, "--device", help="device name as torch reports it, e.g. 'NVIDIA H200'"),
    fmt: str = typer.Option("cpbench", "--format", help="cpbench (our autotune JSON) | fla (FLA's config-cache "
                            "directory, one <kernel_name>.json per kernel, for FLA_CONFIG_DIR) | flash_qla "
                            "(FlashQLA's autocp coefficient CSV; default file <arch>.csv)"),
    allow_cpu: bool = typer.Option(False, "--allow-cpu", help="export CPU timings (tests only; never for real use)"),
    database_url: str | None = typer.Option(None, "--db", "--database-url", help="default: CPBENCH_DATABASE_URL"),
) -> None:
    """Write the tuned configs of one device as the versioned autotune JSON (or FLA's config-cache directory)."""
    from runners.tuner.export import ExportError, build_export

    if fmt not in EXPORT_FORMATS:
        raise CpbenchError(f"--format must be one of {', '.join(EXPORT_FORMATS)}, got {fmt!r}")
    if fmt == "fla":
        _export_fla(output, device, allow_cpu, database_url)
        return
    if fmt == "flash_qla":
        _export_flash_qla(None if output == _DEFAULT_OUTPUT else output, device, allow_cpu, database_url)
        return

    with _session(database_url) as session:
        try:
            data = build_export(session, device_name=device, allow_cpu=allow_cpu)
        except ExportError as e:
            raise CpbenchError(str(e)) from None
    text = json.dumps(data, indent=1, sort_keys=True) + "\n"
    n = sum(len(k["entries"]) for k in data["kernels"].values())
    if output == "-":
        sys.stdout.write(text)
        return
    from pathlib import Path

    p = Path(output)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(text, encoding="utf-8")
    typer.echo(f"wrote {p}: {len(data['kernels'])} kernels, {n} entries, device {data['device']['name']!r}")


def _export_fla(output: str, device: str | None, allow_cpu: bool, database_url: str | None) -> None:
    from runners.tuner.export import ExportError
    from runners.tuner.fla_export import write_fla_export

    if output == "-":
        raise CpbenchError("--format fla writes a directory (one <kernel_name>.json per kernel): give -o DIR")
    with _session(database_url) as session:
        try:
            files = write_fla_export(output, session, device_name=device, allow_cpu=allow_cpu)
        except ExportError as e:
            raise CpbenchError(str(e)) from None
    n = sum(len(f["autotune_entries"]) for f in files.values())
    typer.echo(f"wrote {output}: {len(files)} FLA config-cache files, {n} entries "
               f"(use FLA_CONFIG_DIR={output} FLA_CACHE_MODE=strict)")


def _export_flash_qla(output: str | None, device: str | None, allow_cpu: bool, database_url: str | None) -> None:
    """FlashQLA's coefficient CSV (`runners.tuner.flash_qla_coefs`) to `output` (None: <arch>.csv; '-': stdout),
    and where FlashQLA reads it."""
    from pathlib import Path

    from runners.tuner.export import ExportError
    from runners.tuner.flash_qla_coefs import build_flash_qla_csv, installed_coefs_path, read_coef_csv

    with _session(database_url) as session:
        try:
            text = build_flash_qla_csv(session, device_name=device, allow_cpu=allow_cpu)
        except ExportError as e:
            raise CpbenchError(str(e)) from None
    if output == "-":
        sys.stdout.write(text)
        return
    coefs = read_coef_csv(text)
    p = Path(output or f"{coefs['arch']}.csv")
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(text, encoding="utf-8")
    there = installed_coefs_path(coefs["arch"])
    where = str(there) if there else f"autocp/coefs/{coefs['arch']}.csv inside the flash_qla package"
    typer.echo(f"wrote {p}: {len(coefs['kernels'])} FlashQLA coefficient rows ({coefs['arch']}, P={coefs['P']}); "
               f"FlashQLA reads {where} (no environment variable): copy it there, keeping the shipped file")


def parse_shape(text: str) -> dict[str, Any]:
    """"B=1,T=8192,H=16,K=128,V=128,dtype=bfloat16" (or "lengths=100:300,H=16,...") -> a shape dict."""
    out: dict[str, Any] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, sep, val = part.partition("=")
        if not sep:
            raise CpbenchError(f"--shape: expected NAME=VALUE items separated by commas, got {part!r} in {text!r}")
        if name == "dtype":
            out[name] = val
        elif name == "lengths":
            out[name] = [int(x) for x in val.split(":")]
        elif name == "lb":
            out[name] = float(val)
        elif name == "initial_state":
            out[name] = val.lower() in ("1", "true", "yes")
        else:
            try:
                out[name] = int(val)
            except ValueError:
                raise CpbenchError(f"--shape: {name} must be an integer, got {val!r}") from None
    return out


_D = TuneSpec()  # the tuner's defaults


def tune_command(
    op: str = typer.Option(..., "--op", help="gdn | kda"),
    shape: list[str] = typer.Option(..., "--shape", help="B=1,T=8192,H=16,K=128,V=128[,dtype=bfloat16]; repeatable"),
    strategy: str = typer.Option(_D.strategy, "--strategy", help="exhaustive | random | halving"),
    budget: int | None = typer.Option(_D.budget, "--budget", min=1,
                                      help="configs per kernel and key (random; halving's first rung)"),
    kernel: list[str] = typer.Option([], "--kernel", help="tune only these kernels (default: all the op launches)"),
    device: str | None = typer.Option(None, "--device", help="cuda (default when present) or cpu"),
    seed: int = typer.Option(_D.seed, "--seed"),
    samples: int = typer.Option(_D.samples, "--samples", min=1, help="samples per config (exhaustive, random)"),
    backend: str = typer.Option("triton", "--backend", help="triton (our kernels) | fla (FLA's autotuned kernels, "
                                "timed as FLA's whole op; stored as fla.<kernel>) | flash_qla (FlashQLA's kernels "
                                "per split size, its auto-CP coefficients refit; stored as flash_qla.<row>)"),
    database_url: str | None = typer.Option(None, "--db", "--database-url", help="default: CPBENCH_DATABASE_URL"),
    direction: str = typer.Option(_D.direction, "--direction", help="fwd | fwd+bwd (time forward + backward; tunes "
                                  "the backward kernels too)"),
    fla_bypass_hopper_guard: bool = typer.Option(False, "--fla-bypass-hopper-guard", help="--backend fla at fwd+bwd: "
                                                 "lift FLA's Hopper guard on the GDN backward (FLA #640; Triton < 3.7.1)"),
    fla_min_gain: float = typer.Option(_D.min_gain, "--fla-min-gain", help="--backend fla: FLA's own pick stays unless "
                                       "a config runs the whole op this fraction faster (default 0.01 = 1%)"),
    flash_qla_splits: str = typer.Option("decide", "--flash-qla-splits", help="--backend flash_qla: decide (the split "
                                         "sizes FlashQLA's own decision prices, and one partition either side) | all"),
) -> None:
    """Tune the Triton kernels of an op at the given shapes, storing each kernel's trials and winner as it is decided."""
    from runners.tuner import TuningStopped

    splits = _flash_qla_splits(flash_qla_splits)
    url, shapes, device = _check_tune_args(op, shape, strategy, kernel, device, backend, direction, database_url)
    spec = TuneSpec(strategy=strategy, budget=budget, seed=seed, samples=samples, direction=direction,  # type: ignore[arg-type]
                    kernels=tuple(kernel) or None, min_gain=fla_min_gain)
    options: dict[str, Any] | None = {"bypass_hopper_guard": True} if fla_bypass_hopper_guard else None
    if backend == "flash_qla":
        options = {"splits": splits}
    where = _store_name(url)
    typer.echo(_tune_header(op, backend, shapes, spec, device, where))
    stored = [0]
    progress = TuneProgressPrinter(live=sys.stderr.isatty())

    def store_as_it_goes(part: TuneResult) -> None:  # a killed run keeps every kernel decided before it
        progress.flush()
        _store(url, part)
        stored[0] += sum(len(r.trials) for r in part.kernels)
        for r in part.kernels:
            typer.echo(_kernel_line(r))

    try:
        result = _measure(backend, op, shapes, spec, device, options, store_as_it_goes, progress)
    except TuningStopped as stop:  # a device crash: what was measured before it is stored already
        typer.echo(f"tuning stopped after {len(stop.result.kernels)} kernel(s): {stop.error}", err=True)
        raise
    except (ValueError, ImportError) as e:
        raise CpbenchError(str(e)) from None
    finally:
        progress.close()
    typer.echo(f"tuned {len(result.winners())} of {len(result.kernels)} kernel(s) and key(s); {stored[0]} trial(s) "
               f"and the winners stored in {where} (`cpbench configs export` writes them out)")


def _check_tune_args(op: str, shape: list[str], strategy: str, kernel: list[str], device: str | None, backend: str,
                     direction: str, database_url: str | None) -> tuple[str, list[Any], str]:
    """Every argument of `cpbench tune` checked before anything runs: (store URL, shapes, device). A bad one is a
    `CpbenchError` naming it; the store must be reachable and migrated, since the trials are stored as they come."""
    from db.migrate import require_migrated
    from kernels.vocabulary import OPS, POINT_DIRECTIONS
    from runners.cli.common import resolve

    if backend not in TUNE_BACKENDS:
        raise CpbenchError(f"--backend must be one of {', '.join(TUNE_BACKENDS)}, got {backend!r}")
    if strategy not in STRATEGIES:
        raise CpbenchError(f"--strategy must be one of {', '.join(STRATEGIES)}, got {strategy!r}")
    if op not in OPS:
        raise CpbenchError(f"--op: op must be one of {', '.join(OPS)}, got {op!r}")
    if direction not in POINT_DIRECTIONS:
        raise CpbenchError(f"--direction must be one of {', '.join(POINT_DIRECTIONS)}, got {direction!r}")
    from runners.tuner import Shape

    try:
        shapes = [Shape.of(parse_shape(s)) for s in shape]
    except ValueError as e:
        raise CpbenchError(f"--shape: {e}") from None
    if backend == "flash_qla":
        _check_flash_qla(op, shapes, device)
    device = _tune_device(device)
    if kernel and backend == "triton":
        from kernels.configs import import_kernel_modules

        known = import_kernel_modules()
        if unknown := sorted(set(kernel) - set(known)):
            raise CpbenchError(f"--kernel: unknown kernel(s) {', '.join(unknown)}; known: {', '.join(known)}")
    url = resolve(database_url)
    require_migrated(url)
    return url, shapes, device


def _check_flash_qla(op: str, shapes: list[Any], device: str | None) -> None:
    """FlashQLA's refit: GDN, shapes it runs, and a GPU with flash_qla installed (else one line saying which)."""
    from runners.tuner.flash_qla import check_shapes, require_flash_qla

    if op != "gdn":
        raise CpbenchError(f"--backend flash_qla: FlashQLA runs GDN only, got --op {op}")
    if device == "cpu":
        raise CpbenchError("--backend flash_qla times FlashQLA's kernels on an SM90/SM100 GPU, not --device cpu")
    try:
        check_shapes(shapes)
        require_flash_qla()
    except ValueError as e:
        raise CpbenchError(str(e)) from None


def _flash_qla_splits(splits: str) -> str:
    from runners.tuner.flash_qla import SPLIT_CHOICES

    if splits not in SPLIT_CHOICES:
        raise CpbenchError(f"--flash-qla-splits must be one of {', '.join(SPLIT_CHOICES)}, got {splits!r}")
    return splits


def _tune_device(device: str | None) -> str:
    """`--device` checked against this host: cuda only with a GPU; the default is cuda when present, else cpu."""
    import torch

    if device is None:
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device not in ("cuda", "cpu"):
        raise CpbenchError(f"--device must be cuda or cpu, got {device!r}")
    if device == "cuda" and not torch.cuda.is_available():
        raise CpbenchError("--device cuda: no CUDA device is available on this host (use --device cpu)")
    return device


def _store_name(url: str) -> str:
    from db.migrate import safe_url

    return safe_url(url)


def _tune_header(op: str, backend: str, shapes: list[Any], spec: TuneSpec, device: str, where: str) -> str:
    """The first line of a tuning run: what is searched, how, where, and where the trials go."""
    dims = "; ".join(
        ",".join(f"{n}={getattr(s, n)}" for n in ("B", "T", "H", "K", "V", "dtype"))
        + (f",lengths={':'.join(map(str, s.lengths))}" if s.lengths else "") for s in shapes)
    clock = "CUDA events" if device == "cuda" else "wall clock"
    if backend == "flash_qla":
        return (f"tune {op} {spec.direction} (flash_qla) at {len(shapes)} shape(s) [{dims}]: FlashQLA's kernels at the "
                f"split sizes of --flash-qla-splits (decide: those FlashQLA's decision prices, and around them), "
                f"{spec.samples} run(s) each, its auto-CP coefficients refit by least squares per kernel row; "
                f"device {device} ({clock}); the fit stored in {where} once every shape is timed")
    budget = "all configs" if spec.budget is None else f"{spec.budget} config(s)"
    kernels = ", ".join(spec.kernels) if spec.kernels else "every kernel it launches"
    return (f"tune {op} {spec.direction} ({backend}) at {len(shapes)} shape(s) [{dims}]: {kernels}; strategy "
            f"{spec.strategy}, budget {budget} per kernel and key; device {device} ({clock}); trials stored in {where}")


def _measure(backend: str, op: str, shapes: list[Any], spec: TuneSpec, device: str | None,
             options: dict[str, Any] | None, on_result: OnResult, progress: TuneProgress | None = None) -> TuneResult:
    """The TuneResult of our kernels (`tune_kernels`), FLA's (`tune_fla`) or FlashQLA's coefficients
    (`tune_flash_qla`, stored once fitted); no store session is open while a
    kernel is measured (`on_result` gets each kernel's result once it is decided)."""
    if backend == "flash_qla":
        from runners.tuner.flash_qla import tune_flash_qla

        return tune_flash_qla(shapes=shapes, spec=spec, on_result=on_result, say=lambda line: typer.echo(line, err=True),
                              splits=(options or {}).get("splits", "decide"))
    if backend == "fla":
        from runners.tuner.fla import tune_fla

        return tune_fla(op=op, shapes=shapes, spec=spec, device=device, options=options, on_result=on_result)
    from runners.tuner.tune import tune_kernels

    return tune_kernels(op=op, shapes=shapes, spec=spec, device=device, on_result=on_result, progress=progress)


def _kernel_line(r: KernelResult) -> str:
    """One kernel and key of a tuning run: its winner and speed against the default, or why there is none."""
    if r.config is None or r.median_ms is None:
        return f"{r.kernel:28s} {r.key_str:60s} no config was correct and timed ({len(r.trials)} trials); default kept"
    speed = f"{r.default_ms / r.median_ms:.3f}x" if r.default_ms else "n/a"
    return f"{r.kernel:28s} {r.key_str:60s} {json.dumps(r.config):48s} {r.median_ms:9.4f} ms  vs default {speed}"


def _store(database_url: str, result: TuneResult) -> None:
    """Store a TuneResult's trials and winners in one transaction (`db.crud.store_tuning`)."""
    from db import crud

    with _session(database_url) as session:
        crud.store_tuning(session, result=result)


def register(app: typer.Typer) -> None:
    """Add `configs export` and `tune` to the cpbench app (called by runners/cli/__init__.py)."""
    app.add_typer(configs_app, name="configs")
    app.command("tune")(tune_command)
