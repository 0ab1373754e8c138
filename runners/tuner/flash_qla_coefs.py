"""FlashQLA's auto-CP cost coefficients: their least-squares fit from timed kernels, and FlashQLA's CSV (torch-free).

FlashQLA (flash-qla 0.1.3) decides its intra-card CP, whether to split a sequence and into partitions of how many
chunks, by pricing each of its kernels with one law, `t_ms = a·depth + b·u + c`: `depth` is the kernel's schedule
depth in chunk steps under the launch it takes, `u` the CTAs it launches (heads x partitions). Its authors fitted
(a, b, c) per kernel row on one GPU and ship them as `autocp/coefs/<arch>.csv`. The facts used here, from its
`autocp/utils.py` and `autocp/launch.py`:

- the CSV's columns are `CSV_COLUMNS` (kernel, a, b, c, P (SMs), chunk, arch), one row per kernel row, each once;
- a kernel that tiles V is priced per tile width, as `<kernel>_dv<width>` (Hopper's fused forward has three);
- FlashQLA's loader (`load_coefs(path, arch=)`) refuses a file that lacks a row the inference decision prices
  (`REQUIRED_ROWS`), and warns about missing training rows;
- FlashQLA reads `<flash_qla>/ops/gated_delta_rule/chunk/cp/autocp/coefs/<arch>.csv` (`COEFS_SUBDIR`); 0.1.3 has
  no environment variable for it: a user points FlashQLA at a refit file by putting it there (`installed_coefs_path`
  says where), and a process can pass it to `decide(coefs=load_coefs(path, arch=...))`.

Here:
- `Timing` (one kernel row timed at one (depth, u)), `fit_coefficients(timings)` -> `CoefFit` (least squares per
  row; a row with fewer than three points off one line is left unfitted, with why);
- `coef_csv(rows, P=, chunk=, arch=)` writes FlashQLA's CSV, `read_coef_csv(text)` reads it by the documented format
  (the same dict FlashQLA's loader returns, less its `backend`), `flash_qla_loader()` FlashQLA's own loader where
  flash_qla is installed (`flash_qla_autocp()`: its autocp files without running the package, which needs a GPU);
- the store side: tuned rows are `TunedConfig`s named `flash_qla.<row>` (`FLASH_QLA_PREFIX`) keyed by (arch, P,
  chunk); `csv_from_rows(rows, ...)` / `build_flash_qla_csv(session, ...)` make the export of one device
  (`cpbench configs export --format flash_qla`).
"""

from __future__ import annotations

import csv
import importlib.util
import io
import math
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

import numpy as np

from runners.tuner.export import ExportError, rows_of_one_device
from runners.tuner.result import FLASH_QLA_PREFIX

if TYPE_CHECKING:
    from sqlalchemy.orm import Session

__all__ = [
    "COEF_NAMES",
    "COEFS_SUBDIR",
    "CSV_COLUMNS",
    "REQUIRED_ROWS",
    "CoefFit",
    "RowFit",
    "Timing",
    "build_flash_qla_csv",
    "coef_csv",
    "coef_key",
    "csv_from_rows",
    "fit_coefficients",
    "flash_qla_autocp",
    "flash_qla_loader",
    "installed_coefs_path",
    "predict_ms",
    "read_coef_csv",
]

CSV_COLUMNS = ("kernel", "a", "b", "c", "P", "chunk", "arch")
COEF_NAMES = ("a", "b", "c")  # t_ms = a * depth + b * u + c
# the rows FlashQLA's loader requires per arch (what its inference decision prices)
REQUIRED_ROWS: Mapping[str, tuple[str, ...]] = {
    "sm90": ("prepare_h", "correct_h0_dv128", "fused_fwd_dv32", "fused_fwd_dv64", "fused_fwd_dv128"),
    "sm100": ("prepare_h", "correct_h0_dv128", "fused_fwd_dv64", "fused_fwd_dv128"),
}
COEFS_SUBDIR = ("ops", "gated_delta_rule", "chunk", "cp", "autocp", "coefs")
_AUTOCP_PACKAGE = "_cpbench_flash_qla_autocp"  # FlashQLA's autocp files loaded on their own (`flash_qla_loader`)
_MIN_POINTS = 3


@dataclass(frozen=True)
class Timing:
    """One kernel row (`fused_fwd_dv128`) timed at schedule depth `depth` (chunk steps) and `u` CTAs: `ms`."""

    row: str
    depth: float
    u: float
    ms: float


