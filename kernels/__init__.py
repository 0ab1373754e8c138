"""cpbench kernel suite: exact forward kernels of GDN and KDA on several backends, segment transitions, CP schemes.

Public surface (a contract; DESIGN.md §1-§3):

    o, ht = kernels.forward(op, q, k, v, g, beta, *, scale=None, initial_state=None, output_final_state=False,
                            cu_seqlens=None, backend="auto", config=None, plan=None)
    M, S_ext = kernels.transition(op, k, v, g, beta, *, cu_seqlens=None, backend="auto", config=None, plan=None)
    o, ht = kernels.chunk_gdn(q, k, v, g, beta, *, scale=None, initial_state=None, output_final_state=False,
                              cu_seqlens=None, backend="auto", use_qk_l2norm_in_kernel=False, plan=None)  # differentiable
    o, ht = kernels.chunk_kda(...)                                # (FLA's signatures; kernels/ops/<op>/chunk.py)
    dq, dk, dv, dg, dbeta, dh0 = kernels.backward(op, q, k, v, g, beta, do, *, dht=None, ...)    # kernels.api
    o, ht = kernels.reference(op, q, k, v, g, beta, ...)        # per-token fp32 ground truth
    M, S = kernels.compose(M1, S1, M2, S2);  S = kernels.chain(M, S_ext, S0=None)
    kernels.use_autotune(path)                                   # tuned launch configs for the default plan
    o, ht = kernels.forward(..., plan=kernels.LaunchPlan(configs=..., table=..., keep="wy", recorder=rec))
    plan = kernels.default_plan()                                # what a call without plan= uses (kernels.plan)
    kernels.wait_for_builds(timeout=None)     # the TileLang kernels building in the background (kernels.builds): a
                                              # first call runs on Triton meanwhile (kernels.first_call)

`kernels` imports only torch (Triton when the triton backend runs, FLA when the fla backend runs), each name on
first use: `import kernels.vocabulary` (the suite's names and counts, standard library only) loads no torch.
"""

from __future__ import annotations

import importlib
import os
from typing import Any

_FROM: dict[str, tuple[str, ...]] = {  # module -> its public names here, each imported on first use (PEP 562)
    "kernels.api": ("backward", "chain", "compose", "forward", "reference", "transition"),
    "kernels.builds": ("wait_for_builds",),
    "kernels.configs": ("KernelSpec", "LaunchConfig"),
    "kernels.ops.gdn.chunk": ("chunk_gdn",),
    "kernels.ops.kda.chunk": ("chunk_kda",),
    "kernels.plan": ("LaunchPlan", "LaunchRecorder", "default_plan"),
    "kernels.vocabulary": ("BACKENDS", "OPS"),
}
_RENAMED = {"backward": "chunk_backward"}  # public name -> the module's name
_LAZY = {name: module for module, names in _FROM.items() for name in names}

__all__ = sorted([*_LAZY, "use_autotune"])


def __getattr__(name: str) -> Any:
    """The public names, each imported on first use, so `import kernels.vocabulary` loads no torch."""
    if name not in _LAZY:
        raise AttributeError(f"module 'kernels' has no attribute {name!r}")
    value = getattr(importlib.import_module(_LAZY[name]), _RENAMED.get(name, name))
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


def use_autotune(path: str | os.PathLike[str] | None, *, strict: bool = True, **kwargs: Any) -> Any:
    """Load a tuned-config JSON (exported by `cpbench configs export`) into the default launch plan, so calls without
    `plan=` use its configs; None removes it.

    A thin forwarder to `kernels.plan.use_autotune(path, strict=strict, **kwargs)`, imported on first use.
    CPBENCH_AUTOTUNE=path/to/autotune.json does the same, at the first call that needs the default plan.
    """
    try:
        plan = importlib.import_module("kernels.plan")
    except ModuleNotFoundError as err:
        if err.name == "kernels.plan":
            raise ImportError("kernels.use_autotune needs the module kernels.plan, which is not available") from err
        raise
    return plan.use_autotune(path, strict=strict, **kwargs)
