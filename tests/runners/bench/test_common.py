"""The benchmarks name their result files per device, so a CPU smoke run never overwrites the H200 table."""

from __future__ import annotations

from runners.bench.common import result_stem


def test_result_stem_per_device() -> None:
    assert result_stem("cp", None, "NVIDIA H200") == "cp_h200"
    assert result_stem("kernels", None, "NVIDIA H200") == "kernels_h200"
    assert result_stem("cp", None, "cpu") == "cp_cpu"
    assert result_stem("cp", None, None) == "cp_cpu"
    assert result_stem("kernels", None, "NVIDIA H100 80GB HBM3") == "kernels_nvidia_h100_80gb_hbm3"
    assert result_stem("cp", "mine", "NVIDIA H200") == "mine"