@dataclass(frozen=True)
class RowFit:
    """The least-squares (a, b, c) of one row over its `n` timings, and the RMS of its residuals (ms)."""

    row: str
    a: float
    b: float
    c: float
    n: int
    rms_ms: float

    def coefs(self) -> dict[str, float]:
        return {"a": self.a, "b": self.b, "c": self.c}


@dataclass(frozen=True)
class CoefFit:
    """The fitted rows, and per row that could not be fitted why (too few points, or all on one line)."""

    rows: dict[str, RowFit] = field(default_factory=dict)
    unfitted: dict[str, str] = field(default_factory=dict)


def predict_ms(coefs: Mapping[str, float], depth: float, u: float) -> float:
    """FlashQLA's law for one row: a·depth + b·u + c (ms)."""
    return coefs["a"] * depth + coefs["b"] * u + coefs["c"]


def fit_coefficients(timings: Iterable[Timing]) -> CoefFit:
    """(a, b, c) per row by least squares over its timings (numpy's lstsq on [depth, u, 1]).

    A row is fitted only when its design has rank 3: at least three timings whose (depth, u) do not lie on one
    line (else a and b cannot be told apart from c); the others are in `unfitted` with why. Non-finite or
    negative timings are a ValueError naming the row."""
    by_row: dict[str, list[Timing]] = {}
    for t in timings:
        if not (math.isfinite(t.ms) and t.ms >= 0 and math.isfinite(t.depth) and math.isfinite(t.u)):
            raise ValueError(f"row {t.row}: a timing must be finite and >= 0, got depth={t.depth} u={t.u} ms={t.ms}")
        by_row.setdefault(t.row, []).append(t)
    out = CoefFit()
    for row, ts in sorted(by_row.items()):
        x = np.array([[t.depth, t.u, 1.0] for t in ts], dtype=np.float64)
        y = np.array([t.ms for t in ts], dtype=np.float64)
        rank = int(np.linalg.matrix_rank(x))
        if len(ts) < _MIN_POINTS or rank < _MIN_POINTS:
            out.unfitted[row] = (
                f"{len(ts)} timing(s) at {len({(t.depth, t.u) for t in ts})} distinct (depth, u) of rank {rank}: "
                f"a fit of a, b and c needs {_MIN_POINTS} points off one line"
            )
            continue
        (a, b, c), *_ = np.linalg.lstsq(x, y, rcond=None)
        rms = float(np.sqrt(np.mean((x @ np.array([a, b, c]) - y) ** 2)))
        out.rows[row] = RowFit(row=row, a=float(a), b=float(b), c=float(c), n=len(ts), rms_ms=rms)
    return out


def _number(x: float) -> str:
    return f"{x:.10g}"


def coef_csv(rows: Mapping[str, Mapping[str, float]], *, P: int, chunk: int, arch: str) -> str:
    """FlashQLA's coefficient CSV of `rows` ({row: {a, b, c}}, written in the given order) for `arch` with P SMs.

    A ValueError when a row FlashQLA's loader requires for `arch` (`REQUIRED_ROWS`) is missing or a coefficient
    is not finite: FlashQLA would refuse the file."""
    missing = [r for r in REQUIRED_ROWS.get(arch, ()) if r not in rows]
    if missing:
        raise ValueError(
            f"a FlashQLA {arch} coefficient file needs rows {', '.join(missing)}; have {', '.join(rows) or 'none'}"
        )
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(CSV_COLUMNS)
    for row, coefs in rows.items():
        values = [float(coefs[n]) for n in COEF_NAMES]
        if not all(math.isfinite(v) for v in values):
            raise ValueError(f"row {row}: coefficients must be finite, got {dict(zip(COEF_NAMES, values, strict=True))}")
        writer.writerow([row, *map(_number, values), int(P), int(chunk), arch])
    return buf.getvalue()


def read_coef_csv(text: str, *, arch: str | None = None) -> dict[str, Any]:
    """The coefficient CSV by FlashQLA's documented format: {"kernels": {row: {a, b, c}}, "P", "chunk", "arch"} (what
    its `load_coefs` returns, less `backend`). A ValueError for a missing column, a row twice, another arch's file
    (`arch` given), no rows, or a missing required row."""
    reader = csv.DictReader(io.StringIO(text))
    if reader.fieldnames is None or (absent := [c for c in CSV_COLUMNS if c not in reader.fieldnames]):
        raise ValueError(f"coefficient CSV lacks column(s) {absent if reader.fieldnames else list(CSV_COLUMNS)}")
    kernels: dict[str, dict[str, float]] = {}
    P = chunk = tagged = None
    for line in reader:
        name = line["kernel"].strip()
        if name in kernels:
            raise ValueError(f"coefficient CSV defines row {name!r} twice")
        tagged = line["arch"].strip()
        if arch is not None and tagged != arch:
            raise ValueError(f"coefficient CSV is fitted for {tagged!r}, not {arch!r}")
        kernels[name] = {n: float(line[n]) if line[n] else 0.0 for n in COEF_NAMES}
        P, chunk = int(line["P"]), int(line["chunk"])
    if not kernels:
        raise ValueError("coefficient CSV has no rows")
    if missing := [r for r in REQUIRED_ROWS.get(str(tagged), ()) if r not in kernels]:
        raise ValueError(f"coefficient CSV lacks row(s) {missing} needed on {tagged}")
    return {"kernels": kernels, "P": P, "chunk": chunk, "arch": tagged}


