"""Kimi Delta Attention (per-key-dim gate): the fp32 reference here; the Triton path in `kernels.kda.chunk`."""

from kernels.kda.naive import naive_recurrent_kda

__all__ = ["naive_recurrent_kda"]
