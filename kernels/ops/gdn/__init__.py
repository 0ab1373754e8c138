"""Gated DeltaNet (scalar gate per head): the fp32 reference here; the Triton path in `kernels.gdn.chunk`."""

from kernels.gdn.naive import naive_recurrent_gdn

__all__ = ["naive_recurrent_gdn"]
