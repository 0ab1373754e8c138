"""FLA's config cache from our side: the key of an autotuned call as Triton caches it (a pinned config launches
with no benchmarking, under the interpreter), and `cpbench configs export --format fla` read back by FLA's own
loader (`fla/ops/utils/cache.py`), keys included.

FLA's own kernels do not run under the Triton interpreter (its autotuner benchmarks through a GPU driver, and
its fwd_h kernel fails to interpret), so `cpbench tune --backend fla` is exercised on the GPU only
(benchmarks/fla_config_cache.py); its pieces (keys, pinning, the file format) are tested here.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import io
import json
from pathlib import Path

import pytest
import torch
import triton
import triton.language as tl
from typer.testing import CliRunner

from runners.peers import fla_autotune as fa
from runners.tuner.export import build_export
from runners.tuner.fla_export import fla_files_from_rows

HAS_FLA = importlib.util.find_spec("fla") is not None
DEVICE = "NVIDIA H200"


@triton.autotune(configs=[triton.Config({"BS": 16}, num_warps=1), triton.Config({"BS": 32}, num_warps=2)], key=["n"])
@triton.jit
def _scale_kernel(x, y, n, BS: tl.constexpr):
    offs = tl.program_id(0) * BS + tl.arange(0, BS)
    m = offs < n
    tl.store(y + offs, tl.load(x + offs, mask=m) * 2.0, mask=m)


def _launch(x: torch.Tensor) -> torch.Tensor:
    y = torch.empty_like(x)
    _scale_kernel[lambda meta: (triton.cdiv(x.numel(), meta["BS"]),)](x, y, x.numel())
    return y


def test_touched_call_carries_its_own_autotuner_when_names_repeat() -> None:
    """FLA 0.6.0 has four Autotuners named `recompute_w_u_fwd_kernel` (GDN's, KDA's, ...): the tuner must pin the
    one that ran, not the first of that name."""
    first = fa.autotuner_of(_scale_kernel)
    elsewhere = triton.autotune(configs=list(first.configs), key=["n"])(first.fn)  # another Autotuner, same name
    assert fa._name(elsewhere) == fa._name(first) == "_scale_kernel"
    x = torch.randn(64)
    key = (64, "torch.float32", "torch.float32")
    fa.pin(elsewhere, key, elsewhere.configs[0])
    try:
        y = torch.empty_like(x)
        calls = fa.record_touched(lambda: elsewhere[lambda meta: (triton.cdiv(64, meta["BS"]),)](x, y, 64))
        assert [(c.name, c.key) for c in calls] == [("_scale_kernel", key)]
        assert calls[0].tuner is elsewhere and calls[0].tuner is not first
        torch.testing.assert_close(y, 2 * x)
    finally:
        fa.unpin(elsewhere, key)


def test_recorded_key_is_the_one_triton_caches_and_a_pin_skips_benchmarking() -> None:
    # under TRITON_INTERPRET=1 benchmarking needs a GPU driver: the call succeeds only if the pinned key matches
    x = torch.randn(100)
    tuner = fa.autotuner_of(_scale_kernel)
    key = (100, "torch.float32", "torch.float32")
    cfg = tuner.configs[1]
    fa.pin(tuner, key, cfg)
    try:
        calls = fa.record_touched(lambda: _launch(x))
        assert calls == [("_scale_kernel", key, tuner)] and calls[0].tuner is tuner
        torch.testing.assert_close(_launch(x), 2 * x)
        assert tuner.best_config is cfg
    finally:
        fa.unpin(tuner, key)
    assert fa.config_of(fa.config_dict(cfg)).all_kwargs() == cfg.all_kwargs()


def _rows(key: list, configs: list[dict]) -> list:
    from db.models import TunedConfig

    return [TunedConfig(kernel=f"fla.{name}", key={"autotune_key": k}, key_str=json.dumps(k), device_name=DEVICE,
                        compute_capability="9.0", config=c, median_ms=ms, default_ms=ms * 1.1, runner_up_ms=None,
                        source_hash="fla:x", sweep_id=None, environment_id=None)
            for name, k, c, ms in zip(["kern_a", "kern_a", "kern_b"], key, configs, (1.0, 2.0, 3.0), strict=True)]


CFG = [{"kwargs": {"BV": 32}, "num_warps": 2, "num_stages": 3, "num_ctas": 1, "maxnreg": None, "ir_override": None},
       {"kwargs": {"BV": 64}, "num_warps": 4, "num_stages": 2, "num_ctas": 1, "maxnreg": None, "ir_override": None}]
KEYS = [[2, 4, 128, 128, 64, False, "torch.bfloat16"], [2, 4, 64, 64, 64, False, "torch.bfloat16"], [16, "torch.float32"]]


def test_fla_files_format_hash_and_default() -> None:
    files = fla_files_from_rows(_rows(KEYS, [CFG[0], CFG[1], CFG[1]]), device_name=None, allow_cpu=False,
                                triton_version="3.6.0")
    assert sorted(files) == ["kern_a.json", "kern_b.json"]
    a = files["kern_a.json"]
    assert a["kernel_name"] == "kern_a" and a["triton_version"] == "3.6.0"
    want = hashlib.md5(b'[2,4,128,128,64,false,"torch.bfloat16"]').hexdigest()
    assert a["autotune_entries"][want] == {"autotune_key": KEYS[0], "config": CFG[0], "best_timing": 1.0}
    assert len(a["autotune_entries"]) == 2 and a["default_config"] in CFG
    with pytest.raises(ValueError, match="refusing to export CPU timings"):
        rows = _rows(KEYS, [CFG[0]] * 3)
        for r in rows:
            r.device_name = "cpu"
        fla_files_from_rows(rows, device_name=None, allow_cpu=False, triton_version=None)


def test_benchmark_merges_each_op_and_t_into_one_export(tmp_path: Path) -> None:
    """benchmarks/fla_config_cache.py tunes one op and T per process and merges the winners into one directory:
    a later run keeps the earlier runs' entries and replaces an entry it tuned again."""
    from tests.utils.scripts import load_script

    script = load_script("fla_config_cache")
    first = fla_files_from_rows(_rows(KEYS, [CFG[0], CFG[0], CFG[0]]), device_name=None, allow_cpu=False,
                                triton_version="3.6.0")
    again = [KEYS[0], [2, 4, 256, 256, 64, False, "torch.bfloat16"], KEYS[2]]
    second = fla_files_from_rows(_rows(again, [CFG[1], CFG[1], CFG[1]]), device_name=None, allow_cpu=False,
                                 triton_version="3.6.0")
    script._merge_export(tmp_path, first)
    script._merge_export(tmp_path, second)
    merged = script._load_export(tmp_path)
    entries = merged["kern_a"]["autotune_entries"]
    by_key = {json.dumps(e["autotune_key"]): e["config"] for e in entries.values()}
    assert by_key == {json.dumps(KEYS[0]): CFG[1], json.dumps(KEYS[1]): CFG[0], json.dumps(again[1]): CFG[1]}
    assert [e["config"] for e in merged["kern_b"]["autotune_entries"].values()] == [CFG[1]]


