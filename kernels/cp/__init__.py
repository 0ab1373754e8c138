"""CP SCHEMES: context-parallel forwards of GDN/KDA over the kernel primitives (see README.md for the math).

    ctx = kernels.cp.build_context(cu_seqlens, world_size, rank, layout="contiguous")   # host, cached
    q_local = kernels.cp.shard(q, ctx)                                                  # and k, v, g, beta
    o_local = kernels.cp.forward("true_cp", "kda", q_local, ..., group=group, ctx=ctx)
    o = kernels.cp.unshard(all_ranks_o_local, ctx)
    o, report = kernels.cp.warmup_correct("kda", q, k, v, g, beta, cu_seqlens=cu, segments="auto", tol=1e-3)
"""

from kernels.cp.context import LAYOUTS, CPContext, build_context
from kernels.cp.layout import shard, unshard
from kernels.cp.modes import (
    AUTOGRAD_MODES,
    COUNTED_DIRECTIONS,
    MODES,
    SINGLE_DEVICE,
    expected_collectives,
    expected_collectives_gang,
    forward,
)
from kernels.cp.warmup_correct import WarmupReport, warmup_correct

__all__ = [
    "AUTOGRAD_MODES",
    "COUNTED_DIRECTIONS",
    "LAYOUTS",
    "MODES",
    "SINGLE_DEVICE",
    "CPContext",
    "WarmupReport",
    "build_context",
    "expected_collectives",
    "expected_collectives_gang",
    "forward",
    "shard",
    "unshard",
    "warmup_correct",
]
