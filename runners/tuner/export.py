"""Tuned configs -> the versioned autotune JSON that training jobs load (schema: kernels/autotune.py, `SCHEMA`).

    data = build_export(session, device_name="NVIDIA H200")      # GET /api/v1/configs/export serves this dict
    write_export("autotune.json", session, device_name=None)     # `cpbench configs export -o autotune.json`

Rules:
- our kernels only (FLA's tuned kernels, `fla.*`, export in FLA's own format: `runners.tuner.fla_export`; FlashQLA's
  coefficients, `flash_qla.*`, in its CSV: `runners.tuner.flash_qla_coefs`);
- one device per file: `device_name` picks it; when None, the store must hold exactly one device's configs;
- CPU timings are never exported: device "cpu" is refused unless `allow_cpu=True` (tests only, and the
  `tuned_table` of CPU sweeps); the CLI flag is `--allow-cpu`;
- per kernel, only entries whose source hash equals this build's `kernels.autotune.source_hash(kernel)` are
  exported (older ones are stale and would be refused by the loader); a kernel this process cannot hash
  (not registered here) keeps the entries of its most recently measured hash;
- `versions` (torch, triton, cpbench) come from the Environment row of the newest entry when the rows carry
  one, else from this process; `compute_capability` from the rows.
The result is validated with the loader's own parser before it is returned.
"""

from __future__ import annotations

import json
import logging
import os
from collections import Counter
from collections.abc import Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kernels.autotune import SCHEMA_VERSION, AutotuneError, parse_autotune, source_hash
from runners.errors import CpbenchError
from runners.tuner.result import PEER_PREFIXES
from runners.versions import software_versions

if TYPE_CHECKING:
    from sqlalchemy.orm import Session

    from db.models import TunedConfig

__all__ = ["ExportError", "build_export", "export_from_rows", "rows_of_one_device", "write_export"]

logger = logging.getLogger(__name__)


class ExportError(CpbenchError, ValueError):
    """Nothing (valid) to export: no tuned configs, several devices without --device, or CPU timings."""


def _iso(t: Any) -> str:
    if isinstance(t, datetime):
        return (t if t.tzinfo else t.replace(tzinfo=timezone.utc)).isoformat()
    return str(t) if t is not None else datetime.now(timezone.utc).isoformat()


def _current_hash(kernel: str) -> str | None:
    from kernels.configs import KERNELS, import_kernel_modules

    if kernel not in KERNELS:
        try:
            import_kernel_modules()
        except ImportError:
            return None
    if kernel not in KERNELS:
        return None
    try:
        return source_hash(kernel)
    except AutotuneError:
        return None


def rows_of_one_device(rows: Sequence[Any], *, device_name: str | None, allow_cpu: bool, what: str,
                       how: str) -> tuple[str, list[Any]]:
    """(device, its rows) of tuned rows: the only device, or `device_name`; refuses none, several without a name, and
    CPU timings without `allow_cpu`. `what` names the rows in the messages ("configs"), `how` how to make some."""
    devices = sorted({r.device_name for r in rows})
    if device_name is None:
        if not devices:
            raise ExportError(f"no tuned {what} to export ({how})")
        if len(devices) > 1:
            raise ExportError(f"tuned {what} exist for several devices {devices}; choose one with device_name (--device)")
        device_name = devices[0]
    mine = [r for r in rows if r.device_name == device_name]
    if not mine:
        raise ExportError(f"no tuned {what} for device {device_name!r}; devices with tuned {what}: {devices}")
    if device_name == "cpu" and not allow_cpu:
        raise ExportError("refusing to export CPU timings (device 'cpu'): they say nothing about a GPU; "
                          "allow_cpu=True (--allow-cpu) exists for tests only")
    return device_name, mine


def export_from_rows(rows: Sequence[TunedConfig], *, device_name: str | None = None, allow_cpu: bool = False,
                     versions: dict[str, Any] | None = None) -> dict[str, Any]:
    """The autotune dict of TunedConfig rows (stored or transient); see the module docstring for the rules."""
    device_name, rows = rows_of_one_device(rows, device_name=device_name, allow_cpu=allow_cpu, what="configs",
                                           how="run a sweep with tune: true, or `cpbench tune`")
    by_kernel: dict[str, list[TunedConfig]] = {}
    for r in rows:
        by_kernel.setdefault(r.kernel, []).append(r)
    kernels_out: dict[str, Any] = {}
    for name in sorted(by_kernel):
        krows = by_kernel[name]
        want = _current_hash(name)
        if want is None:
            want = max(krows, key=lambda r: _iso(r.measured_at)).source_hash
        keep = [r for r in krows if r.source_hash == want]
        if len(keep) < len(krows):
            logger.warning("export: dropping %d stale entries of %s (tuned with an older kernel source)", len(krows) - len(keep), name)
        if not keep:
            continue
        entries = [{"key": dict(r.key), "config": dict(r.config), "median_ms": float(r.median_ms),
                    "default_ms": None if r.default_ms is None else float(r.default_ms),
                    "runner_up_ms": None if r.runner_up_ms is None else float(r.runner_up_ms),
                    "sweep_id": r.sweep_id, "measured_at": _iso(r.measured_at)}
                   for r in sorted(keep, key=lambda r: r.key_str)]
        kernels_out[name] = {"source_hash": want, "entries": entries}
    ccs = Counter(r.compute_capability for r in rows if r.compute_capability)
    data = {
        "schema_version": SCHEMA_VERSION,
        "device": {"name": device_name, "compute_capability": ccs.most_common(1)[0][0] if ccs else None},
        "versions": versions or software_versions(),
        "created_at": datetime.now(timezone.utc).isoformat(),
        "kernels": kernels_out,
    }
    parse_autotune(data, device_name=device_name, check_sources=False)  # the loader must accept what we write
    return data


def build_export(session: Session, *, device_name: str | None = None, allow_cpu: bool = False) -> dict[str, Any]:
    """The autotune dict of the store's TunedConfig rows for one device (what GET /api/v1/configs/export returns)."""
    from db import crud

    # FLA's and FlashQLA's go to their own formats
    rows = [r for r in crud.list_tuned_configs(session, device_name=device_name) if not r.kernel.startswith(PEER_PREFIXES)]
    versions = None
    with_env = [(_iso(r.measured_at), r.environment_id) for r in rows if r.environment_id is not None]
    if with_env:
        env = crud.get_environment(session, environment_id=max(with_env, key=lambda m: m[0])[1])
        if env is not None:
            versions = {"torch": env.torch, "triton": env.triton, "cpbench": env.cpbench}
    if device_name is None:
        # surface the several-devices error before any filtering
        devices = sorted({r.device_name for r in rows})
        if len(devices) > 1:
            raise ExportError(f"tuned configs exist for several devices {devices}; choose one with device_name (--device)")
    return export_from_rows(rows, device_name=device_name, allow_cpu=allow_cpu, versions=versions)


def write_export(path: str | os.PathLike[str], session: Session, *, device_name: str | None = None,
                 allow_cpu: bool = False) -> dict[str, Any]:
    """Write `build_export(...)` as JSON to `path` (parent folders created) and return it."""
    data = build_export(session, device_name=device_name, allow_cpu=allow_cpu)
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    return data
