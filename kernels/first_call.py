"""A tiered first call: the plan a call runs while the TileLang kernels its "auto" choices take are still building.

GDN's "auto" options take TileLang kernels where they run (`LaunchPlan.fwd_pass`: the forward walk, KDA's too; `bwd_grads`: the
reverse walk for long bf16 steps, and since session 33 KDA's two chunk-parallel gradient kernels; `ag_pass` KDA's
Ag pass, GDN's once `AG_HOPPER_AUTO` is on), and TileLang builds one in 17-27 s on the
H200 host (`kernels/NOTES.md` "First call"). Under CPBENCH_TILELANG_BUILD=background (the default,
`kernels.builds.build_mode`) a call does not wait for them:

    dry_runs(kind, op, plan, launch)   `compile_ahead`'s dry run of a new kind of call (`kernels.dispatch._call_kind`):
                                       the call's plan first; its TileLang builds go to the background
                                       (`kernels.builds.BUILDS`, via `parallel_compile.build_beside`). Where one of
                                       them is not ready, the kind is remembered with the keys its "auto" choices
                                       asked for, and the plan it runs meanwhile (`tilelang_fallback`) is dry-run too,
                                       so both plans' Triton kernels compile in the same pool. Under "wait" it waits
                                       for the builds first and falls back only where one failed.
    plan_for(kind, op, plan)           the plan a call of `kind` runs, chosen once at the entry: `plan` once every build
                                       its "auto" choices asked for is ready, `tilelang_fallback(plan, op)` before
                                       (and for good where one failed). The autograd Function keeps the forward's
                                       plan for its backward (`kernels.dispatch.ChunkFunction`): a call never mixes
                                       (what its forward keeps depends on the choices, `fused.walk_keeps_states`).
                                       Warm calls: one truth test of a dict while nothing waits; while a kind waits,
                                       a dict lookup, a subset test and the memoised fallback.
    tilelang_fallback(plan, op)        (pure) `plan` with its "auto" TileLang choices on Triton: fwd_pass and
                                       ag_pass "auto" -> "triton", bwd_grads "auto" -> the op's Triton kernels
                                       (`kernels.vocabulary.AUTO_BWD_GRADS`, what "auto" runs where the walk does
                                       not); explicit options stay (an explicit "tilelang" waits for its build at its
                                       launch). `plan` itself where nothing changes; memoised per op on the plan
                                       object (a loop's calls pass one).
    resolve_plan(plan, op, needs, ready)  (pure) `plan` when `needs` (build keys) are all in `ready`, else the fallback.

Explicit "tilelang" options never tier. Each process (each rank) switches at its own step, when its builds finish;
"wait" keeps every rank on the same kernels from the first step. Off where `compile_ahead` is (CPU, TRITON_INTERPRET=1,
CPBENCH_PARALLEL_COMPILE=0: TileLang is refused or builds at its launch, as before). Expected first call at 1x64K
on the H200 (not yet measured): the Triton-only first call (6.9 s, `benchmarks/results/first_calls_h200.md`) plus the
compiles of the TileLang plan's own Triton kernels in the same pool, against 32.2 s waiting for the builds.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Set
from typing import Any

from kernels.builds import BUILDS, build_mode
from kernels.parallel_compile import asking_builds
from kernels.plan import LaunchPlan
from kernels.vocabulary import AUTO_BWD_GRADS

__all__ = ["dry_runs", "plan_for", "resolve_plan", "tilelang_fallback"]


class _Waiting:
    """The process's kinds of call waiting for builds (process state, as `parallel_compile._Patch.done`): call kind ->
    the build keys its plan's "auto" choices asked for that were not ready at its dry run (dropped once all are built;
    kept where one failed)."""

    needs: dict[Hashable, frozenset[Hashable]] = {}


# op -> (the plan last resolved, its fallback): the calls of a training loop pass one plan object, whose fallback is
# then made once (a memo of `tilelang_fallback`, one entry per op)
_FALLBACK_CACHE: dict[str, tuple[LaunchPlan, LaunchPlan]] = {}


def tilelang_fallback(plan: LaunchPlan, op: str) -> LaunchPlan:
    """`plan` with its "auto" choices that may take a TileLang kernel resolved to Triton (module docstring); `plan`
    itself where it has none."""
    last = _FALLBACK_CACHE.get(op)
    if last is not None and last[0] is plan:
        return last[1]
    changes: dict[str, str] = {}
    if plan.fwd_pass == "auto":
        changes["fwd_pass"] = "triton"
    if plan.ag_pass == "auto":
        changes["ag_pass"] = "triton"
    if plan.bwd_grads == "auto":
        changes["bwd_grads"] = AUTO_BWD_GRADS.get(op, "pair")  # `kernels.common.chunk_bwd`'s "auto" without the walk
    fallback = plan.replace(**changes) if changes else plan
    _FALLBACK_CACHE[op] = (plan, fallback)
    return fallback


def resolve_plan(plan: LaunchPlan, op: str, needs: Set[Hashable], ready: Set[Hashable]) -> LaunchPlan:
    """The plan a call runs: `plan` when every build key its "auto" choices need is ready, else `tilelang_fallback`."""
    return plan if needs <= ready else tilelang_fallback(plan, op)


def plan_for(kind: Hashable, op: str, plan: LaunchPlan) -> LaunchPlan:
    """The plan a call of `kind` runs (module docstring), chosen once at its entry: `resolve_plan` on the keys the kind
    waits for and the builds done."""
    waiting = _Waiting.needs
    if not waiting:  # nothing building: the warm path
        return plan
    needs = waiting.get(kind)
    if needs is None:
        return plan
    resolved = resolve_plan(plan, op, needs, BUILDS.built)
    if resolved is plan:  # built: this kind waits no more
        waiting.pop(kind, None)
    return resolved


def dry_runs(kind: Hashable, op: str, plan: LaunchPlan, launch: Callable[[LaunchPlan], Any]) -> None:
    """`compile_ahead`'s dry run of a new kind of call (module docstring): `launch(plan)` dry-runs the call's launch
    sequence under a plan (`kernels.dispatch._launch_sequence`)."""
    with asking_builds() as asked:
        launch(plan)
    if not asked:
        return
    if build_mode() == "wait":
        BUILDS.wait(asked)
    if asked <= BUILDS.built:
        return
    fallback = tilelang_fallback(plan, op)
    if fallback is plan:  # explicit TileLang options only: each waits for its build at its launch
        return
    with asking_builds() as explicit:  # the fallback's own builds: its explicit "tilelang" options
        launch(fallback)
    needs = frozenset(asked - explicit)
    if needs and not needs <= BUILDS.built:
        _Waiting.needs[kind] = needs
