"""Tests of kernels/ops/gdn, laid out like the source."""
