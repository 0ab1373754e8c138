"""Peer backends when a sweep is expanded: FLA's run-or-skip table over every op x mode x direction (the same with
and without FLA installed here), its Hopper guard and the opt-in that enters the key; plugin loading (module:object,
the `cpbench.backends` entry point group) and the spec errors of a broken one.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import itertools
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch

from runners import plugins
from runners.errors import SpecError
from runners.grid import available_backends, expand, point_key, skip_reason
from runners.peers import check_peer
from runners.peers import fla as fla_peer
from runners.point import PointSpec
from runners.spec import MODES, parse_spec
from tests.runners.engine_fixtures import store_url  # noqa: F401

PLUGIN = "tests.plugins.torch_peer:PEER"
GUARDED, FIXED = (3, 6, 0), (3, 7, 1)

# FLA's implementation of each mode and what it runs: (mode, direction) -> None (runs) or a reason substring
FLA_TABLE: dict[tuple[str, str], str | None] = {
    ("none", "fwd"): None, ("none", "fwd+bwd"): None,
    ("true_cp", "fwd"): None, ("true_cp", "fwd+bwd"): None,
    ("warmup_correct", "fwd"): None,
    ("warmup_correct", "fwd+bwd"): "intra-card CP runs only under torch.inference_mode",
    ("headwise", "fwd"): None, ("all_gather", "fwd"): None, ("ring", "fwd"): None,
    ("headwise", "fwd+bwd"): "timed forward only", ("all_gather", "fwd+bwd"): "timed forward only",
    ("ring", "fwd+bwd"): "timed forward only",
    ("tail_exchange", "fwd"): "FLA has no transition primitive", ("tail_exchange", "fwd+bwd"): "FLA has no transition primitive",
}


def _params(**kw: Any) -> PointSpec:
    p = {"op": "gdn", "mode": "none", "backend": "fla", "B": 1, "T": 256, "H": 4, "K": 32, "V": 32, "lb": -1.0, "W": 1,
         "layout": "contiguous", "direction": "fwd", "dtype": "bfloat16", "seed": 0, "rep": 0}
    p.update(kw)
    return PointSpec.from_json(p)


@pytest.mark.parametrize(("op", "mode", "direction"), list(itertools.product(("gdn", "kda"), MODES, ("fwd", "fwd+bwd"))))
def test_fla_table_every_op_mode_direction(op: str, mode: str, direction: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fla_peer, "triton_version", lambda: FIXED)  # the Hopper guard is its own test
    W = 1 if mode in ("none", "warmup_correct") else 2
    for layout in ("contiguous", "zigzag"):
        why = skip_reason(_params(op=op, mode=mode, direction=direction, W=W, layout=layout))
        want = FLA_TABLE[(mode, direction)]
        if want is None:
            assert why is None, (op, mode, direction, layout, why)
        else:
            assert why is not None and want in why and why.startswith("backend 'fla'"), why


def test_fla_hopper_guard_is_a_skip_unless_opted_in(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fla_peer, "triton_version", lambda: GUARDED)
    bwd = _params(direction="fwd+bwd")
    why = skip_reason(bwd)
    assert why is not None and "Hopper" in why and "Triton is 3.6.0" in why and "bypass_hopper_guard: true" in why
    assert skip_reason(replace(bwd, op="kda")) is None  # the guard is on the GDN backward only
    assert skip_reason(replace(bwd, direction="fwd")) is None
    opted = replace(bwd, backend_options={"bypass_hopper_guard": True})
    assert skip_reason(opted) is None
    assert point_key(opted) == point_key(bwd) + ",opts=fla.bypass_hopper_guard=True"
    monkeypatch.setattr(fla_peer, "triton_version", lambda: FIXED)
    assert skip_reason(bwd) is None
    monkeypatch.setattr(fla_peer, "triton_version", lambda: None)  # no Triton where the sweep is expanded: guarded
    assert "Triton is not installed here" in (skip_reason(bwd) or "")


def test_fla_limits_of_its_own() -> None:
    assert "K <= 256" in (skip_reason(_params(K=512, V=64)) or "")
    assert "takes no warmup_correct options" in (skip_reason(_params(mode="warmup_correct", mode_options={"tol": 0.01})) or "")
    wc_defaults = {"segments": "auto", "tol": 0.001, "window": "auto", "fallback": "auto"}
    assert skip_reason(_params(mode="warmup_correct", mode_options=wc_defaults)) is None
    assert "no transition primitive" in (skip_reason(_params(mode="true_cp", W=2, mode_options={"segment_len": 64})) or "")
    # the generic rules still apply to a peer's points
    assert "needs W == 1" in (skip_reason(_params(W=2)) or "")
    assert "H % W == 0" in (skip_reason(_params(mode="headwise", W=3, H=4, T=384)) or "")


def test_fla_expansion_same_with_and_without_fla(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without availability checks the expansion is FLA's static table; with them, FLA's points that would run
    are skipped because FLA is missing, or (installed, on this CPU-only machine) because it needs a GPU."""
    spec = parse_spec({"name": "f", "ops": ["gdn", "kda"], "modes": list(MODES), "backends": ["fla"],
                       "axes": {"T": 256, "W": [1, 2], "H": 4, "K": 32, "V": 32}})
    static = [(r["key"], r["status"], r["reason"]) for r in expand(spec)]
    runs = {k for k, st, _ in static if st == "queued"}
    assert len(runs) == 2 * (2 + 4 * 2)  # per op: none, warmup_correct at W=1; true_cp, headwise, all_gather, ring at W=1, 2
    for installed, why in ((None, "fla-core) is not installed"), (object(), "need a CUDA GPU")):
        monkeypatch.setattr(fla_peer.importlib.util, "find_spec", lambda name, _i=installed: _i)
        rows = expand(spec, backends=("torch", "triton"))
        assert [(r["key"], r["status"]) for r in rows if r["key"] not in runs] == [(k, s) for k, s, _ in static if k not in runs]
        assert all(why in r["reason"] for r in rows if r["key"] in runs)