def test_cli_export_fla_and_cpbench_format_keeps_them_apart(tmp_path: Path) -> None:
    from db import crud
    from db.migrate import upgrade
    from db.session import dispose_engine, session_scope
    from runners.cli import app, main

    url = f"sqlite:///{tmp_path / 'cpbench.db'}"
    upgrade(url)
    try:
        with session_scope(url) as s:
            for r in _rows(KEYS, [CFG[0], CFG[1], CFG[1]]):
                crud.upsert_tuned_config(s, **{c: getattr(r, c) for c in (
                    "kernel", "key", "key_str", "device_name", "compute_capability", "config", "median_ms", "default_ms",
                    "runner_up_ms", "source_hash", "sweep_id", "environment_id")})
        out = tmp_path / "fla-configs"
        res = CliRunner().invoke(app, ["configs", "export", "--format", "fla", "-o", str(out), "--db", url])
        assert res.exit_code == 0, res.output
        assert "2 FLA config-cache files, 3 entries" in res.output
        assert sorted(p.name for p in out.iterdir()) == ["kern_a.json", "kern_b.json"]
        err = io.StringIO()
        with contextlib.redirect_stderr(err), pytest.raises(SystemExit) as exc:
            main(["configs", "export", "--format", "fla", "-o", "-", "--db", url])
        assert exc.value.code == 1 and "give -o DIR" in err.getvalue() and "Traceback" not in err.getvalue()
        with session_scope(url) as s, pytest.raises(ValueError, match="no tuned configs to export"):
            build_export(s)  # our autotune JSON never carries FLA's kernels
    finally:
        dispose_engine(url)


