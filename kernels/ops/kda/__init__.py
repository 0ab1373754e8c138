"""Kimi Delta Attention (per-key-dim gate): the fp32 reference (`kernels.common.naive`, re-exported here); the Triton path in `kernels.kda.chunk`."""

from kernels.common.naive import naive_recurrent_kda

__all__ = ["naive_recurrent_kda"]
