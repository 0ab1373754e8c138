"""LAUNCH PLANS: what the Triton launchers of one call launch with, handed down as an argument (no process globals).

    rec = kernels.LaunchRecorder()
    plan = kernels.LaunchPlan(configs={"chunk_state_fwd": LaunchConfig(BV=32)}, keep="wy", recorder=rec)
    o, ht = kernels.forward("gdn", q, k, v, g, beta, backend="triton", plan=plan)
    rec["chunk_state_fwd"]                      # (its shape key, the LaunchConfig it launched with)

`LaunchPlan` (frozen) holds
    configs    explicit configs per kernel name (they win);
    table      an `AutotuneTable` (kernels.autotune) of tuned configs, resolved per launch shape key, or None;
    keep       the triton backend's recompute policy, one of `kernels.vocabulary.KEEP_POLICIES`; "auto" (the default)
               = `kernels.vocabulary.AUTO_KEEP`'s per op (`keep_for`: "ag", the Ag pass's outputs, for both; KDA's
               WY path, where the TileLang walk does not run, keeps nothing under it);
    bwd_grads  the backward's gradient kernels, one of `kernels.vocabulary.BWD_GRADS` (`kernels.common.chunk_bwd`;
               "auto", the default: GDN's TileLang reverse walk for long bf16 steps where it runs, else the Triton
               kernels of `kernels.vocabulary.AUTO_BWD_GRADS`);
    fwd_pass   the two-kernel forward's state+output pass (and the state recompute of GDN's reverse-walk
               backward), one of `kernels.vocabulary.FWD_PASSES`: "auto" (the default: the TileLang walk in bf16
               where it runs, else Triton; KDA's too since session 29, `kernels.ops.gdn.fwd_walk.KDA_WALK_AUTO`), "triton"
               or "tilelang" (`kernels.ops.gdn.fwd_walk`; KDA's in the Ag pass's gated form);
    ag_pass    the two-kernel forward's Ag pass, one of `kernels.vocabulary.AG_PASSES`: "auto" (the default: Triton
               at every shape: the TileLang kernels were 2x its time on the H200 in session 29), "triton" or "tilelang" (GDN's
               `kernels.ops.gdn.ag_hopper`, KDA's `kernels.ops.kda.ag_hopper`, which stores the gated form);
    bwd_warm   the backward's gate-certified warm window in chunks for its split reverse state pass, 0 = exact, None
               (the default) = `kernels.vocabulary.AUTO_BWD_WARM`'s per op (`bwd_warm_for`; `kernels.common.warm_bwd`);
    recorder   a `LaunchRecorder` the caller made, told every launch's (key, config), or None.
A launcher's config is `plan.config_for(spec, key)`: the explicit one, else the table's for the key, else the
kernel's default (BV clamped to a small head dim where the launcher says so), recorded in the plan's recorder.
An autograd Function keeps the plan of its forward for its backward.

`default_plan()` is what a call without `plan=` uses (a training job's convenience): the plan set in this context
by `use_autotune(path)` / `set_default_plan(plan)`, else the one `CPBENCH_AUTOTUNE=path` names (read at the first
call that needs a plan, not at import; one load per (path, strict)), else `LaunchPlan()` (every kernel at its
default). The set plan lives in a `contextvars.ContextVar`: it holds in the thread (and asyncio task) that set it
and in contexts copied from it; a thread started later sees the `CPBENCH_AUTOTUNE` plan. Autograd's backward
thread needs none: the Function captured its plan at forward.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
from collections.abc import Iterator, Mapping
from contextvars import ContextVar
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from kernels.autotune import AutotuneTable, load_autotune
from kernels.configs import KernelSpec, LaunchConfig
from kernels.vocabulary import (  # the triton backend's options (first: default)
    AG_PASSES,
    AUTO_BWD_WARM,
    AUTO_KEEP,
    BWD_GRADS,
    FWD_PASSES,
    KEEP_POLICIES,
)

__all__ = ["LaunchPlan", "LaunchRecorder", "default_plan", "launch_config", "plan_with",
           "set_default_plan", "use_autotune"]

logger = logging.getLogger(__name__)


Launch = tuple[dict[str, Any], LaunchConfig]


class LaunchRecorder(Mapping[str, Launch]):
    """What launched, per kernel name: (the launch's shape key, the config it launched with), the latest launch of
    each kernel. The caller makes one, passes it in a plan, and reads it as a mapping; `clear()` forgets."""

    def __init__(self) -> None:
        self._launches: dict[str, Launch] = {}

    def record(self, name: str, key: Mapping[str, Any], cfg: LaunchConfig) -> None:
        self._launches[name] = (dict(key), cfg)

    def clear(self) -> None:
        self._launches.clear()

    def __getitem__(self, name: str) -> Launch:
        return self._launches[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._launches)

    def __len__(self) -> int:
        return len(self._launches)

    def __repr__(self) -> str:
        return f"LaunchRecorder({self._launches!r})"


@dataclass(frozen=True)
class LaunchPlan:
    """The launch configs and recompute policy of one call (module docstring); a one-line ValueError for a `keep`
    outside KEEP_POLICIES."""

    configs: Mapping[str, LaunchConfig] = field(default_factory=dict)
    table: AutotuneTable | None = None
    keep: str = KEEP_POLICIES[0]
    bwd_grads: str = BWD_GRADS[0]
    bwd_warm: int | None = None
    fwd_pass: str = FWD_PASSES[0]
    ag_pass: str = AG_PASSES[0]
    recorder: LaunchRecorder | None = None

    def __post_init__(self) -> None:
        if self.keep not in KEEP_POLICIES:
            raise ValueError(f"LaunchPlan.keep must be one of {', '.join(KEEP_POLICIES)}, got {self.keep!r}")
        if self.bwd_grads not in BWD_GRADS:
            raise ValueError(f"LaunchPlan.bwd_grads must be one of {', '.join(BWD_GRADS)}, got {self.bwd_grads!r}")
        if self.fwd_pass not in FWD_PASSES:
            raise ValueError(f"LaunchPlan.fwd_pass must be one of {', '.join(FWD_PASSES)}, got {self.fwd_pass!r}")
        if self.ag_pass not in AG_PASSES:
            raise ValueError(f"LaunchPlan.ag_pass must be one of {', '.join(AG_PASSES)}, got {self.ag_pass!r}")
        if self.bwd_warm is not None and (
            isinstance(self.bwd_warm, bool) or not isinstance(self.bwd_warm, int) or self.bwd_warm < 0
        ):
            raise ValueError(
                f"LaunchPlan.bwd_warm must be None (per op) or an int >= 0 (chunks; 0 = exact), got {self.bwd_warm!r}"
            )
        object.__setattr__(self, "configs", MappingProxyType(dict(self.configs)))

    def bwd_warm_for(self, op: str) -> int:
        """The reverse state pass's warm window of `op` in chunks (0: exact): `bwd_warm`, or AUTO_BWD_WARM's at None."""
        return AUTO_BWD_WARM.get(op, 0) if self.bwd_warm is None else self.bwd_warm

    def config_for(self, spec: KernelSpec, key: Mapping[str, Any], override: LaunchConfig | None = None, *,
                   bv_limit: int | None = None) -> LaunchConfig:
        """The config a launcher uses: `override`, else the plan's explicit one, else the table's for `key`, else
        the default; BV clamped to `bv_limit` (a small head dim); recorded as launched. Host facts only."""
        cfg = override or self.configs.get(spec.name)
        if cfg is None and self.table is not None:
            cfg = self.table.resolve(spec, key)
        if cfg is None:
            cfg = spec.default
        if bv_limit is not None and cfg.BV is not None and bv_limit < cfg.BV:
            cfg = dataclasses.replace(cfg, BV=bv_limit)
        if self.recorder is not None:
            self.recorder.record(spec.name, key, cfg)
        return cfg

    def keep_for(self, op: str) -> str:
        """`op`'s recompute policy: `keep`, or AUTO_KEEP's at "auto"."""
        return AUTO_KEEP.get(op, "inputs") if self.keep == "auto" else self.keep

    def keeps(self, op: str) -> tuple[bool, bool]:
        """(the forward keeps something for the backward: the Ag pass's outputs ("ag", "ag+states") or the WY factors,
        and the WY path's chunk states ("wy+states")) under `op`'s policy (`keep_for`): what a caller of the forward
        hands it (`keep=`, `keep_states=`); the fused path's own choice is `keeps_ag`."""
        keep = self.keep_for(op)
        return keep != "inputs", keep == "wy+states"

    def keeps_ag(self, op: str) -> tuple[bool, bool]:
        """(the two-kernel forward keeps its Ag pass's outputs: "ag", "ag+states"; and its fused pass's chunk states,
        v_new and segment maps: "ag+states") under `op`'s policy (`kernels.common.chunk_fwd`, `kernels.ops.gdn.fused`)."""
        keep = self.keep_for(op)
        return keep in ("ag", "ag+states"), keep == "ag+states"

    def replace(self, **changes: Any) -> LaunchPlan:
        """A copy with some fields changed (`dataclasses.replace`)."""
        return dataclasses.replace(self, **changes)

    def with_recorder(self, recorder: LaunchRecorder | None) -> LaunchPlan:
        return self.replace(recorder=recorder)

    def with_configs(self, configs: Mapping[str, LaunchConfig]) -> LaunchPlan:
        """A copy whose explicit configs are this plan's with `configs` on top."""
        return self.replace(configs={**self.configs, **configs}) if configs else self


# the plan set by use_autotune / set_default_plan in this context (None: CPBENCH_AUTOTUNE's)
_CHOSEN: ContextVar[LaunchPlan | None] = ContextVar("kernels_default_plan", default=None)


def default_plan() -> LaunchPlan:
    """The plan of a call without `plan=` (module docstring); CPBENCH_AUTOTUNE's file is loaded here, once."""
    chosen = _CHOSEN.get()
    return chosen if chosen is not None else _env_plan(*_env_setting())


def launch_config(plan: LaunchPlan | None, spec: KernelSpec, key: Mapping[str, Any], *,
                  bv_limit: int | None = None) -> LaunchConfig:
    """A launcher's config: `plan.config_for(spec, key)`, the default plan's for a launcher called without one."""
    return (plan if plan is not None else default_plan()).config_for(spec, key, bv_limit=bv_limit)


def plan_with(plan: LaunchPlan | None, configs: Mapping[str, LaunchConfig]) -> LaunchPlan:
    """`plan` (None: `default_plan()`) with the call's explicit `config=` configs on top."""
    return (plan if plan is not None else default_plan()).with_configs(configs)


def set_default_plan(plan: LaunchPlan | None) -> None:
    """Make `plan` this context's default plan; None: back to the one of CPBENCH_AUTOTUNE (or defaults)."""
    _CHOSEN.set(plan)


def use_autotune(path: str | os.PathLike[str] | None, *, strict: bool = True,
                 device_name: str | None = None) -> AutotuneTable | None:
    """Load an autotune file into this context's default plan, so calls without `plan=` launch with its configs;
    None removes it (defaults again). Returns the loaded table.

    Examples::

        import kernels
        kernels.use_autotune("autotune_h200.json")         # or: CPBENCH_AUTOTUNE=autotune_h200.json python train.py
        o, _ = kernels.forward("gdn", q, k, v, g, beta)    # launches with the tuned configs for these shapes
    """
    table = load_autotune(path, strict=strict, device_name=device_name) if path is not None else None
    set_default_plan(default_plan().replace(table=table))
    if table is not None:
        logger.info("autotune: loaded %s (%d kernels, device %s)", path, len(table.entries), table.device_name)
    return table


def _env_setting() -> tuple[str, bool]:
    """(CPBENCH_AUTOTUNE's path or "", strict unless CPBENCH_AUTOTUNE_STRICT says 0/false/no)."""
    path = os.environ.get("CPBENCH_AUTOTUNE", "").strip()
    if not path:
        return "", True
    flag = os.environ.get("CPBENCH_AUTOTUNE_STRICT", "1").strip().lower()
    if flag not in ("0", "1", "true", "false", "yes", "no", ""):
        raise ValueError(f"CPBENCH_AUTOTUNE_STRICT must be one of 0, 1, true, false, yes, no; got {flag!r}")
    return path, flag not in ("0", "false", "no")


@functools.lru_cache(maxsize=8)
def _env_plan(path: str, strict: bool) -> LaunchPlan:
    """The plan of CPBENCH_AUTOTUNE=path (memoised: one load per setting); the device check waits for the first
    launch, so this never initialises CUDA."""
    if not path:
        return LaunchPlan()
    return LaunchPlan(table=load_autotune(path, strict=strict, defer_device_check=True))
