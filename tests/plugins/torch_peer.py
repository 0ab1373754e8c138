"""An example peer backend (what a team writes to benchmark its own kernel): a pure-torch per-token recurrence.

Sweep it with `backends: ["tests.plugins.torch_peer:PEER"]` (or register it under the entry point group
`cpbench.backends`). It implements `none` (the whole batch) and `all_gather` (gather every rank's shard with
torch.distributed, run the whole batch, keep this rank's tokens). `none` also runs forward+backward: the recurrence
is plain torch, so autograd differentiates it (the engine times forward + `o.backward(do)`). The protocol it
follows is `runners.peers`' (a point arrives as a `runners.point.PointSpec`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from torch import Tensor

from kernels import cp

if TYPE_CHECKING:
    from runners.point import PointSpec


def recurrent(op: str, q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, bounds: tuple[int, ...],
              scale: float) -> Tensor:
    """The delta rule token by token in fp32 over the varlen batch `[1, T, ...]` with sequence `bounds`."""
    _, T, H, K = q.shape
    o = torch.zeros(1, T, H, v.shape[-1], dtype=torch.float32, device=q.device)
    qf, kf, vf, gf, bf = (x.float() for x in (q, k, v, g, beta))
    for bos, eos in zip(bounds[:-1], bounds[1:], strict=True):
        S = torch.zeros(H, K, v.shape[-1], dtype=torch.float32, device=q.device)
        for t in range(bos, eos):
            a = gf[0, t].exp()                                   # [H] (gdn) or [H, K] (kda)
            S = S * (a[:, None, None] if op == "gdn" else a[:, :, None])
            kt = kf[0, t]                                        # [H, K]
            err = vf[0, t] - torch.einsum("hkv,hk->hv", S, kt)  # [H, V]
            S = S + bf[0, t][:, None, None] * kt[:, :, None] * err[:, None, :]
            o[0, t] = scale * torch.einsum("hkv,hk->hv", S, qf[0, t])
    return o.to(q.dtype)


class TorchPeer:
    name = "torchpeer"
    modes = {"none": ("fwd", "fwd+bwd"), "all_gather": ("fwd",)}
    options: Mapping[str, Any] = {}

    def skip_reason(self, point: PointSpec) -> str | None:
        return "torchpeer loops over tokens in Python: at most 4096 tokens" if point.B * point.T > 4096 else None

    def expected_collectives(self, mode: str, ctx: Any, options: Mapping[str, Any]) -> dict[str, int]:
        return {"all_gather": 5} if mode == "all_gather" else {}  # q, k, v, g, beta

    def forward(self, mode: str, op: str, q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, *, group: Any,
                ctx: Any, scale: float | None, options: Mapping[str, Any]) -> Tensor:
        s = q.shape[-1] ** -0.5 if scale is None else scale
        if mode == "none":
            return recurrent(op, q, k, v, g, beta, ctx.cu_seqlens, s)
        world = ctx.world_size
        full = []
        for x in (q, k, v, g, beta):
            shards = [torch.empty_like(x) for _ in range(world)]
            dist.all_gather(shards, x.contiguous(), group=group)
            full.append(cp.unshard(shards, ctx))
        o = recurrent(op, *full, ctx.cu_seqlens, s)
        return cp.shard(o, ctx)


PEER = TorchPeer()
