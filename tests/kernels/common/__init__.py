"""Tests of kernels/common, laid out like the source."""