@pytest.mark.skipif(not HAS_FLA, reason="needs fla-core (requirements-ci.txt installs it)")
def test_export_read_back_by_fla_loader(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import fla.ops.utils.cache as cache
    from fla.ops.gated_delta_rule import chunk_gated_delta_rule  # noqa: F401  (imports FLA's GDN kernels)

    name = "chunk_gated_delta_rule_fwd_kernel_h_blockdim64"
    tuner = fa.autotuners()[name]
    assert isinstance(tuner, cache.CachedAutotuner) and tuner.kernel_name == name
    # a call's arguments as FLA's launcher passes them: tensors by dtype, the key's ints
    args = {n: torch.empty(1, dtype=torch.bfloat16) for n in ("k", "v", "w", "v_new")}
    args.update(g=torch.empty(1), H=4, HV=4, K=128, V=128, BT=64, STATE_V_FIRST=False, T=256)
    ours = fa.tuning_key(tuner, (), args)
    theirs = cache.AutotuneKey.build(tuner.arg_names, tuner.keys, (), args)
    assert ours == theirs.autotune_key
    other = (*ours[:2], 64, 64, *ours[4:])
    from db.models import TunedConfig

    rows = [TunedConfig(kernel=f"fla.{name}", key={"autotune_key": list(k)}, key_str=json.dumps(list(k)), device_name=DEVICE,
                        config=fa.config_dict(c), median_ms=ms, source_hash="fla:x")
            for k, c, ms in ((ours, tuner.configs[-1], 1.0), (other, tuner.configs[0], 2.0))]
    files = fla_files_from_rows(rows, device_name=DEVICE, allow_cpu=False, triton_version=triton.__version__)
    for fname, content in files.items():
        (tmp_path / fname).write_text(json.dumps(content))
    monkeypatch.setenv("FLA_CONFIG_DIR", str(tmp_path))
    monkeypatch.setattr(cache, "FLA_CACHE_MODE", cache.FlaCacheMode.STRICT)
    assert cache.load_cached_config(name, theirs) == fa.config_dict(tuner.configs[-1])
    assert cache.load_cached_config(name, cache.AutotuneKey(other)) == fa.config_dict(tuner.configs[0])
    assert cache.load_cached_config(name, cache.AutotuneKey((*ours[:2], 32, 32, *ours[4:]))) is None  # strict: exact keys
    tuner.cache.pop(ours, None)
    try:
        tuner.maybe_load_cached_config(key=theirs, nargs={}, runtime_kwargs={})  # what FLA does before launching
        got = tuner.cache[ours]
        assert got.all_kwargs() == tuner.configs[-1].all_kwargs()
    finally:
        tuner.cache.pop(ours, None)


def test_tune_backend_fla_on_cpu_is_one_line(tmp_path: Path) -> None:
    from db.migrate import upgrade
    from db.session import dispose_engine
    from runners.cli import main

    url = f"sqlite:///{tmp_path / 'cpbench.db'}"
    upgrade(url)
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), pytest.raises(SystemExit) as exc:
            main(["tune", "--backend", "fla", "--op", "gdn", "--shape", "B=1,T=64,H=1,K=16,V=16", "--device", "cpu", "--db", url])
    finally:
        dispose_engine(url)
    assert exc.value.code == 1 and "needs a CUDA GPU" in err.getvalue() and len(err.getvalue().strip().splitlines()) == 1
