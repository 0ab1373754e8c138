"""Tests of kernels/ops, laid out like the source."""
