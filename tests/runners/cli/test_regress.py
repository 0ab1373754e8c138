"""`cpbench regress` end to end on the CPU: the real suite runs through the engine (submit, a worker in this process,
the store); only the baseline side is sometimes a hand-made baseline file.

Scenarios, in order on one SQLite store (a tiny suite, torch backend: `none` and `true_cp` at W=1, `true_cp` on
two gloo ranks; `none` at W=2 is skipped on both sides and not judged):
1. `--record-baseline` runs 3 full runs, tags them and writes the baseline file;
2. a comparison against the tag (screen round, then a confirm round of the flagged keys only) passes: no
   deterministic change, and 2 runs per side can never make a SLOW; verdicts are stored and both reports written;
3. against a hand-made baseline file whose W=1 runs are 4x shorter and whose true_cp W=2 runs show two all-gathers
   instead of one, the W=1 keys are SLOW, true_cp is CHANGED, and the exit status is 1.
Plus: packaged suites (by name or by path), and the errors a user can make (unknown suite, a
tag nothing carries, a malformed file, a baseline from another device).
"""

from __future__ import annotations

import json
import math
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from runners.baseline import BaselineError, load_baseline_file
from runners.cli.regress import register
from runners.errors import CpbenchError, SpecError
from runners.regress_workflow import load_suite, run_regression

ROOT = Path(__file__).resolve().parents[3]
SPEC = """\
name: regress-smoke
tags: [regress-smoke]
ops: [gdn]
modes: [none, true_cp]
backends: [torch]
axes: {B: 1, T: 128, H: 2, K: 32, V: 32, lb: -1.0, W: [1, 2], dtype: float32}
timing: {min_samples: 5, max_samples: 10, min_time_s: 0.01, max_rel_iqr: 0.5, timeout_s: 2.0, warmup_s: 0.0, flush_l2: false}
check: {reference_tokens: 64}
"""


def make_app() -> typer.Typer:
    app = typer.Typer()

    @app.callback()
    def _root() -> None:
        """cpbench (test app holding only `regress`)."""

    register(app)
    return app


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path | str]:
    import os

    from db.migrate import upgrade
    from db.settings import get_db_settings

    d = tmp_path_factory.mktemp("regress")
    url = f"sqlite:///{d / 'cpbench.db'}"
    upgrade(url)
    old = os.environ.get("CPBENCH_ARTIFACT_DIR")
    os.environ["CPBENCH_ARTIFACT_DIR"] = str(d / "artifacts")
    get_db_settings.cache_clear()
    spec = d / "smoke.yaml"
    spec.write_text(SPEC)
    yield {"dir": d, "url": url, "spec": spec}
    if old is None:
        os.environ.pop("CPBENCH_ARTIFACT_DIR", None)
    else:
        os.environ["CPBENCH_ARTIFACT_DIR"] = old
    get_db_settings.cache_clear()


