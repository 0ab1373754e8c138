"""The real models' gate and beta activations, as FLA's `chunk_kda` / `chunk_gated_delta_rule` apply them in-kernel.

    activate_gate(op, g_raw, A_log=, dt_bias=, lower_bound=)   the log decay g <= 0 (fp32) from the raw gate
        lower_bound None:   g = -exp(A_log) * softplus(g_raw + dt_bias)           (use_gate_in_kernel=True)
        lower_bound < 0:    g = lower_bound * sigmoid(exp(A_log) * (g_raw + dt_bias))   (safe_gate=True; without
                            A_log: lower_bound * sigmoid(g_raw + dt_bias)), so lower_bound <= g <= 0
    activate_beta(beta_raw, allow_neg_eigval=)                 sigmoid(beta_raw), times 2 with allow_neg_eigval

Shapes (FLA's): gdn `g_raw [B, T, HV]`, `A_log [HV]`, `dt_bias [HV]`; kda `g_raw [B, T, HV, K]`, `A_log [HV]`,
`dt_bias [HV * K]`. Computed in fp32 from any input dtype and differentiable (autograd through elementwise torch
ops: gradients for g_raw, A_log and dt_bias); per token, so a CP scheme may activate its own shard.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

__all__ = ["activate_beta", "activate_gate"]


def activate_gate(
    op: str, g_raw: Tensor, *, A_log: Tensor | None, dt_bias: Tensor | None, lower_bound: float | None = None
) -> Tensor:
    """The fp32 log decay from the raw gate (module docstring); `A_log` is required unless `lower_bound` is set."""
    HV = g_raw.shape[2]
    per_head = (HV,) if op == "gdn" else (HV, 1)  # broadcast over [B, T, HV] or [B, T, HV, K]
    x = g_raw.float()
    if dt_bias is not None:
        x = x + dt_bias.float().view(g_raw.shape[2:])
    if lower_bound is None:
        if A_log is None:
            raise ValueError("use_gate_in_kernel=True needs A_log (shape [HV]) unless safe_gate sets lower_bound")
        return -A_log.float().exp().view(per_head) * F.softplus(x)
    if A_log is not None:
        x = A_log.float().exp().view(per_head) * x
    return lower_bound * torch.sigmoid(x)


def activate_beta(beta_raw: Tensor, *, allow_neg_eigval: bool = False) -> Tensor:
    """sigmoid(beta_raw) in beta_raw's dtype (computed in fp32), doubled with `allow_neg_eigval` (beta in (0, 2))."""
    beta = torch.sigmoid(beta_raw.float())
    return (2.0 * beta if allow_neg_eigval else beta).to(beta_raw.dtype)
