"""The autotune loader (kernels/autotune.py) and the exporter (runners/tuner/export.py), on CPU.

Scenarios:
- export -> load round trip: tuned configs stored for the kernels the GDN and KDA Triton paths launch are
  exported (`--allow-cpu`, tests only), loaded with `use_autotune`, and the kernels then launch with exactly
  the exported configs, observed through a `LaunchRecorder` in the default plan (interpreted Triton, tiny shapes;
  skipped until the Triton kernels exist); the same with a test-only kernel, always;
- resolution: exact key; nearest key (distance, non-numeric fields must match, config must fit) warns once
  per (kernel, key); no comparable key -> the default, warned once; no file -> the default, silently;
- refusals: garbage, wrong schema_version, missing and mistyped fields (the message names the field),
  another device, a stale source hash, an unregistered kernel; strict=False ignores with a warning;
- CPBENCH_AUTOTUNE at the first call (`kernels.plan.default_plan`): loads the table once, defers the device check
  to the first launch; CPBENCH_AUTOTUNE_STRICT=0;
- the exporter refuses CPU timings without allow_cpu, several devices without a device name, and drops
  stale entries.
"""

from __future__ import annotations

import copy
import importlib.util
import json
import warnings
from datetime import datetime, timezone

import pytest
import torch

from db.models import Environment, TunedConfig
from kernels import autotune
from kernels.autotune import (
    AutotuneFallbackWarning,
    AutotuneFormatError,
    AutotuneMismatchError,
    key_distance,
    key_str,
    load_autotune,
    parse_autotune,
    source_hash,
)
from kernels.configs import KERNELS, KernelSpec, LaunchConfig, register
from kernels.plan import LaunchPlan, LaunchRecorder, default_plan, set_default_plan, use_autotune
from runners.tuner.export import ExportError, build_export, write_export

SPEC = register(KernelSpec(
    name="test_autotune_probe",
    key=("H", "K", "V", "BT", "IS_VARLEN", "dtype"),
    default=LaunchConfig(BV=32, num_warps=4, num_stages=2),
    space={"BV": (16, 32, 64), "num_warps": (2, 4, 8), "num_stages": (1, 2, 3)},
))
KEY = {"H": 16, "K": 128, "V": 128, "BT": 64, "IS_VARLEN": False, "dtype": torch.bfloat16}


def _entry(key, cfg, median=0.5):
    return {"key": autotune.normalize_key(key), "config": cfg, "median_ms": median, "default_ms": 0.6,
            "runner_up_ms": 0.55, "sweep_id": None, "measured_at": "2026-11-30T00:00:00+00:00"}


def _file(entries=None, *, device="cpu", kernel=SPEC.name, h=None):
    if entries is None:
        entries = [_entry(KEY, {"BV": 64, "num_warps": 8, "num_stages": 3})]
    return {"schema_version": 1, "device": {"name": device, "compute_capability": None},
            "versions": {"torch": torch.__version__, "triton": "3.6.0", "cpbench": "0.1.0"},
            "created_at": "2026-11-30T00:00:00+00:00",
            "kernels": {kernel: {"source_hash": h or source_hash(SPEC.name), "entries": entries}}}


def pick_config(spec: KernelSpec, key, recorder: LaunchRecorder | None = None) -> LaunchConfig:
    """What a launcher of `spec` picks for `key` under the default plan (use_autotune / CPBENCH_AUTOTUNE)."""
    return default_plan().with_recorder(recorder).config_for(spec, key)


@pytest.fixture(autouse=True)
def _clean():
    set_default_plan(LaunchPlan())
    yield
    set_default_plan(None)


def _write(tmp_path, data, name="autotune.json"):
    p = tmp_path / name
    p.write_text(json.dumps(data) if not isinstance(data, str) else data)
    return p


# resolution


def test_exact_key_no_warning(tmp_path) -> None:
    use_autotune(_write(tmp_path, _file()))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        cfg = pick_config(SPEC, KEY, rec := LaunchRecorder())
    assert cfg == LaunchConfig(BV=64, num_warps=8, num_stages=3)
    assert rec[SPEC.name] == (KEY, cfg)


def test_no_file_defaults_silently() -> None:
    use_autotune(None)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert pick_config(SPEC, KEY) == SPEC.default


