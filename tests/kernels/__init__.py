"""Tests of kernels, laid out like the source."""
