"""`kernels.builds`: other compilers' kernels built in background threads, one build per key.

Each test builds with a real function that holds until the test releases it (a `threading.Event`), so readiness is
seen before and after; the only time limits are generous timeouts. Tests on the process's registry (`BUILDS`,
`kernels.wait_for_builds`) use keys of their own (a uuid)."""

from __future__ import annotations

import logging
import threading
import uuid

import pytest

import kernels
from kernels.builds import BUILDS, TILELANG_BUILD_ENV, TILELANG_BUILD_MODES, BuildRegistry, build_mode

LONG = 60.0  # s: a build held by an event is released long before this


def test_one_build_per_key_and_readiness_flips_when_built() -> None:
    reg = BuildRegistry(workers=2)
    gate = threading.Event()
    calls: list[str] = []

    def build(name: str) -> None:
        assert gate.wait(LONG)
        calls.append(name)

    assert reg.submit(("walk", 1), build, "a")
    assert not reg.submit(("walk", 1), build, "a")  # the key's build is under way: not again
    assert reg.submit(("walk", 2), build, "b")
    assert not reg.ready(("walk", 1)) and not reg.built and reg.failed(("walk", 1)) is None
    assert not reg.wait(timeout=0.05)  # still building
    gate.set()
    assert reg.wait(timeout=LONG)
    assert reg.ready(("walk", 1)) and reg.ready(("walk", 2)) and set(reg.built) == {("walk", 1), ("walk", 2)}
    assert not reg.submit(("walk", 1), build, "a")  # built: never again
    assert reg.wait(timeout=LONG) and sorted(calls) == ["a", "b"]


def test_a_failed_build_is_logged_once_in_one_line_and_stays_failed(caplog: pytest.LogCaptureFixture) -> None:
    reg = BuildRegistry()
    tries: list[int] = []

    def broken() -> None:
        tries.append(1)
        raise RuntimeError("nvcc failed with exit code 1\nptxas fatal: a long log the user does not need")

    caplog.set_level(logging.WARNING, logger="kernels.builds")
    assert reg.submit(("fwd_walk", 8, 8), broken)
    assert reg.wait(timeout=LONG)  # a failed build is finished, not running
    why = "RuntimeError: nvcc failed with exit code 1"
    assert reg.failed(("fwd_walk", 8, 8)) == why and not reg.ready(("fwd_walk", 8, 8))
    assert not reg.submit(("fwd_walk", 8, 8), broken)  # sticky: not retried
    assert reg.wait(timeout=LONG) and tries == [1]
    lines = [r.getMessage() for r in caplog.records if r.name == "kernels.builds"]
    assert len(lines) == 1 and "\n" not in lines[0] and "fwd_walk" in lines[0] and why in lines[0]
    assert all(r.exc_info is None for r in caplog.records)  # no traceback


def test_settle_waits_for_the_running_build_of_its_key() -> None:
    reg = BuildRegistry()
    gate = threading.Event()
    reg.submit("k", lambda: gate.wait(LONG))
    reg.settle("other")  # nothing submitted under that key: returns at once
    threading.Timer(0.1, gate.set).start()
    reg.settle("k")
    assert reg.ready("k")


def test_wait_for_builds_times_out_then_reports_everything_finished() -> None:
    gate = threading.Event()
    key = ("test_builds", uuid.uuid4().hex)
    assert BUILDS.submit(key, lambda: gate.wait(LONG))
    assert kernels.wait_for_builds(timeout=0.05) is False
    gate.set()
    assert kernels.wait_for_builds(timeout=LONG) is True
    assert BUILDS.ready(key)


def test_build_mode_reads_its_env_var(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(TILELANG_BUILD_ENV, raising=False)
    assert build_mode() == TILELANG_BUILD_MODES[0] == "background"
    monkeypatch.setenv(TILELANG_BUILD_ENV, " Wait ")
    assert build_mode() == "wait"
    monkeypatch.setenv(TILELANG_BUILD_ENV, "later")
    with pytest.raises(ValueError, match="CPBENCH_TILELANG_BUILD must be one of background, wait, got 'later'"):
        build_mode()