def test_spec_peer_options_and_errors(plugin_modules: Any) -> None:
    plugin_modules("no_such_pkg.,runners.spec")  # the two module:object backends below may be imported
    base = {"name": "o", "ops": "gdn", "modes": "none", "axes": {"T": 128}}
    spec = parse_spec({**base, "backends": ["fla"], "mode_options": {"fla": {"bypass_hopper_guard": True}}})
    (row,) = expand(spec)
    assert row["params"]["backend_options"] == {"bypass_hopper_guard": True} and row["key"].endswith(",opts=fla.bypass_hopper_guard=True")
    with pytest.raises(SpecError, match=r"unknown option\(s\) bypass for backend 'fla'; known: bypass_hopper_guard"):
        parse_spec({**base, "backends": ["fla"], "mode_options": {"fla": {"bypass": True}}})
    with pytest.raises(SpecError, match="mode_options keys are CP modes .* or a peer backend of the spec"):
        parse_spec({**base, "backends": ["torch"], "mode_options": {"fla": {"bypass_hopper_guard": True}}})
    with pytest.raises(SpecError, match=r"backends: cannot load backend plugin 'no_such_pkg.mod:X': ModuleNotFoundError"):
        parse_spec({**base, "backends": ["no_such_pkg.mod:X"]})
    with pytest.raises(SpecError, match="unknown backend 'nosuch'.*entry point group 'cpbench.backends'"):
        parse_spec({**base, "backends": ["nosuch"]})
    with pytest.raises(SpecError, match="backend 'runners.spec:MODES': `name` must match"):
        parse_spec({**base, "backends": ["runners.spec:MODES"]})  # importable, but not a backend


def test_plugin_from_spec_string_and_entry_point(monkeypatch: pytest.MonkeyPatch, plugin_modules: Any) -> None:
    plugin_modules("tests.plugins.")
    spec = parse_spec({"name": "p", "ops": "kda", "modes": ["none", "ring"], "backends": [PLUGIN], "axes": {"T": 128}})
    none, ring = expand(spec)
    assert none["backend"] == "torchpeer" and none["params"]["backend_ref"] == PLUGIN and none["status"] == "queued"
    assert ring["status"] == "skipped" and "does not implement mode 'ring'" in ring["reason"]
    assert "at most 4096 tokens" in (skip_reason(PointSpec.from_json({**none["params"], "T": 8192})) or "")  # the plugin's own rule

    ep = importlib.metadata.EntryPoint(name="torchpeer", value=PLUGIN, group=plugins.ENTRY_POINT_GROUP)
    real = importlib.metadata.entry_points
    monkeypatch.setattr(importlib.metadata, "entry_points",
                        lambda **kw: [ep] if kw.get("group") == plugins.ENTRY_POINT_GROUP else real(**kw))
    plugins.clear_cache()
    try:
        (row, _) = expand(parse_spec({"name": "e", "ops": "kda", "modes": ["none", "ring"], "backends": ["torchpeer"],
                                      "axes": {"T": 128}}))
        assert row["backend"] == "torchpeer" and "backend_ref" not in row["params"] and row["status"] == "queued"
        assert plugins.unavailable(PointSpec.from_json(row["params"]), available_backends()) is None
    finally:
        plugins.clear_cache()


