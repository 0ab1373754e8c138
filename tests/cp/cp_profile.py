"""Count collectives and host syncs in one profiled step (tests only; runners/profile.py is the product's version).

Collectives are counted by their backend-neutral `c10d::*` op events (gloo and NCCL alike;
anchors/cpu-feasibility.md §3). A host sync shows as `aten::item` + `aten::_local_scalar_dense`; with
`with_stack=True` each event's parents name the Python frames it ran under, so a sync can be attributed.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch.profiler import ProfilerActivity, profile

KINDS = {
    "c10d::alltoall_base_": "all_to_all",
    "c10d::alltoall_": "all_to_all",
    "c10d::_allgather_base_": "all_gather",
    "c10d::allgather_": "all_gather",
    "c10d::allgather_into_tensor_coalesced_": "all_gather",
    "c10d::send": "send",
    "c10d::recv_": "recv",
    "c10d::allreduce_": "all_reduce",
    "c10d::broadcast_": "broadcast",
    "c10d::_reduce_scatter_base_": "reduce_scatter",
    "c10d::barrier": "barrier",
}
SYNCS = ("aten::item", "aten::_local_scalar_dense")
# the kernels layer checks g <= 0 on CPU tensors only (kernels/validate.py; skipped on CUDA): its syncs are expected
ALLOWED_SYNC_FRAME = "check_gate_sign"


def profile_step(step: Callable[[], Any]) -> dict[str, Any]:
    """Run `step` once under the profiler; returns collective counts, c10d ops not classified, and syncs by origin."""
    with profile(activities=[ProfilerActivity.CPU], with_stack=True) as prof:
        step()
    counts: dict[str, int] = {}
    other: list[str] = []
    syncs_cp, syncs_gate = 0, 0
    for e in prof.events():
        if e.name.startswith("c10d::"):
            kind = KINDS.get(e.name)
            if kind is None:
                other.append(e.name)
            else:
                counts[kind] = counts.get(kind, 0) + 1
        elif e.name in SYNCS:
            p, allowed = e.cpu_parent, False
            while p is not None:
                if p.name.endswith(ALLOWED_SYNC_FRAME):
                    allowed = True
                    break
                p = p.cpu_parent
            if allowed:
                syncs_gate += 1
            else:
                syncs_cp += 1
    return {"collectives": counts, "other_c10d": other, "syncs": syncs_cp, "gate_check_syncs": syncs_gate}