def test_nearest_key_warns_once(tmp_path) -> None:
    near = {**KEY, "H": 32}                                   # distance 1
    far = {**KEY, "H": 64, "K": 64}                           # distance 2 + 1
    narrow = {**KEY, "H": 8, "V": 256}                        # distance 2; nearest to the V=64 key below, but BV=128 > 64
    use_autotune(_write(tmp_path, _file([_entry(near, {"BV": 16, "num_warps": 2, "num_stages": 1}),
                                         _entry(far, {"BV": 64, "num_warps": 8, "num_stages": 3}),
                                         _entry(narrow, {"BV": 128, "num_warps": 4, "num_stages": 2})])))
    with pytest.warns(AutotuneFallbackWarning, match="nearest key") as rec:
        cfg = pick_config(SPEC, KEY)
        cfg2 = pick_config(SPEC, KEY)
    assert len(rec) == 1
    assert cfg == cfg2 == LaunchConfig(BV=16, num_warps=2, num_stages=1)
    # another key warns again, once; the BV=128 entry is skipped for V=64 although it is the nearest
    with pytest.warns(AutotuneFallbackWarning) as rec:
        assert pick_config(SPEC, {**KEY, "V": 64, "H": 8}).BV == 16
        pick_config(SPEC, {**KEY, "V": 64, "H": 8})
    assert len(rec) == 1
    # a different non-numeric field (dtype) has no comparable entry: the default
    with pytest.warns(AutotuneFallbackWarning, match="using the default"):
        assert pick_config(SPEC, {**KEY, "dtype": "float16"}) == SPEC.default


def test_a_resolved_key_is_remembered(tmp_path, monkeypatch) -> None:
    """(session 20) The table resolves each (kernel, key) once: later launches with the same key do not look it up
    again (a step asks the same ~15 keys every call), and get the same config; an unhashable key value is resolved
    every time, correctly."""
    near = {**KEY, "H": 32}
    use_autotune(_write(tmp_path, _file([_entry(near, {"BV": 16, "num_warps": 2, "num_stages": 1})])))
    table = default_plan().table
    calls = []
    real = table.lookup
    monkeypatch.setattr(table, "lookup", lambda kernel, key: calls.append(kernel) or real(kernel, key))
    with pytest.warns(AutotuneFallbackWarning, match="nearest key"):
        first = [pick_config(SPEC, KEY) for _ in range(3)]
    assert first == [LaunchConfig(BV=16, num_warps=2, num_stages=1)] * 3 and calls == [SPEC.name]
    assert pick_config(SPEC, near) == first[0] and len(calls) == 2  # another key: looked up once
    odd = {**KEY, "extra": [1]}  # a list: no memo; not comparable to the entry (other fields): the default
    with pytest.warns(AutotuneFallbackWarning, match="using the default"):
        assert pick_config(SPEC, odd) == pick_config(SPEC, odd) == SPEC.default
    assert len(calls) == 4


def test_key_distance_rules() -> None:
    assert key_distance(KEY, {**KEY, "H": 32}) == 1.0
    assert key_distance(KEY, {**KEY, "H": 4, "V": 256}) == 3.0
    assert key_distance(KEY, {**KEY, "IS_VARLEN": True}) == float("inf")
    assert key_distance(KEY, {k: v for k, v in KEY.items() if k != "BT"}) == float("inf")
    assert key_str(KEY) == "BT=64,H=16,IS_VARLEN=False,K=128,V=128,dtype=bfloat16"


# refusals


@pytest.mark.parametrize(
    ("mutate", "match"),
    [
        pytest.param(lambda d: d.update(schema_version=2), "'schema_version' is 2; this build reads schema_version 1", id="schema-version"),
        pytest.param(lambda d: d.pop("versions"), "field 'versions' is missing", id="no-versions"),
        pytest.param(lambda d: d["device"].pop("name"), "field 'device.name' is missing", id="no-device-name"),
        pytest.param(lambda d: d["kernels"][SPEC.name]["entries"][0].pop("median_ms"),
                     r"field 'kernels.test_autotune_probe.entries\[0\].median_ms' is missing", id="no-median"),
        pytest.param(lambda d: d["kernels"][SPEC.name]["entries"][0]["config"].update(BV="64"),
                     r"entries\[0\].config' is not a launch config", id="config-str"),
        pytest.param(lambda d: d["kernels"][SPEC.name]["entries"][0]["config"].update(BX=64),
                     "unknown launch-config fields", id="config-unknown-field"),
        pytest.param(lambda d: d["kernels"][SPEC.name].update(source_hash="abc"), "64 lowercase hex", id="bad-hash"),
        pytest.param(lambda d: d.update(kernels=[]), "field 'kernels' must be dict", id="kernels-list"),
        pytest.param(lambda d: d["kernels"][SPEC.name]["entries"][0].update(key=3), r"entries\[0\].key' must be dict", id="key-int"),
    ],
)
def test_malformed_file_names_field(tmp_path, mutate, match) -> None:
    data = _file()
    mutate(data)
    with pytest.raises(AutotuneFormatError, match=match):
        load_autotune(_write(tmp_path, data))
    # malformed is refused in non-strict mode too
    with pytest.raises(AutotuneFormatError):
        load_autotune(_write(tmp_path, data), strict=False)


