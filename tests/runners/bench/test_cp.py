"""The `bench cp` report says how it measured (issue 28, item 7): a `--cpu` run is timed with the wall clock on fp32
inputs, a GPU run with CUDA events on bf16; the report of each says so and nothing else (the real `write_results`,
no records)."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest
import torch

from runners.bench.cp import write_results


@pytest.mark.parametrize(
    ("cpu", "said", "unsaid"),
    [
        (True, ("the wall clock", "fp32 inputs", "gloo ranks on the CPU"), ("CUDA events", "bf16")),
        (False, ("CUDA events", "bf16 inputs", "one GPU per rank"), ("wall clock", "fp32 inputs")),
    ],
)
def test_report_method_matches_the_run(
    cpu: bool, said: tuple[str, ...], unsaid: tuple[str, ...], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = argparse.Namespace(cpu=cpu, iters=5, warmup=2, out=str(tmp_path), name=None, command="bench cp", git_sha="x")
    write_results([], args, torch.device("cpu"))
    capsys.readouterr()
    (report,) = tmp_path.glob("*.md")
    method = next(line for line in report.read_text().splitlines() if line.startswith("Method:"))
    assert all(s in method for s in said) and not any(s in method for s in unsaid), method
