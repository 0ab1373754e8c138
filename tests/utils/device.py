"""The device the kernel tests run on: the GPU under CPBENCH_TEST_GPU=1 where one is present, else the CPU (Triton
kernels interpreted). Each test file states its own tolerance for each."""

from __future__ import annotations

import os

import torch

TEST_DEVICE = "cuda" if os.environ.get("CPBENCH_TEST_GPU") and torch.cuda.is_available() else "cpu"