def test_garbage_file(tmp_path) -> None:
    with pytest.raises(AutotuneFormatError, match="is not valid JSON"):
        load_autotune(_write(tmp_path, "{not json"))
    with pytest.raises(AutotuneFormatError, match="top level must be a JSON object"):
        load_autotune(_write(tmp_path, "[1, 2]"))
    with pytest.raises(FileNotFoundError, match="autotune file not found"):
        load_autotune(tmp_path / "missing.json")


def test_wrong_device(tmp_path) -> None:
    p = _write(tmp_path, _file(device="NVIDIA H200"))
    with pytest.raises(AutotuneMismatchError, match="tuned on device 'NVIDIA H200', but this process runs on 'cpu'"):
        use_autotune(p)
    with pytest.warns(AutotuneFallbackWarning, match="ignored"):
        use_autotune(p, strict=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert pick_config(SPEC, KEY) == SPEC.default
    # the device can be named explicitly (what a job checks before it reaches the GPU)
    assert load_autotune(p, device_name="NVIDIA H200").entries[SPEC.name]


def test_stale_source_hash_and_unknown_kernel(tmp_path) -> None:
    p = _write(tmp_path, _file(h="0" * 64))
    with pytest.raises(AutotuneMismatchError, match="kernel 'test_autotune_probe' was tuned with source hash 000000000000"):
        use_autotune(p)
    with pytest.warns(AutotuneFallbackWarning, match="ignored"):
        table = use_autotune(p, strict=False)
    assert SPEC.name not in table.entries
    with pytest.warns(AutotuneFallbackWarning, match="using the default"):
        assert pick_config(SPEC, KEY) == SPEC.default
    with pytest.raises(AutotuneMismatchError, match="'no_such_kernel', which this build does not register"):
        load_autotune(_write(tmp_path, _file(kernel="no_such_kernel")))


def test_autoload_from_env_defers_device_check(tmp_path, monkeypatch) -> None:
    set_default_plan(None)  # the default plan comes from CPBENCH_AUTOTUNE
    monkeypatch.delenv("CPBENCH_AUTOTUNE", raising=False)
    assert default_plan().table is None
    monkeypatch.setenv("CPBENCH_AUTOTUNE", str(_write(tmp_path, _file())))
    table = default_plan().table
    assert table is not None and default_plan().table is table  # loaded once, at the first call
    assert pick_config(SPEC, KEY).BV == 64
    # a file for another device loads at the first call, and is refused at the first launch
    monkeypatch.setenv("CPBENCH_AUTOTUNE", str(_write(tmp_path, _file(device="NVIDIA H200"), "h200.json")))
    assert default_plan().table is not None
    with pytest.raises(AutotuneMismatchError, match="NVIDIA H200"):
        pick_config(SPEC, KEY)
    monkeypatch.setenv("CPBENCH_AUTOTUNE_STRICT", "0")
    default_plan()
    with pytest.warns(AutotuneFallbackWarning):
        assert pick_config(SPEC, KEY) == SPEC.default
    # use_autotune takes precedence over the variable in its context
    use_autotune(_write(tmp_path, _file()))
    assert pick_config(SPEC, KEY).BV == 64
    set_default_plan(None)
    monkeypatch.setenv("CPBENCH_AUTOTUNE_STRICT", "maybe")
    with pytest.raises(ValueError, match="CPBENCH_AUTOTUNE_STRICT must be one of"):
        default_plan()


def test_schema_dict_matches_parser() -> None:
    assert autotune.SCHEMA["properties"]["schema_version"]["const"] == autotune.SCHEMA_VERSION
    assert set(autotune.SCHEMA["required"]) == set(_file())
    entry_req = autotune.SCHEMA["properties"]["kernels"]["additionalProperties"]["properties"]["entries"]["items"]["required"]
    assert set(entry_req) == set(_entry(KEY, {}))


# export


def _row(kernel, key, cfg, *, device="cpu", h=None, median=0.5, env=None):
    return TunedConfig(kernel=kernel, key=autotune.normalize_key(key), key_str=key_str(key), device_name=device,
                       compute_capability=None if device == "cpu" else "9.0", config=cfg, median_ms=median, default_ms=0.7,
                       runner_up_ms=0.6, source_hash=h or source_hash(kernel), sweep_id=None, environment_id=env,
                       measured_at=datetime.now(timezone.utc))


def test_export_rules(session, tmp_path) -> None:
    session.add_all([_row(SPEC.name, KEY, {"BV": 16, "num_warps": 2, "num_stages": 1}),
                     _row(SPEC.name, {**KEY, "H": 8}, {"BV": 64, "num_warps": 8, "num_stages": 3}, h="f" * 64)])
    session.commit()
    with pytest.raises(ExportError, match="refusing to export CPU timings"):
        build_export(session)
    data = write_export(tmp_path / "out" / "a.json", session, allow_cpu=True)
    # the stale (other-hash) entry is dropped; the file loads and resolves exactly
    assert [e["key"]["H"] for e in data["kernels"][SPEC.name]["entries"]] == [16]
    use_autotune(tmp_path / "out" / "a.json")
    assert pick_config(SPEC, KEY) == LaunchConfig(BV=16, num_warps=2, num_stages=1)
    env = Environment(fingerprint="x" * 64, device_name="NVIDIA H200", torch="2.11.0+cu130", triton="3.6.0",
                      python="3.12", cpbench="0.1.0", host="h")
    session.add(env)
    session.flush()
    session.add(_row(SPEC.name, KEY, {"BV": 64, "num_warps": 4, "num_stages": 2}, device="NVIDIA H200", env=env.id))
    session.commit()
    with pytest.raises(ExportError, match="several devices"):
        build_export(session, allow_cpu=True)
    h200 = build_export(session, device_name="NVIDIA H200")
    assert h200["device"] == {"name": "NVIDIA H200", "compute_capability": "9.0"}
    assert h200["versions"] == {"torch": "2.11.0+cu130", "triton": "3.6.0", "cpbench": "0.1.0"}
    with pytest.raises(ExportError, match="no tuned configs for device 'NVIDIA H100'"):
        build_export(session, device_name="NVIDIA H100")
    # a copy tweaked to the wrong schema is refused by the loader, whatever the exporter wrote
    bad = copy.deepcopy(h200)
    bad["schema_version"] = 0
    with pytest.raises(AutotuneFormatError):
        parse_autotune(bad, device_name="NVIDIA H200")


def test_round_trip_test_kernel(session, tmp_path) -> None:
    keys = [KEY, {**KEY, "H": 4}, {**KEY, "IS_VARLEN": True}]
    cfgs = [{"BV": 16, "num_warps": 2, "num_stages": 1}, {"BV": 64, "num_warps": 8, "num_stages": 3},
            {"BV": 32, "num_warps": 8, "num_stages": 1}]
    session.add_all([_row(SPEC.name, k, c) for k, c in zip(keys, cfgs, strict=True)])
    session.commit()
    path = tmp_path / "autotune.json"
    write_export(path, session, allow_cpu=True)
    use_autotune(path)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for k, c in zip(keys, cfgs, strict=True):
            pick_config(SPEC, k, rec := LaunchRecorder())
            assert rec[SPEC.name][1] == LaunchConfig.from_dict(c)


_HAVE_TRITON_OPS = all(importlib.util.find_spec(m) is not None for m in ("kernels.ops.gdn.chunk", "kernels.ops.kda.chunk"))


@pytest.mark.skipif(not _HAVE_TRITON_OPS, reason="the Triton GDN/KDA paths (kernels/ops/{gdn,kda}/chunk.py) do not exist yet")
@pytest.mark.parametrize("op", ["gdn", "kda"])
def test_round_trip_triton_kernels_launch_exported(op, session, tmp_path) -> None:
    import kernels
    from runners.tuner import make_case
    from runners.tuner.tune import Shape

    case = make_case(op, Shape(B=1, T=64, H=1, K=16, V=32, dtype="float32"), "cpu")
    args = (case["q"], case["k"], case["v"], case["g"], case["beta"])
    rec = LaunchRecorder()
    kernels.forward(op, *args, backend="triton", output_final_state=True, plan=default_plan().with_recorder(rec))
    launched = {n: k for n, (k, _c) in rec.items()}
    first = {n: c for n, (_k, c) in rec.items()}  # the defaults (clamped to small head dims by the launchers)
    assert launched
    # for each launched kernel: a non-default config of its space that fits the key
    chosen = {}
    for name, key in launched.items():
        spec = KERNELS[name]
        fits = [c for c in spec.configs() if c != spec.default and (c.BV or 0) <= key.get("V", 1 << 30)
                and (c.BK or 0) <= key.get("K", 1 << 30)]
        chosen[name] = fits[-1] if fits else spec.default
        session.add(_row(name, key, chosen[name].as_dict()))
    session.commit()
    path = tmp_path / f"{op}.json"
    write_export(path, session, allow_cpu=True)
    use_autotune(path)
    rec = LaunchRecorder()
    with warnings.catch_warnings():
        warnings.simplefilter("error", AutotuneFallbackWarning)
        o, ht = kernels.forward(op, *args, backend="triton", output_final_state=True, plan=default_plan().with_recorder(rec))
    assert {n: c for n, (_k, c) in rec.items()} == chosen
    o_ref, ht_ref = kernels.reference(op, *args, output_final_state=True)
    assert float((o - o_ref).norm() / o_ref.norm()) < 1e-3  # fp32 in, tf32-free interpreter: only summation order
    # with the file removed, the same launches use the defaults again
    use_autotune(None)
    kernels.forward(op, *args, backend="triton", output_final_state=True, plan=default_plan().with_recorder(rec))
    assert {n: c for n, (_k, c) in rec.items()} == first


def test_source_hash_covers_device_helper_modules(monkeypatch: pytest.MonkeyPatch) -> None:
    # the WY kernels call kernels.common.chunk_program's jitted helper: editing it must make tuned entries stale
    import inspect

    import kernels.common.chunk_state
    import kernels.common.wy  # noqa: F401  (registers the kernels whose hashes are compared)
    from kernels import autotune

    before, unrelated = autotune.source_hash("wy_gdn_fwd"), autotune.source_hash("chunk_state_fwd")
    real = inspect.getsource

    def edited(obj):  # type: ignore[no-untyped-def]
        src = real(obj)
        return src + "\n# edited\n" if getattr(obj, "__name__", "") == "kernels.common.chunk_program" else src

    monkeypatch.setattr(inspect, "getsource", edited)
    assert autotune.source_hash("wy_gdn_fwd") != before
    assert autotune.source_hash("chunk_state_fwd") == unrelated  # its module calls no chunk_program helper


def test_round_trip_backward_kernels_launch_exported(session, tmp_path) -> None:
    """Tuned entries of the backward's kernels (exported like the forward's) are the configs the backward launches."""
    from kernels.ops.gdn.chunk import chunk_gdn_bwd
    from runners.tuner import make_case
    from runners.tuner.tune import Shape

    case = make_case("gdn", Shape(B=1, T=64, H=1, K=32, V=32, dtype="float32"), "cpu")
    args = (case["q"], case["k"], case["v"], case["g"], case["beta"], case["do"])
    seen = LaunchRecorder()
    pair = {"bwd_grads": "pair"}  # the two gradient kernels (GDN's default is one: AUTO_BWD_GRADS)
    ref = chunk_gdn_bwd(*args, scale=32**-0.5, plan=default_plan().replace(**pair).with_recorder(seen))
    key = seen["wy_bwd"][0]
    chosen = {"wy_bwd": LaunchConfig(BK=32, BV=32, num_warps=2, num_stages=1),
              "chunk_bwd_dqk": LaunchConfig(BK=32, BV=32, num_warps=8, num_stages=1)}
    for name, cfg in chosen.items():
        session.add(_row(name, seen[name][0], cfg.as_dict()))
    session.commit()
    assert key == seen["chunk_bwd_dqk"][0]
    path = tmp_path / "bwd.json"
    write_export(path, session, allow_cpu=True)
    use_autotune(path)
    seen.clear()
    got = chunk_gdn_bwd(*args, scale=32**-0.5, plan=default_plan().replace(**pair).with_recorder(seen))
    assert {n: seen[n][1] for n in chosen} == chosen
    for a, b in zip(got[:5], ref[:5], strict=True):
        assert float((a - b).norm() / b.norm()) < 1e-5  # same math, other tiles: only summation order
