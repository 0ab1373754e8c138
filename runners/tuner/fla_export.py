"""Tuned FLA configs (`cpbench tune --backend fla`) -> FLA's config-cache directory, one `<kernel_name>.json` each.

    files = build_fla_export(session, device_name="NVIDIA H200")     # {file name: content}
    write_fla_export(DIR, session, device_name=None)                 # `cpbench configs export --format fla -o DIR`

A job points FLA at it with `FLA_CONFIG_DIR=DIR FLA_CACHE_MODE=strict` (exact keys; `fuzzy`/`full` also match other
shapes): FLA then injects the stored config for each key and runs no autotuning for it. Each file holds
`kernel_name`, `triton_version` (of the tuning environment), `autotune_entries` keyed by the md5 of the key as FLA
computes it (`runners.peers.fla_autotune.entry_hash`) and `default_config` (the config that won the most keys,
used by FLA_CACHE_MODE=full/default). Same device rules as the autotune JSON: one device per export, CPU timings
refused unless `allow_cpu`.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any

from runners.tuner.export import rows_of_one_device
from runners.tuner.result import FLA_PREFIX as PREFIX

if TYPE_CHECKING:
    from sqlalchemy.orm import Session

__all__ = ["build_fla_export", "fla_files_from_rows", "write_fla_export"]


def fla_files_from_rows(rows: list[Any], *, device_name: str | None, allow_cpu: bool,
                        triton_version: str | None) -> dict[str, dict[str, Any]]:
    """{`<kernel_name>.json`: content} of the `fla.`-prefixed TunedConfig rows of one device."""
    from runners.peers.fla_autotune import cache_file

    _, rows = rows_of_one_device([r for r in rows if r.kernel.startswith(PREFIX)], device_name=device_name,
                                 allow_cpu=allow_cpu, what="FLA configs", how="run `cpbench tune --backend fla` first")
    by_kernel: dict[str, list[Any]] = {}
    for r in rows:
        by_kernel.setdefault(r.kernel.removeprefix(PREFIX), []).append(r)
    out: dict[str, dict[str, Any]] = {}
    for name in sorted(by_kernel):
        krows = sorted(by_kernel[name], key=lambda r: r.key_str)
        wins = Counter(json.dumps(r.config, sort_keys=True) for r in krows)
        default = json.loads(min(wins, key=lambda c: (-wins[c], c)))
        entries = [(r.key["autotune_key"], r.config, float(r.median_ms)) for r in krows]
        out[f"{name}.json"] = cache_file(name, entries, triton_version=triton_version, default_config=default)
    return out


def build_fla_export(session: Session, *, device_name: str | None = None, allow_cpu: bool = False) -> dict[str, dict[str, Any]]:
    """The config-cache files of the store's tuned FLA configs for one device."""
    from db import crud
    from runners.versions import software_versions

    rows = [r for r in crud.list_tuned_configs(session) if r.kernel.startswith(PREFIX)]
    triton_version = None
    env_ids = [r.environment_id for r in rows if r.environment_id is not None
               and (device_name is None or r.device_name == device_name)]
    if env_ids:
        env = crud.get_environment(session, environment_id=max(env_ids))
        triton_version = env.triton if env is not None else None
    return fla_files_from_rows(rows, device_name=device_name, allow_cpu=allow_cpu,
                               triton_version=triton_version or software_versions()["triton"])


def write_fla_export(directory: str | os.PathLike[str], session: Session, *, device_name: str | None = None,
                     allow_cpu: bool = False) -> dict[str, dict[str, Any]]:
    """Write `build_fla_export(...)` into `directory` (created) and return it."""
    files = build_fla_export(session, device_name=device_name, allow_cpu=allow_cpu)
    d = Path(directory)
    d.mkdir(parents=True, exist_ok=True)
    for fname, content in files.items():
        (d / fname).write_text(json.dumps(content, indent=1, sort_keys=True) + "\n", encoding="utf-8")
    return files
