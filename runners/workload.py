"""Seeded inputs, built directly on the device (never zeros, never copied from the host): the suite's one input
maker, `make_inputs(op, B=, T=, H=, K=, V=, ...)`, which a grid point (`make_workload`), the tuner
(`runners.tuner.make_case`) and the benches (`runners.bench`) all call; `TORCH_DTYPES` maps the vocabulary's dtype
names (`kernels.vocabulary.DTYPES`) to torch dtypes.

From explicit shapes (op, B, T or lengths, H, HV (default H), K, V, lb, dtype, seed), in this order from one generator
on the device: q ~ N(0,1); k ~ N(0,1) L2-normalised over K; v ~ N(0,1); g = lb * sigmoid(N(0,1)) (so lb <= g <= 0,
`[B, T, HV]` for gdn, `[B, T, HV, K]` for kda); beta = sigmoid(N(0,1)); then, when asked, the initial state
h0 ~ N(0,1) `[N, HV, K, V]` (fp32, N sequences) and the output gradient do ~ N(0,1) `[B, T, HV, V]`. v, g, beta have
HV heads. q, k, v, beta, do take the dtype; g stays fp32 (a bf16 log decay loses its small values). A real-model gate
(`gate="in_kernel"` or `"safe"`) draws, after all of those, the models' initialisation (Mamba2's, which Qwen3-Next's
and FLA's KDA layers use): A_log = log U(1, 16) `[HV]` and dt_bias = softplus^-1(dt) with dt = exp(U(ln 1e-3,
ln 1e-1)) (`[HV]` gdn, `[HV * K]` kda), then the raw gate ~ N(0,1) (fp32, g's shape), which takes g's place: the
inputs of older points never change. So softplus(dt_bias) lies in [1e-3, 0.1] and the gate is mostly -0.01..-2. `fla_recipe`
is FLA's anchor recipe instead (../shared/anchors/fla-h200.md, what the kernel benches compare against): q is
L2-normalised too and g takes the dtype; with `lb=None` the gate is g = logsigmoid(N(0,1)). The same arguments
give the same tensors on every rank of a gang, so each rank can shard the global inputs itself.

`Activation` is what a step does to the stored inputs before the kernels (the real models' in-kernel work, per token,
so a CP rank applies it to its own shard): the gate (`kernels.common.gate.activate_gate`) and `l2norm_in_kernel`
(`kernels.common.l2norm`). A_log and dt_bias are the step's extra inputs (`Workload.params`): replicated on every
rank, so a rank's gradient is its contribution and the gang's is their sum.

CP schemes take the token axis flattened (B = 1, `cu_seqlens` bounds): `Workload.flat()` gives that view of a
dense batch. `reduced_params` shrinks a point for the reference check (the per-token fp32 recurrence is slow).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

import torch
from torch import Tensor

from kernels.vocabulary import DTYPES
from runners.point import PointSpec

__all__ = ["INPUT_NAMES", "PARAM_NAMES", "TORCH_DTYPES", "Activation", "Workload", "make_inputs", "make_workload",
           "reduced_params"]

TORCH_DTYPES: dict[str, torch.dtype] = {name: getattr(torch, name) for name in DTYPES}  # name -> torch dtype
INPUT_NAMES = ("q", "k", "v", "g", "beta")  # the op's differentiable inputs, in call order (`Workload.tensors`)
PARAM_NAMES = ("A_log", "dt_bias")  # a real-model gate's parameters (`Workload.params`), replicated on every rank


@dataclass(frozen=True)
class Activation:
    """The step's per-token work on the stored inputs: the gate (`precomputed`: none; `in_kernel` / `safe`:
    `activate_gate` with lower_bound None / `lower_bound`) and q, k L2-normalisation (`l2norm`)."""

    op: str
    gate: str = "precomputed"
    lower_bound: float | None = None
    l2norm: bool = False

    @classmethod
    def of(cls, point: PointSpec) -> Activation:
        return cls(op=point.op, gate=point.gate, lower_bound=point.lower_bound if point.gate == "safe" else None,
                   l2norm=point.l2norm_in_kernel)

    @property
    def identity(self) -> bool:
        """True when the step passes the inputs as they are (every point before the real-model gates)."""
        return self.gate == "precomputed" and not self.l2norm

    def __call__(self, xs: Sequence[Tensor]) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
        """(q, k, v, g, beta) for the kernels from the stored `xs` = (q, k, v, g or the raw gate, beta, *params)."""
        q, k, v, g, beta = xs[:5]
        if self.l2norm:
            from kernels.common.l2norm import l2norm

            q, k = l2norm(q), l2norm(k)
        if self.gate != "precomputed":
            from kernels.common.gate import activate_gate

            A_log, dt_bias = xs[5:7]
            g = activate_gate(self.op, g, A_log=A_log, dt_bias=dt_bias, lower_bound=self.lower_bound)
        return q, k, v, g, beta


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
    initial_state: Tensor | None = None  # h0 `[N, HV, K, V]` fp32, when asked for
    do: Tensor | None = None  # the output gradient of a training step, when asked for
    params: tuple[Tensor, ...] = ()  # (A_log, dt_bias) of a real-model gate (then g is the raw gate), else ()

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


def make_inputs(op: str, *, B: int, T: int, H: int, K: int, V: int, device: torch.device | str, HV: int | None = None,
                lb: float | None, dtype: str = "bfloat16", seed: int = 0, lengths: Sequence[int] | None = None,
                initial_state: bool = False, grad_out: bool = False, fla_recipe: bool = False,
                gate: str = "precomputed") -> Workload:
    """Seeded inputs of one shape on `device` (the module docstring gives the distributions and the draw order).

    `lengths` (varlen) replaces the B sequences of T tokens: B = 1, T = sum(lengths), `cu_seqlens` on the device.
    `initial_state` / `grad_out` draw h0 / do after the inputs (so the inputs do not change with them); a real-model
    `gate` (`in_kernel`, `safe`) draws A_log, dt_bias and the raw gate last, which replaces g.
    """
    if dtype not in TORCH_DTYPES:
        raise ValueError(f"dtype must be one of {sorted(TORCH_DTYPES)}, got dtype={dtype!r}")
    dt, HV, device = TORCH_DTYPES[dtype], HV or H, torch.device(device)
    if lengths:
        B, T = 1, int(sum(lengths))
        bounds = [0]
        for n in lengths:
            bounds.append(bounds[-1] + int(n))
    else:
        bounds = [i * T for i in range(B + 1)]
    gen = torch.Generator(device=device)
    gen.manual_seed(seed)

    def randn(*shape: int) -> Tensor:
        return torch.randn(*shape, generator=gen, device=device, dtype=torch.float32)

    q = randn(B, T, H, K)
    q = torch.nn.functional.normalize(q, p=2, dim=-1) if fla_recipe else q
    k = torch.nn.functional.normalize(randn(B, T, H, K), p=2, dim=-1)
    v = randn(B, T, HV, V)
    x = randn(B, T, HV) if op == "gdn" else randn(B, T, HV, K)
    g = torch.nn.functional.logsigmoid(x) if lb is None else lb * torch.sigmoid(x)
    beta = torch.sigmoid(randn(B, T, HV))
    h0 = randn(len(bounds) - 1, HV, K, V) if initial_state else None
    do = randn(B, T, HV, V).to(dt) if grad_out else None
    params: tuple[Tensor, ...] = ()
    if gate != "precomputed":
        A_log = torch.log(1.0 + 15.0 * torch.rand(HV, generator=gen, device=device, dtype=torch.float32))
        u = torch.rand(HV if op == "gdn" else HV * K, generator=gen, device=device, dtype=torch.float32)
        step = torch.exp(math.log(1e-3) + u * (math.log(1e-1) - math.log(1e-3)))  # the models' dt
        dt_bias = step + torch.log(-torch.expm1(-step))  # softplus(dt_bias) = dt
        params, g = (A_log, dt_bias), randn(*x.shape)
    q, k, v, beta = (t.to(dt) for t in (q, k, v, beta))
    cu = torch.tensor(bounds, dtype=torch.int32, device=device) if lengths else None
    return Workload(op=op, q=q, k=k, v=v, g=g.to(dt) if fla_recipe else g, beta=beta, cu_seqlens=cu,
                    cu_seqlens_cpu=bounds, initial_state=h0, do=do, params=params)


def make_workload(point: PointSpec, *, device: torch.device | str) -> Workload:
    """The point's inputs on `device`: `make_inputs` over the point's shape."""
    return make_inputs(point.op, B=point.B, T=point.T, H=point.H, K=point.K, V=point.V, HV=point.value_heads,
                       dtype=point.dtype, lb=point.lb, seed=point.seed, lengths=point.lengths, device=device,
                       gate=point.gate)


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
