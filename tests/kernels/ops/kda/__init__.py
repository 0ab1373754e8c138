"""Tests of kernels/ops/kda, laid out like the source."""
