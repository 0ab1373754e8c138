"""`benchmarks/autotune_h200.py run`: a device crash in the middle of a search (a CUDA error poisons the process)
records the culprit config, and a fresh process resumes the run: the cases done before the crash are kept, the
crashed case restarts with the culprit never launched again, and the deadline counts the time already spent.

The CUDA error is injected where the device would raise it (the search of one case); the restart loop, the partial
file and the resume run as on the device, with the child processes run in-process."""

from __future__ import annotations

import json
import sys

import pytest

from tests.utils.scripts import load_script

CULPRIT = {"BV": 32, "num_warps": 4, "num_stages": 1}


def _module():
    return load_script("autotune_h200")


def test_a_crash_mid_search_restarts_the_case_without_the_culprit(tmp_path, monkeypatch) -> None:
    import runners.tuner.tune as tune
    from kernels.configs import LaunchConfig
    from runners.tuner.result import KernelResult, Trial, TuneResult

    mod = _module()
    out = tmp_path / "run.json"
    calls: list[dict] = []  # what each tune_case call was given

    def fake_tune_case(run, *, known_bad, **kw):
        op = run.op
        calls.append({"op": op, "known_bad": {k: set(v) for k, v in known_bad.items()}})
        result = TuneResult(device_name="cpu", compute_capability=None)
        if op == "kda" and "chunk_state_fwd" not in known_bad:  # the device crashes on the culprit
            crashed = Trial(kernel="chunk_state_fwd", key={}, config=CULPRIT, strategy="halving", rung=0, status="failed")
            result.extended([KernelResult(kernel="chunk_state_fwd", key={}, key_str="", source_hash="",
                                          trials=(crashed,))]).stop(
                RuntimeError("CUDA error: an illegal memory access was encountered"))
        return result

    def fake_runner(op, case, direction="fwd"):
        r = lambda configs: None  # noqa: E731
        r.op = op
        return r

    monkeypatch.setattr(tune, "tune_case", fake_tune_case)
    monkeypatch.setattr(tune, "make_case", lambda op, shape, dev: {})
    monkeypatch.setattr(tune, "op_runner", fake_runner)
    monkeypatch.setattr(mod, "_ab", lambda timer, run, a, b, *rest: (2.0, 1.0))
    monkeypatch.setattr("runners.tuner.clock.StepTimer", lambda dev: None)
    monkeypatch.setattr("runners.versions.driver_version", lambda: None)

    argv = ["autotune_h200.py", "run", "--out", str(out), "--ops", "gdn", "kda", "--shapes", "1x128",
            "--workers", "0", "--device", "cpu", "--sha", "abc1234", "--deadline-s", "1000"]
    children: list[list[str]] = []

    def in_process(cmd: list[str]) -> int:  # the child processes, run here (the "fresh process" is the point of
        children.append(cmd[2:])            # the loop on a GPU; on the CPU nothing is poisoned)
        monkeypatch.setattr(sys, "argv", ["autotune_h200.py", *cmd[2:]])
        try:
            mod.main()
        except SystemExit as e:
            return int(e.code or 0)
        return 0

    monkeypatch.setattr("subprocess.call", in_process)
    monkeypatch.setattr(sys, "argv", argv)
    with pytest.raises(SystemExit) as done:
        mod.main()
    assert done.value.code == 0
    # the first child crashed in kda's search; the second resumed from the partial file and finished
    assert len(children) == 2 and "--partial" not in children[0] and children[1][-2:] == ["--partial", str(out)]
    assert [c["op"] for c in calls] == ["gdn", "kda", "kda"]  # gdn was not searched again
    assert calls[1]["known_bad"] == {} and calls[2]["known_bad"] == {"chunk_state_fwd": {LaunchConfig(**CULPRIT)}}
    run = json.loads(out.read_text())
    assert [(o["op"], o["direction"]) for o in run["ops"]] == [("gdn", "fwd"), ("kda", "fwd")]
    ((op, kernel, cfg, err),) = run["crashed"]
    assert (op, kernel, cfg) == ("kda", "chunk_state_fwd", CULPRIT) and "illegal memory access" in err


def test_a_crash_the_search_did_not_record_is_not_swallowed(tmp_path, monkeypatch) -> None:
    """An error with no failed trial to blame (e.g. in the op's own setup) propagates instead of looping."""
    import runners.tuner.tune as tune

    mod = _module()

    def boom(run, **kw):
        raise RuntimeError("CUDA error: out of memory")

    monkeypatch.setattr(tune, "tune_case", boom)
    monkeypatch.setattr(tune, "make_case", lambda op, shape, dev: {})
    monkeypatch.setattr(tune, "op_runner", lambda op, case, direction="fwd": (lambda configs: None))
    monkeypatch.setattr("runners.tuner.clock.StepTimer", lambda dev: None)
    monkeypatch.setattr(sys, "argv", ["autotune_h200.py", "run", "--out", str(tmp_path / "r.json"), "--ops", "gdn",
                                      "--shapes", "1x128", "--workers", "0", "--device", "cpu", "--restarts", "0"])
    with pytest.raises(RuntimeError, match="out of memory"):
        mod.main()
