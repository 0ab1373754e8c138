"""`python -m kernels.cp.bench` names its result files per device, so a CPU smoke run never overwrites the H200 table."""

from __future__ import annotations

import argparse

from kernels.cp.bench import result_stem


def _args(name: str | None = None) -> argparse.Namespace:
    return argparse.Namespace(name=name)


def test_result_stem_per_device() -> None:
    assert result_stem(_args(), "NVIDIA H200") == "cp_h200"
    assert result_stem(_args(), "cpu") == "cp_cpu"
    assert result_stem(_args(), "NVIDIA H100 80GB HBM3") == "cp_nvidia_h100_80gb_hbm3"
    assert result_stem(_args("mine"), "NVIDIA H200") == "mine"
