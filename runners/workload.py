"""Seeded inputs of a grid point, built directly on the device (never zeros, never copied from the host).

From the point (`runners.point.PointSpec`: op, B, T or lengths, H, HV (default H), K, V, lb, dtype, seed), in this order from one generator on
the device: q ~ N(0,1); k ~ N(0,1) L2-normalised over K; v ~ N(0,1); g = lb * sigmoid(N(0,1)) (so lb <= g <= 0,
`[B, T, HV]` for gdn, `[B, T, HV, K]` for kda); beta = sigmoid(N(0,1)); v, g, beta have HV heads. q, k, v, beta take the point's dtype; g
stays fp32 (a bf16 log decay loses its small values). The same point gives the same tensors on every rank of
a gang, so each rank can shard the global inputs itself.

CP schemes take the token axis flattened (B = 1, `cu_seqlens` bounds): `Workload.flat()` gives that view of a
dense batch. `reduced_params` shrinks a point for the reference check (the per-token fp32 recurrence is slow).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
from torch import Tensor

from runners.point import PointSpec

__all__ = ["DTYPES", "Workload", "make_workload", "reduced_params"]

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass
class Workload:
    """Inputs of one point. Dense: `[B, T, ...]`, `cu_seqlens` None. Varlen or flat: `[1, N, ...]` + bounds."""

    op: str
    q: Tensor
    k: Tensor
    v: Tensor
    g: Tensor
    beta: Tensor
    cu_seqlens: Tensor | None  # int32 on the device, or None for dense input
    cu_seqlens_cpu: list[int]  # the sequence bounds over the flattened token axis (always set)

    @property
    def tensors(self) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
        return self.q, self.k, self.v, self.g, self.beta

    def flat(self) -> Workload:
        """The same inputs as one flattened sequence batch `[1, B*T, ...]` with `cu_seqlens` (views, no copy)."""
        if self.cu_seqlens is not None:
            return self
        q, k, v, g, beta = (x.flatten(0, 1).unsqueeze(0) for x in self.tensors)
        cu = torch.tensor(self.cu_seqlens_cpu, dtype=torch.int32, device=self.q.device)
        return replace(self, q=q, k=k, v=v, g=g, beta=beta, cu_seqlens=cu)


def make_workload(point: PointSpec, *, device: torch.device | str) -> Workload:
    """The point's inputs on `device` (see the module docstring for the distributions)."""
    device = torch.device(device)
    op, H, K, V = point.op, point.H, point.K, point.V
    HV = point.value_heads  # grouped value heads: v, g, beta with HV heads
    lb, seed = point.lb, point.seed
    if point.dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {sorted(DTYPES)}, got dtype={point.dtype!r}")
    dtype = DTYPES[point.dtype]
    lengths = point.lengths
    if lengths:
        B, T = 1, int(sum(lengths))
        bounds = [0]
        for n in lengths:
            bounds.append(bounds[-1] + int(n))
    else:
        B, T = point.B, point.T
        bounds = [i * T for i in range(B + 1)]
    gen = torch.Generator(device=device)
    gen.manual_seed(seed)

    def randn(*shape: int) -> Tensor:
        return torch.randn(*shape, generator=gen, device=device, dtype=torch.float32)

    q = randn(B, T, H, K)
    k = torch.nn.functional.normalize(randn(B, T, H, K), p=2, dim=-1)
    v = randn(B, T, HV, V)
    g = lb * torch.sigmoid(randn(B, T, HV) if op == "gdn" else randn(B, T, HV, K))
    beta = torch.sigmoid(randn(B, T, HV))
    q, k, v, beta = (x.to(dtype) for x in (q, k, v, beta))
    cu = torch.tensor(bounds, dtype=torch.int32, device=device) if lengths else None
    return Workload(op=op, q=q, k=k, v=v, g=g, beta=beta, cu_seqlens=cu, cu_seqlens_cpu=bounds)


def reduced_params(point: PointSpec, *, max_tokens: int) -> PointSpec:
    """A smaller point of the same kind for the reference check: at most `max_tokens` tokens (B = 1), at most
    2 heads (W for headwise, which needs H % W == 0), same op, dims, decay, dtype, mode, W, layout and seed.
    Varlen length lists are scaled down keeping their shape (several sequences crossing rank boundaries).
    The token count stays divisible by W (contiguous) or 2W (zigzag)."""
    W = point.W
    unit = 2 * W if point.layout == "zigzag" else W
    total = point.tokens
    n = min(total, max(unit, max_tokens // unit * unit))
    n -= n % unit
    H = W if point.mode == "headwise" else min(point.H, 2)
    HV = H * (point.HV // point.H) if point.HV else None   # the same grouping
    if not (point.lengths or point.B > 1):
        return replace(point, B=1, T=n, H=H, HV=HV, lengths=None)
    lens = list(point.lengths) if point.lengths else [point.T] * point.B
    if total != n:
        scaled = [max(1, x * n // total) for x in lens]
        # fix the rounding so the lengths sum to n exactly (take from or add to the longest)
        while sum(scaled) != n:
            i = max(range(len(scaled)), key=lambda j: scaled[j])
            scaled[i] += 1 if sum(scaled) < n else -1
            if scaled[i] == 0:
                scaled.pop(i)
        lens = scaled
    return replace(point, B=1, T=n, H=H, HV=HV, lengths=tuple(lens))