# a module that records being imported: the allow-list must refuse it before any import
_SPY = """
import pathlib
pathlib.Path(__file__).with_name("imported").write_text("yes")
PEER = object()
"""


def _spy_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, name: str) -> Path:
    (tmp_path / f"{name}.py").write_text(_SPY)
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path / "imported"


def test_plugin_modules_allow_list(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, plugin_modules: Any) -> None:
    marker = _spy_module(tmp_path, monkeypatch, "cpbench_spy_a")
    base = {"name": "a", "ops": "kda", "modes": "none", "axes": {"T": 128}}
    plugin_modules("")
    for ref in ("cpbench_spy_a:PEER", PLUGIN):
        module = ref.split(":")[0]
        with pytest.raises(SpecError) as err:
            parse_spec({**base, "backends": [ref]})
        msg = str(err.value)
        assert "\n" not in msg and f"backend '{ref}' is refused: module '{module}' is not allowed" in msg
        assert "CPBENCH_PLUGIN_MODULES" in msg
    assert not marker.exists()  # refused before the import
    # an entry the module does not match: a name without the trailing '.' is no prefix
    plugin_modules("cpbench_spy, tests.plugins")
    with pytest.raises(SpecError, match="is refused"):
        parse_spec({**base, "backends": [PLUGIN]})
    assert not marker.exists() and plugins.refusal("cpbench_spy_a:PEER")

    plugin_modules("other.mod, tests.")  # a prefix ending in '.'
    assert parse_spec({**base, "backends": [PLUGIN]}).backends == [PLUGIN]
    plugin_modules("cpbench_spy_a")  # the exact module: imported, then judged by the protocol
    with pytest.raises(SpecError, match="backend 'cpbench_spy_a:PEER': `name` must match"):
        parse_spec({**base, "backends": ["cpbench_spy_a:PEER"]})
    assert marker.exists()

    # "all" is the dashboards' every-backend choice: no backend may be named so
    spy = type("Spy", (), {"name": "all", "modes": {"none": ("fwd",)}, "forward": lambda *a, **k: None})()
    with pytest.raises(ValueError, match="not be one of .*all, got 'all'"):
        check_peer(spy, "'spy'")
    # the first-call allowance is added to the point's time limit: a bad one is refused, not read as 0
    for bad in (-1.0, float("inf"), "600", True):
        slow = type("Slow", (), {"name": "slow", "modes": {"none": ("fwd",)}, "forward": lambda *a, **k: None,
                                 "first_call_s": bad})()
        with pytest.raises(ValueError, match=r"`first_call_s` must be a finite number of seconds >= 0"):
            check_peer(slow, "'slow'")
    slow.first_call_s = 90
    assert check_peer(slow, "'slow'") is slow

    assert plugins.module_allowed("a.b.c", ("a.",)) and plugins.module_allowed("a.b", ("a.b",))
    assert not plugins.module_allowed("a.b", ("a",)) and not plugins.module_allowed("ab.c", ("a.",))
    assert not plugins.module_allowed("a.bc", ("a.b",))


def test_plugin_module_of_an_installed_entry_point_needs_no_setting(monkeypatch: pytest.MonkeyPatch,
                                                                   plugin_modules: Any) -> None:
    plugin_modules("")
    ep = importlib.metadata.EntryPoint(name="torchpeer", value=PLUGIN, group=plugins.ENTRY_POINT_GROUP)
    real = importlib.metadata.entry_points
    monkeypatch.setattr(importlib.metadata, "entry_points",
                        lambda **kw: [ep] if kw.get("group") == plugins.ENTRY_POINT_GROUP else real(**kw))
    assert plugins.refusal(PLUGIN) is None and plugins.refusal("tests.plugins.torch_peer:OTHER")
    (row,) = expand(parse_spec({"name": "e", "ops": "kda", "modes": "none", "backends": [PLUGIN], "axes": {"T": 128}}))
    assert row["backend"] == "torchpeer" and row["status"] == "queued"