def _flash_qla_dir() -> Path | None:
    """The installed flash_qla package's folder, found without importing it (None when not installed)."""
    spec = importlib.util.find_spec("flash_qla")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def installed_coefs_path(arch: str = "sm90") -> Path | None:
    """Where the installed FlashQLA reads `arch`'s coefficients (None when flash_qla is not installed)."""
    root = _flash_qla_dir()
    return None if root is None else root.joinpath(*COEFS_SUBDIR, f"{arch}.csv")


def flash_qla_autocp() -> ModuleType | None:
    """FlashQLA's autocp package (its `utils`, `launch` and `decision` submodules import on any host), or None when
    flash_qla is not installed.

    Its files import only the standard library, but the flash_qla package imports torch and TileLang and asks for
    a GPU: the autocp folder is loaded here as a package of its own, without running flash_qla's."""
    root = _flash_qla_dir()
    if root is None:
        return None
    if _AUTOCP_PACKAGE not in sys.modules:
        folder = root.joinpath(*COEFS_SUBDIR[:-1])
        spec = importlib.util.spec_from_file_location(
            _AUTOCP_PACKAGE, folder / "__init__.py", submodule_search_locations=[str(folder)]
        )
        if spec is None or spec.loader is None:
            return None
        module = importlib.util.module_from_spec(spec)
        sys.modules[_AUTOCP_PACKAGE] = module
        try:
            spec.loader.exec_module(module)
        except Exception:
            del sys.modules[_AUTOCP_PACKAGE]
            raise
    return sys.modules[_AUTOCP_PACKAGE]


def flash_qla_loader() -> Callable[..., dict[str, Any]] | None:
    """FlashQLA's own `load_coefs(path, *, arch)` (`flash_qla_autocp`), or None when flash_qla is not installed."""
    autocp = flash_qla_autocp()
    if autocp is None:
        return None
    loader: Callable[..., dict[str, Any]] = autocp.load_coefs
    return loader


def coef_key(*, arch: str, P: int, chunk: int) -> tuple[dict[str, Any], str]:
    """The (key, key_str) a fitted row is stored under: FlashQLA's arch, the SM count and the chunk size."""
    key = {"arch": arch, "P": int(P), "chunk": int(chunk)}
    return key, ",".join(f"{k}={key[k]}" for k in sorted(key))


def csv_from_rows(rows: Sequence[Any], *, device_name: str | None, allow_cpu: bool = False) -> str:
    """FlashQLA's CSV of the `flash_qla.`-prefixed TunedConfig rows of one device (the newest key when it holds
    several), rows in the order FlashQLA's own file lists them (the required ones first)."""
    mine = [r for r in rows if r.kernel.startswith(FLASH_QLA_PREFIX)]
    _, mine = rows_of_one_device(
        mine,
        device_name=device_name,
        allow_cpu=allow_cpu,
        what="FlashQLA coefficients",
        how="run `cpbench tune --backend flash_qla` on the GPU first",
    )
    newest = max(mine, key=lambda r: str(r.measured_at)).key
    keep = {r.kernel.removeprefix(FLASH_QLA_PREFIX): r.config for r in mine if r.key == newest}
    order = [*REQUIRED_ROWS.get(newest["arch"], ()), *sorted(keep)]
    try:
        return coef_csv(
            {row: keep[row] for row in dict.fromkeys(order) if row in keep},
            P=newest["P"],
            chunk=newest["chunk"],
            arch=newest["arch"],
        )
    except ValueError as e:
        raise ExportError(f"cannot write FlashQLA's coefficient file: {e}") from None


def build_flash_qla_csv(session: Session, *, device_name: str | None = None, allow_cpu: bool = False) -> str:
    """The CSV of the store's fitted FlashQLA coefficients for one device."""
    from db import crud

    return csv_from_rows(crud.list_tuned_configs(session), device_name=device_name, allow_cpu=allow_cpu)
