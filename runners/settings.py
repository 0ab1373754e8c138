"""Worker and spec-limit settings from the environment (prefix `CPBENCH_`), read once per process.

| variable                        | default  | meaning                                                                  |
| ------------------------------- | -------- | ------------------------------------------------------------------------ |
| `CPBENCH_LEASE_S`               | 60       | lease a worker takes on a claimed point; renewed by heartbeats           |
| `CPBENCH_HEARTBEAT_S`           | 10       | lease renewals (until the result is stored) and idle worker heartbeats   |
| `CPBENCH_POLL_S`                | 1.0      | idle wait between claims when the queue is empty                         |
| `CPBENCH_JOB_TIMEOUT_S`         | 900      | watchdog: a point's job in a rank gang longer than this fails the point  |
| `CPBENCH_GANG_START_TIMEOUT_S`  | 180      | spawn + `init_process_group` of a gang longer than this is an error      |
| `CPBENCH_PG_TIMEOUT_S`          | 300      | timeout of collectives inside the ranks (gloo/NCCL process group)        |
| `CPBENCH_CPU_RANKS`             | 4        | largest CP size a CPU worker runs (gloo ranks on one machine)            |
| `CPBENCH_MAX_GANGS`             | 4        | rank gangs kept alive at once (least recently used one closed first)     |
| `CPBENCH_STOP_GRACE_S`          | 10       | after SIGTERM, how long the current point may still finish before it is released |
| `CPBENCH_MAX_POINTS_PER_SWEEP`  | 20000    | spec limit: grid points per sweep (skipped ones included)                |
| `CPBENCH_MAX_T`                 | 4194304  | spec limit: tokens per point (T, or the sum of a varlen length list)     |
| `CPBENCH_MAX_W`                 | 64       | spec limit: CP size                                                      |
| `CPBENCH_MAX_B`, `_H`, `_K`, `_V` | 1024   | spec limits: batch, heads, key and value head dimensions                 |
| `CPBENCH_MAX_SAMPLES`           | 1000000  | spec limit: `timing.max_samples`                                         |
| `CPBENCH_MAX_POINT_S`           | 600      | spec limit: `timing.timeout_s`, `min_time_s`, `warmup_s` (seconds)        |
| `CPBENCH_POINT_OVERHEAD_S`      | 120      | a point's time limit is this plus twice its timing limits (watchdog and collective timeout) |
| `CPBENCH_STORE_RETRY_MAX_S`     | 30       | a worker's backoff cap between retries while the store is unavailable    |
| `CPBENCH_SPOOL_DIR`             | (artifact dir)/spool | where a finished measurement waits while the store is away   |
| `CPBENCH_PLUGIN_MODULES`        | (none)   | modules a spec's `module:object` backend may import: comma-separated names, or prefixes ending in '.' (`runners.plugins`) |

The database URL and the artifact folder are the store's settings (`db.settings`: `CPBENCH_DATABASE_URL`,
`CPBENCH_ARTIFACT_DIR`). Tests override by setting the variables and calling `get_worker_settings.cache_clear()`.
"""

from __future__ import annotations

from functools import lru_cache

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

__all__ = ["WorkerSettings", "get_worker_settings"]


# the one definition of the points limit: the spec refuses larger grids, the API pages results up to it
DEFAULT_MAX_POINTS_PER_SWEEP = 20_000


class WorkerSettings(BaseSettings):
    """Knobs of `runners.worker` and the limits of `runners.spec`; see the module table."""

    model_config = SettingsConfigDict(env_prefix="CPBENCH_", env_ignore_empty=True, extra="ignore")

    LEASE_S: float = Field(60.0, gt=0, le=86_400, allow_inf_nan=False)
    HEARTBEAT_S: float = Field(10.0, ge=0.1, allow_inf_nan=False)
    POLL_S: float = Field(1.0, gt=0)
    JOB_TIMEOUT_S: float = Field(900.0, gt=0)
    GANG_START_TIMEOUT_S: float = Field(180.0, gt=0)
    PG_TIMEOUT_S: float = Field(300.0, gt=0)
    CPU_RANKS: int = Field(4, ge=1)
    MAX_GANGS: int = Field(4, ge=1)
    STOP_GRACE_S: float = Field(10.0, ge=0)
    MAX_POINTS_PER_SWEEP: int = Field(DEFAULT_MAX_POINTS_PER_SWEEP, ge=1)
    MAX_T: int = Field(1 << 22, ge=1)
    MAX_W: int = Field(64, ge=1)
    MAX_B: int = Field(1024, ge=1)
    MAX_H: int = Field(1024, ge=1)
    MAX_K: int = Field(1024, ge=1)
    MAX_V: int = Field(1024, ge=1)
    MAX_SAMPLES: int = Field(1_000_000, ge=1)
    MAX_POINT_S: float = Field(600.0, gt=0, allow_inf_nan=False)
    POINT_OVERHEAD_S: float = Field(120.0, gt=0, allow_inf_nan=False)
    STORE_RETRY_MAX_S: float = Field(30.0, gt=0, allow_inf_nan=False)
    SPOOL_DIR: str | None = None
    PLUGIN_MODULES: str = ""


@lru_cache(maxsize=1)
def get_worker_settings() -> WorkerSettings:
    return WorkerSettings()
