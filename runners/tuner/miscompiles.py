"""Launch configs known to crash or miscompute on a device/compiler pair: skipped by the tuner without a launch.

A CUDA error (illegal address) poisons the tuning process, and a silently wrong kernel costs a correctness check
per trial; both were seen on an H200 (sm_90, Triton 3.6.0, 2026-11-30, `benchmarks/results/autotune_h200.md`):
the chunk-state kernels with a 32-wide V block and one pipeline stage hit an illegal memory access
(`chunk_state_transition_fwd`, `chunk_state_output_fwd` at 4 and 8 warps, GDN and KDA, B=1 T=8K and T=64K) or
return garbage (`chunk_state_output_fwd`, relative error 7.8 vs the default config). The same Triton range has a
known Hopper miscompile in FLA's kernels (its issue #640: Triton 3.4 to 3.7.0), so the rule covers that range.

Each rule names kernels, a predicate on the config, the compute capabilities and the Triton versions it
applies to. `known_bad(...)` expands the rules over the kernels' declared spaces into the tuner's
`{kernel: {config: reason}}` form; the tuner records those trials as `failed` with the reason.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from kernels.configs import HOPPER_MISCOMPILE_TRITON, KERNELS, LaunchConfig, import_kernel_modules, version_tuple
from runners.versions import software_versions

__all__ = ["RULES", "Rule", "known_bad"]


@dataclass(frozen=True)
class Rule:
    kernels: tuple[str, ...]
    matches: Callable[[LaunchConfig], bool]
    capabilities: tuple[str, ...]  # compute capabilities ("9.0"); a major alone ("9") covers its minors
    triton_min: tuple[int, ...]  # inclusive
    triton_max: tuple[int, ...]  # inclusive
    reason: str

    def applies(self, capability: str | None, triton_version: str) -> bool:
        if capability is None:
            return False
        if not any(capability == c or capability.split(".")[0] == c for c in self.capabilities):
            return False
        v = version_tuple(triton_version)
        return bool(v) and self.triton_min <= v <= self.triton_max


def _hopper(kernels: tuple[str, ...], matches: Callable[[LaunchConfig], bool], reason: str) -> Rule:
    """A rule for sm_90 under the Triton range with known Hopper miscompiles (`kernels.configs.HOPPER_MISCOMPILE_TRITON`)."""
    return Rule(kernels, matches, ("9",), *HOPPER_MISCOMPILE_TRITON, reason=reason)


RULES: tuple[Rule, ...] = (
    _hopper(
        kernels=("chunk_state_output_fwd", "chunk_state_transition_fwd", "chunk_state_fwd", "chunk_state_ag_fwd"),
        matches=lambda c: c.BV == 32 and c.num_stages == 1,
        reason="known Hopper miscompile (BV=32, one stage): illegal memory access or wrong output on an H200 "
               "with Triton 3.6.0 (chunk_state_fwd, the backward's state recompute: 2026-12-01; "
               "runners/tuner/miscompiles.py)",
    ),
    _hopper(
        kernels=("wy_bwd",),
        matches=lambda c: c.BK == 128 and c.BV == 32 and c.num_stages == 1,
        reason="the WY backward with BK=128, BV=32 and one stage hit an illegal memory access on an H200 with "
               "Triton 3.6.0 (8 warps, GDN and KDA, K=V=128; 2026-12-01, precompile of autotune_h200.py)",
    ),
    _hopper(
        kernels=("chunk_state_bwd",),
        matches=lambda c: c.BV == 32,
        reason="the reverse state pass with BV=32 hit an illegal memory access on an H200 with Triton 3.6.0 (one "
               "stage at K=V=32, two stages at K=V=128; 2026-12-01, kernels/NOTES.md)",
    ),
    _hopper(
        kernels=("chunk_bwd_dqk_wy",),
        matches=lambda c: c.BK == 32 or c.BV == 32,
        reason="the fused gradient kernel with BK = BV = 32 (4 warps, two stages) gave KDA a wrong dk (relative L2 "
               "0.69 against the pair) on an H200 with Triton 3.6.0, with two q/k heads of two value heads each "
               "(GDN's passed; 2026-12-03, session 19's GPU test; kernels.common.dqk_wy_bwd refuses KDA's narrow "
               "blocks there)",
    ),
    _hopper(
        kernels=("gdn_fused_state_output_fwd",),
        matches=lambda c: c.BV == 32,
        reason="GDN's fused state+output pass with BV=32 hit an illegal memory access on an H200 with Triton 3.6.0 "
               "(4 warps, one and three stages, every BV=32 config tried, K=V=128; 2026-12-03, session 16's re-tune)",
    ),
)


def known_bad(capability: str | None, triton_version: str | None = None, kernels: Iterable[str] | None = None,
              rules: Iterable[Rule] = RULES) -> dict[str, dict[LaunchConfig, str]]:
    """{kernel: {config: reason}} of the configs in the registered spaces that a rule rules out on this device.

    triton_version: None = the Triton of this process (`runners.versions.software_versions`). kernels: None = every
    kernel of the build (`kernels.configs.import_kernel_modules`: a rule over a kernel whose module is not imported
    yet must still rule its configs out).
    """
    if triton_version is None:
        triton_version = software_versions()["triton"] or ""
    names = import_kernel_modules() if kernels is None else list(kernels)
    out: dict[str, dict[LaunchConfig, str]] = {}
    for rule in rules:
        if not rule.applies(capability, triton_version):
            continue
        for name in names:
            if name in rule.kernels and name in KERNELS:
                for cfg in KERNELS[name].configs():
                    if rule.matches(cfg):
                        out.setdefault(name, {})[cfg] = rule.reason
    return out
