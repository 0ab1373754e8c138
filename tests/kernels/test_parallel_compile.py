"""`kernels.parallel_compile`: a call's first launch compiles its fwd+bwd kernels ahead, in parallel.

The compile test runs `benchmarks/compile_parallel.py` in its own processes (the kernels must be real JIT functions;
this session imports them under the interpreter): GDN fwd+bwd compiled for sm_90 by Triton's own launch path with
no GPU, once with CPBENCH_PARALLEL_COMPILE=0 (serial) and once parallel, each on a fresh Triton cache. The GPU test
checks on a device that a first call through the dry run gives the same numbers as the calls after it."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import threading
import uuid
from pathlib import Path

import pytest

from kernels.builds import BUILDS
from kernels.parallel_compile import (
    PARALLEL_COMPILE_ENV,
    asking_builds,
    build_beside,
    compile_ahead,
    parallel_compile_enabled,
)

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "compile_parallel.py"
_TRITON = importlib.util.find_spec("triton")
PTXAS = _TRITON is not None and (Path(_TRITON.origin).parent / "backends" / "nvidia" / "bin" / "ptxas").exists()


def _never() -> None:
    raise AssertionError("the dry run ran")


def test_the_switch_and_the_interpreter(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.delenv(PARALLEL_COMPILE_ENV, raising=False)
    assert parallel_compile_enabled()
    for off in ("0", "false", "No"):
        monkeypatch.setenv(PARALLEL_COMPILE_ENV, off)
        assert not parallel_compile_enabled()
        assert compile_ahead(("test", "switch", off), _never) is False
    monkeypatch.setenv(PARALLEL_COMPILE_ENV, "1")
    monkeypatch.setenv("TRITON_INTERPRET", "1")  # interpreted kernels compile nothing: no dry run
    assert not parallel_compile_enabled()
    assert compile_ahead(("test", "interpreter"), _never) is False


def test_other_compilers_build_beside_once_per_key(monkeypatch: pytest.MonkeyPatch) -> None:
    """A TileLang build asked for in the dry run goes to the background builds, once per key, noted by
    `asking_builds`; compile_ahead does not wait for it; a failing one is kept as failed; before and after a dry run
    build_beside declines (the caller builds and launches), waiting for a build of its key still running."""
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    monkeypatch.setenv(PARALLEL_COMPILE_ENV, "1")
    built: list[tuple[str, threading.Thread]] = []
    gate = threading.Event()
    tag = uuid.uuid4().hex  # keys no other test (or run of this one) submitted to the process's builds

    def build(name: str) -> None:
        gate.wait(timeout=60)
        built.append((name, threading.current_thread()))

    def broken() -> None:
        raise RuntimeError("nvcc failed\nthe rest of its output")

    asked: set[object] = set()

    def dry_run() -> None:
        with asking_builds() as keys:
            said = [build_beside((tag, 1), build, "a"), build_beside((tag, 1), build, "a"),
                    build_beside((tag, 2), build, "b"), build_beside((tag, 3), broken)]  # fmt: skip
        assert said == [True] * 4 and not built  # submitted, not run in this thread
        asked.update(keys)

    assert not build_beside((tag, 0), build, "z")  # outside a dry run: nothing submitted, the caller builds
    assert compile_ahead(("test", "beside", tag), dry_run) is True
    assert asked == {(tag, 1), (tag, 2), (tag, 3)}
    assert not built and not BUILDS.ready((tag, 1))  # the dry run did not wait
    gate.set()
    assert not build_beside((tag, 1), build, "a")  # a launch now: it waits for the build of its key
    assert BUILDS.ready((tag, 1)) and any(name == "a" for name, _ in built)
    assert BUILDS.wait([(tag, 1), (tag, 2), (tag, 3)], timeout=60)
    assert sorted(name for name, _ in built) == ["a", "b"]  # once per key
    assert BUILDS.failed((tag, 3)) == "RuntimeError: nvcc failed" and not BUILDS.ready((tag, 3))
    assert all(t is not threading.main_thread() for _, t in built)


@pytest.mark.slow
@pytest.mark.skipif(not PTXAS, reason="Triton's bundled ptxas is not installed here")
def test_the_kernels_compiled_ahead_are_the_ones_the_call_launches(tmp_path: Path) -> None:
    out = tmp_path / "compile.json"
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = str(ROOT)
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--ops", "gdn", "--T", "64", "--again-T", "128", "--no-launchers", "--json", str(out)],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    serial, parallel = json.loads(out.read_text())
    assert serial["mode"] == "serial" and parallel["mode"] == "parallel"
    launched = serial["first"]["launches"]  # (kernel, Triton's compile key) per launch, in order
    assert len({name for name, _ in launched}) >= 6  # the GDN forward and backward passes
    # serial: every kernel compiles at its launch; parallel: all before the first launch, none at a launch
    assert [ahead for _, ahead in serial["first"]["compiles"]] == [False] * len(set(map(tuple, launched)))
    assert [ahead for _, ahead in parallel["first"]["compiles"]] == [True] * len(set(map(tuple, launched)))
    # the same launches with the same compiles (keys), and the same PTX out of each compile
    assert parallel["first"]["launches"] == launched
    assert sorted(name for name, _ in parallel["first"]["compiles"]) == sorted({name for name, _ in map(tuple, launched)})
    keys = {key for _, key in launched}
    assert keys <= set(parallel["ptx"]) and {k: parallel["ptx"][k] for k in keys} == {k: serial["ptx"][k] for k in keys}
    # a later call of the same kind (another T) runs no dry run and compiles nothing; it launches the same kernels
    for run in (serial, parallel):
        assert run["again"]["compiles"] == []
        assert {tuple(x) for x in run["again"]["launches"]} == {tuple(x) for x in launched}


@pytest.mark.gpu
def test_a_first_call_through_the_dry_run_equals_the_next_calls() -> None:
    import torch
    import torch.nn.functional as F

    import kernels

    torch.manual_seed(3)
    B, T, H, D = 1, 320, 3, 64  # a kind of call no other test makes: its first call runs the dry run
    q = F.normalize(torch.randn(B, T, H, D, device="cuda"), dim=-1).bfloat16().requires_grad_()
    k = F.normalize(torch.randn(B, T, H, D, device="cuda"), dim=-1).bfloat16().requires_grad_()
    v = torch.randn(B, T, H, D, device="cuda").bfloat16().requires_grad_()
    g = (-torch.sigmoid(torch.randn(B, T, H, D, device="cuda"))).requires_grad_()
    beta = torch.sigmoid(torch.randn(B, T, H, device="cuda")).bfloat16().requires_grad_()
    h0 = torch.randn(B, H, D, D, device="cuda").requires_grad_()

    def step() -> list[torch.Tensor]:
        o, ht = kernels.chunk_kda(q, k, v, g, beta, initial_state=h0, output_final_state=True, backend="triton")
        grads = torch.autograd.grad(o.float().square().sum() + ht.sum(), (q, k, v, g, beta, h0))
        return [o, ht, *grads]

    first, second = step(), step()
    for a, b in zip(first, second, strict=True):
        assert torch.isfinite(a).all() and torch.equal(a, b)
