"""Benchmarks of the kernels (forward+backward timing against FLA)."""