@pytest.mark.skipif(importlib.util.find_spec("fla") is None, reason="needs fla-core (requirements-ci.txt installs it)")
@pytest.mark.parametrize("layout", ["contiguous", "zigzag"])
def test_fla_kcp_partition_matches_our_shards(layout: str) -> None:
    """FLA's true_cp runs on our shards: FLA's rank-local bounds (its host metadata, no GPU needed) equal ours."""
    from fla.ops.cp.context import get_cp_cu_seqlens

    from kernels import cp

    bounds = (0, 100, 356, 400, 1024)
    for W in (2, 4):
        for r in range(W):
            ours = cp.build_context(bounds, W, r, layout)
            theirs = get_cp_cu_seqlens(torch.tensor(bounds), world_size=W, rank=r, layout=layout)
            assert tuple(theirs.cu_seqlens_cpu.tolist()) == ours.local_cu_seqlens, (W, r)


@pytest.mark.skipif(importlib.util.find_spec("fla") is None, reason="needs fla-core (requirements-ci.txt installs it)")
def test_bypass_lifts_flas_hopper_guard(monkeypatch: pytest.MonkeyPatch) -> None:
    """FLA's own guard fires on 'Hopper' with this Triton (3.6); the opt-in lets the call past it (here it then
    fails later, at the launch, because there is no GPU), and the guard is back afterwards."""
    import fla.ops.common.chunk_o as chunk_o

    monkeypatch.setattr(chunk_o, "IS_NVIDIA_HOPPER", True)
    x = torch.randn(1, 64, 1, 16)
    args = {"q": x, "k": x, "v": x, "do": x, "h": torch.randn(1, 1, 1, 16, 16), "dh": torch.randn(1, 1, 1, 16, 16),
            "g": torch.randn(1, 64, 1)}
    with pytest.raises(RuntimeError, match="Hopper GPUs produces incorrect results"):
        chunk_o.chunk_bwd_dqkwg(**args)
    with fla_peer.hopper_guard({"bypass_hopper_guard": True}), pytest.raises(Exception) as err:
        chunk_o.chunk_bwd_dqkwg(**args)
    assert "Hopper" not in str(err.value)
    with pytest.raises(RuntimeError, match="Hopper GPUs produces incorrect results"):
        chunk_o.chunk_bwd_dqkwg(**args)


def test_peers_suite_expands_ours_and_flas_side_by_side() -> None:
    from pathlib import Path

    from runners.spec import load_spec

    rows = expand(load_spec(Path(__file__).resolve().parents[2] / "runners" / "suites" / "peers-h200.yaml"))
    assert len(rows) == 2 * 2 * 2 * 2 * 2  # op x backend x T x mode x direction
    skipped = [r for r in rows if r["status"] == "skipped"]
    # FLA's intra-card CP is forward only: skipped at fwd+bwd with FLA's reason, everything else runs
    assert {(r["backend"], r["mode"], r["direction"]) for r in skipped} == {("fla", "warmup_correct", "fwd+bwd")}
    assert len(skipped) == 4 and all("inference_mode" in r["reason"] for r in skipped)
    assert all(r["status"] == "queued" for r in rows if r not in skipped)
    assert {(r["backend"], r["mode"]) for r in rows} == {(b, m) for b in ("triton", "fla") for m in ("none", "warmup_correct")}


@pytest.mark.multiproc
def test_worker_refuses_a_plugin_point_that_reached_the_store(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                              store_url: str, plugin_modules: Any) -> None:  # noqa: F811
    """Defence in depth: a `module:object` point written to the store without the API's check (here: by hand) is
    failed by the worker with the refusal, and the module is never imported."""
    from db.models import Point
    from db.session import session_scope
    from runners.engine import submit_spec
    from runners.worker import run_worker

    marker = _spy_module(tmp_path, monkeypatch, "cpbench_spy_b")
    plugin_modules("")
    with session_scope(store_url) as s:
        sweep = submit_spec(s, parse_spec({"name": "w", "ops": "kda", "modes": "none", "axes": {"T": 64, "H": 2, "K": 16,
                                                                                         "V": 16}}))
        (point,) = s.query(Point).filter_by(sweep_id=sweep.id).all()
        point.params = {**point.params, "backend": "spy", "backend_ref": "cpbench_spy_b:PEER"}
        point.backend = "spy"
        sweep_id = sweep.id
    stats = run_worker(store_url, once=True, until_sweep=sweep_id, device_kind="cpu", devices=1,
                       artifact_dir=tmp_path / "art")
    assert (stats.done, stats.failed) == (0, 1)
    with session_scope(store_url) as s:
        (point,) = s.query(Point).filter_by(sweep_id=sweep_id).all()
        assert point.status == "failed" and point.attempts == 1
        assert "backend 'cpbench_spy_b:PEER' is refused" in point.error and "CPBENCH_PLUGIN_MODULES" in point.error
    assert not marker.exists() and "cpbench_spy_b" not in sys.modules
