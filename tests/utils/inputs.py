"""Seeded random inputs in the FLA layout, as the kernels' callers build them (never zeros).

q, v ~ N(0, 1); k ~ N(0, 1) L2-normalised per head over K (FLA's callers normalise k); beta = sigmoid(N(0, 1));
g = lb * sigmoid(N(0, 1)), so lb <= g <= 0 (the decay lower bound of DESIGN §4): `[B, T, H]` for gdn,
`[B, T, H, K]` for kda. Varlen inputs are flattened (B = 1) with int32 `cu_seqlens`. g stays fp32 (a log
decay in bf16 loses the small values); q, k, v, beta take `dtype`.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor


def make_inputs(
    op: str,
    lengths: Sequence[int] | None = None,
    *,
    B: int | None = None,
    T: int | None = None,
    H: int = 2,
    K: int = 32,
    V: int = 32,
    lb: float = -2.0,
    seed: int = 42,
    dtype: torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor | None]:
    """(q, k, v, g, beta, cu_seqlens): varlen from `lengths`, or dense `[B, T, ...]` (cu_seqlens None)."""
    if (lengths is None) == (B is None or T is None):
        raise ValueError(f"give either lengths or both B and T, got lengths={lengths}, B={B}, T={T}")
    if lengths is not None:
        B, T = 1, sum(lengths)
        cu: Tensor | None = torch.tensor([0, *torch.tensor(list(lengths)).cumsum(0).tolist()], dtype=torch.int32, device=device)
    else:
        cu = None
    assert B is not None and T is not None
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(B, T, H, K, generator=gen)
    k = torch.nn.functional.normalize(torch.randn(B, T, H, K, generator=gen), p=2, dim=-1)
    v = torch.randn(B, T, H, V, generator=gen)
    g_shape = (B, T, H) if op == "gdn" else (B, T, H, K)
    g = lb * torch.sigmoid(torch.randn(*g_shape, generator=gen))
    beta = torch.sigmoid(torch.randn(B, T, H, generator=gen))
    q, k, v, beta = (x.to(device=device, dtype=dtype) for x in (q, k, v, beta))
    return q, k, v, g.to(device), beta, cu


def make_state(N: int, H: int, K: int, V: int, *, seed: int = 7, device: str | torch.device = "cpu") -> Tensor:
    """A random fp32 state `[N, H, K, V]`."""
    gen = torch.Generator().manual_seed(seed)
    return torch.randn(N, H, K, V, generator=gen).to(device)


def make_grouped_inputs(
    H: int, HV: int, dim: int, lengths: Sequence[int] | None = None, *, B: int | None = None, T: int | None = None,
    lb: float = -0.5, strong: float = 40.0, seed: int = 3, dtype: torch.dtype = torch.float32,
    device: str | torch.device = "cpu",
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor | None]:
    """GDN inputs with grouped value heads (`make_inputs`, K = V = dim): q, k with H heads, v, g, beta with HV; value
    head 0's gates times `strong` (lb -0.5 -> down to -20 per token), the others weak; g fp32 (fp64 for fp64)."""
    q, k, v, g, beta, cu = make_inputs("gdn", lengths, B=B, T=T, H=HV, K=dim, V=dim, lb=lb, seed=seed, dtype=dtype,
                                       device=device)
    g[:, :, 0] *= strong
    g = g.double() if dtype == torch.float64 else g
    return q[:, :, :H].contiguous(), k[:, :, :H].contiguous(), v, g, beta, cu
