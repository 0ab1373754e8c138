"""Tests of kernels/cp, laid out like the source."""
