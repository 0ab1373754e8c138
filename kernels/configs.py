"""Launch configs of the Triton kernels: what a kernel accepts, its default and its tuning space.

Every Triton kernel of the suite registers one `KernelSpec` here (at import of the module that
defines it). The tuner (`runners/tuner`) searches `spec.space`; the autotune loader
(`kernels/autotune.py`) reads a `LaunchConfig` per shape key; launchers take theirs from the call's launch plan
(`kernels.plan.LaunchPlan.config_for`) and never use a hidden `triton.autotune`.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass, field, fields
from typing import Any

__all__ = [
    "HOPPER_MISCOMPILE_TRITON",
    "KERNELS",
    "KernelSpec",
    "LaunchConfig",
    "get_spec",
    "head_block",
    "register",
    "version_tuple",
]

# the Triton versions (inclusive) with known Hopper (sm_90) miscompiles: FLA's #640 and ours
# (`runners.tuner.miscompiles`' rules; `kernels.common.dqk_wy_bwd` refuses one case at run time)
HOPPER_MISCOMPILE_TRITON: tuple[tuple[int, ...], tuple[int, ...]] = ((3, 4), (3, 7, 0))


def version_tuple(text: str) -> tuple[int, ...]:
    """The numeric part of a version: "3.6.0" -> (3, 6, 0); "3.7.0+git1234" -> (3, 7, 0); "3.4.0rc1" -> (3, 4, 0); "" -> ()."""
    out: list[int] = []
    for part in text.split("+")[0].split("."):
        m = re.match(r"\d+", part)
        if m is None:
            break
        out.append(int(m.group()))
        if m.end() != len(part):  # a pre-release suffix ends the numeric part
            break
    return tuple(out)


@dataclass(frozen=True)
class LaunchConfig:
    """Meta-parameters of one launch. `BK`/`BV` are None where a kernel does not tile that dim; `BR` (the rows of a
    chunk-parallel kernel's product tiles, e.g. `wy_gdn_ag_fwd`'s 16 or 64) is None where a kernel has one tiling;
    `VARIANT` (a bit set of a kernel's code variants, e.g. `kernels.ops.gdn.fused.FUSED_VARIANTS`) None: its default code."""

    BV: int | None = None
    BK: int | None = None
    num_warps: int = 4
    num_stages: int = 2
    BR: int | None = None
    VARIANT: int | None = None

    def as_dict(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if v is not None}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> LaunchConfig:
        names = {f.name for f in fields(cls)}
        unknown = set(d) - names
        if unknown:
            raise ValueError(f"unknown launch-config fields {sorted(unknown)}; expected a subset of {sorted(names)}")
        for k, v in d.items():
            if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v <= 0):
                raise ValueError(f"launch-config field {k!r} must be a positive int, got {v!r}")
        return cls(**dict(d))


@dataclass(frozen=True)
class KernelSpec:
    """A Triton kernel as the tuner and the loader see it.

    key: the launch arguments its speed depends on (the shape key of tuned configs).
    default: the config used when nothing is tuned.
    space: the values each config field may take; the product is the search space.
    hints: configs of the space a budgeted search always measures (after the default), e.g. those the compiler
        reports free of register spills (benchmarks/results/ptxas_bwd_sm90.md); a random draw fills the rest.
    """

    name: str
    key: tuple[str, ...]
    default: LaunchConfig
    space: Mapping[str, tuple[int, ...]] = field(default_factory=dict)
    hints: tuple[LaunchConfig, ...] = ()

    def __post_init__(self) -> None:
        space = set(self.configs()) if self.hints else set()
        for h in self.hints:
            if h not in space:
                raise ValueError(f"kernel spec {self.name!r}: hint {h.as_dict()} is not a config of its space")

    def configs(self) -> Iterator[LaunchConfig]:
        """Every config of the space (the product of the fields' values), in a deterministic order."""
        names = sorted(self.space)
        for values in itertools.product(*(self.space[n] for n in names)):
            yield LaunchConfig(**{**self.default.as_dict(), **dict(zip(names, values, strict=True))})


KERNELS: dict[str, KernelSpec] = {}


def cdiv(a: int, b: int) -> int:
    """ceil(a / b) for the host's grids: `triton.cdiv` is a constexpr function in Triton 3.6, about 2 us a call on the
    host through its wrapper (session 21: 16 calls a short training step)."""
    return -(-a // b)


def next_power_of_2(n: int) -> int:
    """The smallest power of two >= n (n >= 1), on the host (`triton.next_power_of_2`'s wrapper cost: `cdiv`)."""
    return 1 << (n - 1).bit_length()


def head_block(d: int) -> int:
    """The tile that holds a whole head dim d: the next power of two, at least 16 (tl.arange needs a power of two,
    tl.dot tiles >= 16); the columns past d are masked (128 -> 128, 100 -> 128, 60 -> 64, 8 -> 16)."""
    return max(16, next_power_of_2(d))


def register(spec: KernelSpec) -> KernelSpec:
    if spec.name in KERNELS and KERNELS[spec.name] != spec:
        raise ValueError(f"kernel spec {spec.name!r} registered twice with different contents")
    KERNELS[spec.name] = spec
    return spec


def import_kernel_modules() -> list[str]:
    """Import every module of `kernels.common` and of each op in `kernels.ops` (each registers its Triton kernels'
    `KernelSpec`s on import) and return the registered names, sorted: the whole registry, whatever the caller
    imported before (a chunk.py imports its Triton modules only when it runs)."""
    import importlib
    import pkgutil

    import kernels.common
    import kernels.ops

    for package in (kernels.common, kernels.ops):
        for m in pkgutil.walk_packages(package.__path__, prefix=f"{package.__name__}."):
            importlib.import_module(m.name)
    return sorted(KERNELS)


def get_spec(name: str) -> KernelSpec:
    try:
        return KERNELS[name]
    except KeyError:
        raise ValueError(f"unknown kernel {name!r}; registered: {sorted(KERNELS)}") from None