def invoke(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(make_app(), ["regress", *args])
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result.exit_code, result.output


def junit_failures(report_dir: Path) -> dict[str, str]:
    root = ET.parse(report_dir / "regress-junit.xml").getroot()
    return {c.get("name"): c.find("failure").get("type") for c in root.iter("testcase") if c.find("failure") is not None}


@pytest.mark.slow
def test_regress_end_to_end(store: dict) -> None:
    from db import crud
    from db.session import session_scope

    d, url, spec = store["dir"], store["url"], str(store["spec"])

    # 1. record the baseline
    code, out = invoke(spec, "--baseline", "smoke-base", "--record-baseline", "--runs", "3", "--db", url,
                       "--save-baseline", str(d / "base.json"))
    assert code == 0, out
    base = load_baseline_file(d / "base.json")
    keys = sorted(k for k, runs in base.runs.items() if any(r.median_ms is not None for r in runs))
    assert len(keys) == 3 and all(len(base.runs[k]) == 3 for k in keys)
    cp_key = next(k for k in keys if "/true_cp/" in k and ",W=2," in k)
    assert base.runs[cp_key][0].signals["collectives"] == {"all_gather": 1}  # true_cp: one all-gather per layer
    assert base.device == "cpu"

    # 2. compare with the tag: screen, then confirm the flagged keys with sweeps of those keys only
    code, out = invoke(spec, "--baseline", "smoke-base", "--screen-runs", "2", "--runs", "2", "--max-reruns", "0",
                       "--db", url, "--report-dir", str(d / "rep-same"))
    assert code == 0, out
    assert "PASS" in out and junit_failures(d / "rep-same") == {}
    with session_scope(url) as s:
        rows = crud.list_regression_results(s, suite="regress-smoke")
        assert sorted(r.key for r in rows) == keys
        assert {r.verdict for r in rows} <= {"SAME", "INCONCLUSIVE", "FAST"}
        assert all(r.baseline_ref == "smoke-base" and r.sweep_id is not None for r in rows)
    md = (d / "rep-same" / "regress.md").read_text()
    assert all(k in md for k in keys)

    # 3. a hand-made baseline: the W=1 keys 4x as fast (SLOW), true_cp at W=2 with two all-gathers (CHANGED)
    doc = json.loads((d / "base.json").read_text())
    slow_keys = [k for k in keys if k != cp_key]
    for k in slow_keys:
        m = sorted(r["median_ms"] for r in doc["keys"][k])[1]
        sig = doc["keys"][k][0]["signals"]
        doc["keys"][k] = [{"median_ms": 0.25 * m * math.exp(0.001 * i), "rel_iqr": 0.001, "n": 10, "signals": sig}
                          for i in range(6)]
    for r in doc["keys"][cp_key]:
        r["signals"]["collectives"] = {"all_gather": 2}
    (d / "edited-base.json").write_text(json.dumps(doc))
    code, out = invoke(spec, "--baseline", str(d / "edited-base.json"), "--screen-runs", "0", "--runs", "4",
                       "--max-reruns", "0", "--db", url, "--report-dir", str(d / "rep-fail"))
    assert code == 1, out
    failures = junit_failures(d / "rep-fail")
    assert {k: failures.get(k) for k in slow_keys} == dict.fromkeys(slow_keys, "SLOW")
    assert "CHANGED" in failures[cp_key].split("+")
    assert "| collectives.all_gather | 2 | 1 |" in (d / "rep-fail" / "regress.md").read_text()


def test_packaged_suites() -> None:
    nightly = load_suite("nightly")
    assert nightly.name == "nightly" and nightly.backends == ["triton"] and nightly.axes.W == [1, 2]
    assert set(nightly.ops) == {"gdn", "kda"} and {"true_cp", "ring", "headwise", "all_gather"} <= set(nightly.modes)
    assert nightly.axes.direction == ["fwd", "fwd+bwd"]
    assert load_suite(str(ROOT / "runners" / "suites" / "nightly.yaml")) == nightly  # a path loads the same suite
    cpu = load_suite("nightly-cpu")
    assert cpu.backends == ["torch"] and max(cpu.axes.T) <= 256
    with pytest.raises(SpecError, match="nightly-cpu"):
        load_suite("no-such-suite")


def test_regress_user_errors(store: dict) -> None:
    d, url, spec = store["dir"], store["url"], str(store["spec"])
    with pytest.raises(BaselineError, match="--record-baseline"):
        run_regression(spec, baseline="never-tagged", database_url=url)
    (d / "bad.json").write_text('{"format": "something-else"}')
    with pytest.raises(BaselineError, match="not a cpbench baseline file"):
        run_regression(spec, baseline=str(d / "bad.json"), database_url=url)
    (d / "gpu.json").write_text(json.dumps({"format": "cpbench-regress-baseline", "version": 1, "device": "NVIDIA H200",
                                            "keys": {}}))
    with pytest.raises(CpbenchError, match="NVIDIA H200"):
        run_regression(spec, baseline=str(d / "gpu.json"), database_url=url)
    with pytest.raises(CpbenchError, match="need --baseline to be a tag"):
        run_regression(spec, baseline="12", record_baseline=True, database_url=url)
