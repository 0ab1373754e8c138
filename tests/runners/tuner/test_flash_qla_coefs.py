"""FlashQLA's auto-CP coefficients refit: the least-squares fit on synthetic timings recovers the coefficients that
made them; the CSV goes through FlashQLA's own loader where flash_qla is installed (its autocp files load without a
GPU), else through the documented format, and round-trips the fit exactly; the store keeps a fit
(`db.crud.store_tuning`) that `cpbench configs export --format flash_qla` writes back as FlashQLA's CSV, apart from
our autotune JSON; `cpbench tune --backend flash_qla` on a host without a GPU refuses in one line.

The synthetic timings follow FlashQLA's law t = a·depth + b·u + c at the (depth, u) a split of a sequence gives:
depth = the partition length S in chunks, u = H x partitions (the shapes `cpbench tune` times).
"""

from __future__ import annotations

import contextlib
import io
import math
import random
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from typer.testing import CliRunner

from runners.tuner.flash_qla import LAUNCHERS, FlashQLADevice, KernelTimer, coef_results, split_sizes, splits_around
from runners.tuner.flash_qla_coefs import (
    REQUIRED_ROWS,
    Timing,
    coef_csv,
    csv_from_rows,
    fit_coefficients,
    flash_qla_autocp,
    flash_qla_loader,
    predict_ms,
    read_coef_csv,
)
from runners.tuner.result import FLASH_QLA_PREFIX, TuneResult
from runners.tuner.spec import TuneSpec
from runners.tuner.tune import Shape

# known coefficients per row (ms; the magnitudes of FlashQLA's sm90 file), including one row FlashQLA lacks
TRUE = {
    "prepare_h": {"a": 0.0032, "b": 6.3e-05, "c": 0.0144},
    "correct_h0_dv128": {"a": 0.0037, "b": 9.5e-06, "c": 0.0067},
    "fused_fwd_dv32": {"a": 0.0021, "b": 0.0026, "c": -0.01},
    "fused_fwd_dv64": {"a": 0.0026, "b": 4.4e-05, "c": -0.02},
    "fused_fwd_dv128": {"a": 0.0040, "b": 7.9e-05, "c": 0.0079},
    "fused_bwd": {"a": 0.0117, "b": 6.1e-04, "c": 0.0445},
}
SHAPES = [(T, H) for T in (8192, 16384, 32768, 65536, 131072) for H in (8, 16, 32)]
NOISE_MS = 0.003  # timing jitter (ms, one standard deviation) of the noisy fits


def design() -> list[tuple[float, float]]:
    """The (depth, u) a refit times: every split of every shape (depth S chunks, u = H x partitions)."""
    pts = []
    for T, H in SHAPES:
        chunks = T // 64
        for S in split_sizes(chunks, 4):
            pts.append((float(S), float(H * math.ceil(chunks / S))))
    return pts


def synthetic(rows: dict[str, dict[str, float]], *, noise: float, seed: int = 0) -> list[Timing]:
    rng = random.Random(seed)
    return [Timing(row=row, depth=d, u=u, ms=max(0.0, predict_ms(c, d, u) + noise * rng.gauss(0, 1)))
            for row, c in rows.items() for d, u in design()]  # fmt: skip


def flat(rows: dict[str, dict[str, float]]) -> dict[tuple[str, str], float]:
    """{(row, coefficient): value}: nested coefficient dicts as pytest.approx compares them."""
    return {(r, k): v for r, c in rows.items() for k, v in c.items()}


def test_kernel_timer_names_each_launcher_call_and_puts_the_launchers_back() -> None:
    """FlashQLA's chunk module as its CP preprocessing and backward call it (a namespace with its launchers' names;
    `fused_gdr_dh` None as on SM120): each call is timed under the kernel it prices, fused_gdr_h by `output_h`."""
    import time
    import types

    def launcher(ms: float) -> Any:
        def run(*args: Any, **kwargs: Any) -> tuple[Any, ...]:
            time.sleep(ms / 1e3)
            return args

        return run

    module = types.SimpleNamespace(
        **{n: launcher(5.0) for n in LAUNCHERS if n != "fused_gdr_dh"}, fused_gdr_dh=None, other=launcher(0)
    )
    originals = dict(vars(module))
    timer = KernelTimer(device="cpu")
    with timer.patched(module):
        assert module.fused_gdr_fwd is not originals["fused_gdr_fwd"] and module.fused_gdr_dh is None
        assert module.fused_gdr_h(1, output_h=False, output_final_state=True) == (1,)  # the call goes through
        module.fused_gdr_h(output_h=True)
        module.correct_initial_states()
        module.correct_initial_states()
        module.fused_gdr_fwd()
        module.other()
        got = timer.take()
        assert timer.take() == {}  # taken once
    assert vars(module) == originals
    assert set(got) == {"prepare_h", "recompute_h", "correct_h0", "fused_fwd"}
    assert got["correct_h0"] >= 10.0 and all(v >= 5.0 for v in got.values())
    assert got["correct_h0"] > 1.5 * got["fused_fwd"]  # two calls summed


def test_split_sizes_are_powers_of_two_and_few_partition_cuts_up_to_the_whole_sequence() -> None:
    assert split_sizes(128, 4) == [4, 8, 16, 19, 22, 26, 32, 43, 64, 128]  # 128/7 -> 19, /6 -> 22, /5 -> 26, /3 -> 43
    assert split_sizes(100, 4, parts=3) == [4, 8, 16, 32, 34, 50, 64, 100]
    assert split_sizes(4, 4) == [4] and split_sizes(6, 4) == [4, 6]


def test_splits_around_a_decision_are_its_candidates_picks_their_neighbours_and_no_split() -> None:
    # FlashQLA's decide at T=32K, H=16 on 132 SMs prices S 21, 32, 63 and picks 63 (9 partitions of 512 chunks)
    assert splits_around(512, [63, 63], [21, 32, 63], 4) == [21, 32, 52, 63, 64, 512]  # 8 parts -> 64, 10 -> 52
    assert splits_around(512, [None, 63], [], 4) == [52, 63, 64, 512]  # no split picked: its best CP split still
    assert splits_around(10, [4], [2], 4) == [4, 5, 10]  # 3 parts; 2 -> 5; 4 -> 3 < the minimum; 2 < the minimum
    assert splits_around(8, [8, None], [], 4) == [8]  # a pick of the whole sequence is no split


def test_fit_recovers_known_coefficients_exactly_without_noise() -> None:
    fit = fit_coefficients(synthetic(TRUE, noise=0.0))
    assert set(fit.rows) == set(TRUE) and not fit.unfitted
    for row, want in TRUE.items():
        got = fit.rows[row]
        assert got.n == len(design())
        for name, value in want.items():
            assert getattr(got, name) == pytest.approx(value, rel=1e-9, abs=1e-12), (row, name)
        assert got.rms_ms < 1e-9


def test_fit_recovers_known_coefficients_within_their_standard_errors_under_noise() -> None:
    """3 µs timing jitter: each coefficient within 4 standard errors of the truth (the errors from the design and
    the noise the fit leaves), and a wrong truth would be far outside them."""
    pts = np.array([[d, u, 1.0] for d, u in design()])
    for seed in (0, 1):
        fit = fit_coefficients(synthetic(TRUE, noise=NOISE_MS, seed=seed))
        for row, want in TRUE.items():
            got = fit.rows[row]
            sigma = got.rms_ms * math.sqrt(len(pts) / (len(pts) - 3))
            stderr = sigma * np.sqrt(np.diag(np.linalg.inv(pts.T @ pts)))
            for i, name in enumerate(("a", "b", "c")):
                assert abs(getattr(got, name) - want[name]) < 4 * stderr[i] + 1e-12, (seed, row, name)
            assert abs(got.a - 1.1 * want["a"]) > 4 * stderr[0]  # the test can tell a 10 % error in a apart


def test_rows_the_points_cannot_fit_are_named_with_why() -> None:
    line = [Timing("prepare_dh", depth=float(d), u=32.0, ms=0.01 * d) for d in (4, 8, 16, 32)]  # u never varies
    two = [Timing("recompute_h", depth=4.0, u=16.0, ms=0.1), Timing("recompute_h", depth=8.0, u=32.0, ms=0.2)]
    fit = fit_coefficients([*line, *two, *synthetic({"fused_bwd": TRUE["fused_bwd"]}, noise=0.0)])
    assert set(fit.rows) == {"fused_bwd"}
    assert "rank 2" in fit.unfitted["prepare_dh"] and "needs 3 points off one line" in fit.unfitted["prepare_dh"]
    assert fit.unfitted["recompute_h"].startswith("2 timing(s)")
    with pytest.raises(ValueError, match="row fused_bwd: a timing must be finite"):
        fit_coefficients([Timing("fused_bwd", 4.0, 16.0, float("nan"))])


def test_csv_round_trips_the_fit_by_the_documented_format() -> None:
    fit = fit_coefficients(synthetic(TRUE, noise=NOISE_MS))
    text = coef_csv({r: f.coefs() for r, f in fit.rows.items()}, P=132, chunk=64, arch="sm90")
    assert text.splitlines()[0] == "kernel,a,b,c,P,chunk,arch"
    back = read_coef_csv(text, arch="sm90")
    assert (back["P"], back["chunk"], back["arch"]) == (132, 64, "sm90")
    assert flat(back["kernels"]) == pytest.approx(flat({r: f.coefs() for r, f in fit.rows.items()}), rel=1e-9)
    with pytest.raises(ValueError, match="fused_fwd_dv32"):
        coef_csv({"prepare_h": TRUE["prepare_h"]}, P=132, chunk=64, arch="sm90")  # FlashQLA would refuse it
    with pytest.raises(ValueError, match="twice"):
        read_coef_csv(text + text.splitlines()[1] + "\n")
    with pytest.raises(ValueError, match="fitted for 'sm90', not 'sm100'"):
        read_coef_csv(text, arch="sm100")


@pytest.mark.skipif(flash_qla_loader() is None, reason="flash_qla is not installed: the documented-format test covers it")
def test_csv_round_trips_through_flash_qlas_own_loader(tmp_path: Path) -> None:
    fit = fit_coefficients(synthetic(TRUE, noise=NOISE_MS))
    path = tmp_path / "sm90.csv"
    path.write_text(coef_csv({r: f.coefs() for r, f in fit.rows.items()}, P=132, chunk=64, arch="sm90"))
    load = flash_qla_loader()
    assert load is not None
    theirs = load(str(path), arch="sm90")
    assert (theirs["P"], theirs["chunk"], theirs["arch"], theirs["backend"]) == (132, 64, "sm90", "hopper")
    assert flat(theirs["kernels"]) == pytest.approx(flat({r: f.coefs() for r, f in fit.rows.items()}), rel=1e-9)
    assert theirs["kernels"] == read_coef_csv(path.read_text())["kernels"]


@pytest.mark.skipif(flash_qla_autocp() is None, reason="flash_qla is not installed: its features are FlashQLA's own")
@pytest.mark.parametrize("train", [False, True], ids=["fwd", "fwd+bwd"])
@pytest.mark.parametrize("splits", ["all", "decide"])
def test_benchmark_shapes_give_every_row_points_off_one_line(train: bool, splits: str) -> None:
    """The shapes benchmarks/flash_qla_coefs.py times (one head count: one TileLang compile per launch variant),
    under FlashQLA's own features (`struct_features`, `launch_config`, on a 132-SM Hopper): every row of the
    direction gets a rank-3 design, the correction rows thanks to the two-sequence shapes (one sequence alone
    would not). With the split sizes around FlashQLA's own decision (`splits_around` its `decide` with the shipped
    coefficients, as `decided_splits` calls it but without the gate) at 32K and 128K, every row but the fused forward's V tile 64 (no
    decision there prices it) gets one too."""
    import importlib

    autocp = flash_qla_autocp()
    assert autocp is not None
    utils, launch = (importlib.import_module(f"{autocp.__name__}.{m}") for m in ("utils", "launch"))
    T = (8192, 32768, 131072) if splits == "all" else (32768, 131072)
    shapes = [(t,) for t in T] + [(16384, 16384), (65536, 65536)]
    shipped = autocp.load_coefs(arch="sm90")

    def sizes(chunks: list[int]) -> list[int]:
        if splits == "all":
            return split_sizes(max(chunks), utils.MIN_LCP)
        d = autocp.decide(num_chunks=chunks, num_v_heads=16, coefs=shipped, P=132, chunk=64, is_train=train, debug=True)
        return splits_around(max(chunks), (d["lcp"], d["best_cp_lcp"]), (S for S, _ in d["sweep"]), utils.MIN_LCP)

    def timings(seqs: list[tuple[int, ...]]) -> list[Timing]:
        out = []
        for lengths in seqs:
            for lb in (-5.0, -0.05):
                chunks = [n // 64 for n in lengths]
                warmups = utils.warmup_from_gate_avg([lb / 2] * 16, 64)  # lb * sigmoid(x) averages lb / 2
                for S in sizes(chunks):
                    f = utils.struct_features(chunks, S, 16, 132, warmups, train, backend="hopper")
                    kernels = ["fused_fwd", *(["recompute_h", "fused_bwd"] if train else [])]
                    if f.enable_cp:
                        kernels += ["prepare_h", "correct_h0", *(["prepare_dh", "correct_dht"] if train else [])]
                    for k in kernels:
                        row = launch.launch_config("hopper", k, f.shape).row
                        out.append(Timing(row, f.depth[k], f.u, predict_ms(TRUE.get(row, TRUE["prepare_h"]), f.depth[k], f.u)))
        return out

    want = set(utils.INFER_KERNELS if not train else utils.KERNELS)
    fit = fit_coefficients(timings(shapes))
    assert not fit.unfitted and {r.rsplit("_dv", 1)[0] for r in fit.rows} == want
    untimed = {"fused_fwd_dv64"} if splits == "decide" else set()
    assert set(launch.coef_rows("hopper", want)) - untimed == set(fit.rows)
    single = fit_coefficients(timings(shapes[: len(T)]))
    assert "correct_h0_dv128" in single.unfitted and "rank 2" in single.unfitted["correct_h0_dv128"]


def _device(shipped: dict[str, dict[str, float]]) -> FlashQLADevice:
    return FlashQLADevice(arch="sm90", backend="hopper", P=132, chunk=64, shipped=shipped, shipped_text="shipped",
                          version="0.1.3")  # fmt: skip


def _refit() -> TuneResult:
    """What `tune_flash_qla` returns for the synthetic timings of every row but correct_dht (timed at no split)
    against shipped coefficients off by 20 %."""
    shipped = {r: {k: v * 1.2 for k, v in c.items()} for r, c in TRUE.items()}
    shipped["correct_dht_dv128"] = {"a": 0.0035, "b": 8.4e-06, "c": 0.0061}
    timed = [(t, int(t.depth), Shape(T=65536, H=16)) for t in synthetic(TRUE, noise=0.0)]
    return TuneResult(
        device_name="NVIDIA H200",
        compute_capability="9.0",
        kernels=tuple(coef_results(timed, TuneSpec(direction="fwd+bwd", samples=5), _device(shipped))),
    )


def test_fit_results_keep_the_shipped_rows_they_cannot_refit() -> None:
    result = _refit()
    by_row = {k.kernel.removeprefix(FLASH_QLA_PREFIX): k for k in result.kernels}
    assert set(by_row) == {*TRUE, "correct_dht_dv128"}
    fused = by_row["fused_fwd_dv128"]
    assert fused.config["source"] == "fit" and fused.config["a"] == pytest.approx(TRUE["fused_fwd_dv128"]["a"], rel=1e-9)
    assert fused.config["shipped"]["a"] == pytest.approx(1.2 * TRUE["fused_fwd_dv128"]["a"])
    assert fused.config["rms_ms"] < 1e-9 < fused.config["shipped_rms_ms"]  # the refit predicts its timings better
    assert len(fused.trials) == len(design()) and fused.key == {"arch": "sm90", "P": 132, "chunk": 64}
    kept = by_row["correct_dht_dv128"]
    assert kept.config["source"] == "shipped" and kept.config["a"] == 0.0035 and kept.trials == ()
    assert "not timed" in kept.config["why"] and kept.median_ms == 0.0


def test_store_then_cli_export_writes_flash_qlas_csv_apart_from_our_json(tmp_path: Path) -> None:
    from db import crud
    from db.migrate import upgrade
    from db.session import dispose_engine, session_scope
    from runners.cli import app
    from runners.tuner.export import build_export

    url = f"sqlite:///{tmp_path / 'cpbench.db'}"
    upgrade(url)
    result = _refit()
    try:
        with session_scope(url) as s:
            crud.store_tuning(s, result=result)
        with session_scope(url) as s:
            assert len(crud.list_trials(s, kernel=FLASH_QLA_PREFIX + "fused_bwd")) == len(design())
            text = csv_from_rows(crud.list_tuned_configs(s), device_name=None)
            with pytest.raises(ValueError, match="no tuned configs to export"):
                build_export(s)  # our autotune JSON never carries FlashQLA's coefficients
        out = tmp_path / "refit" / "sm90.csv"
        res = CliRunner().invoke(app, ["configs", "export", "--format", "flash_qla", "-o", str(out), "--db", url])
        assert res.exit_code == 0, res.output
        assert "7 FlashQLA coefficient rows (sm90, P=132)" in res.output and "no environment variable" in res.output
        assert out.read_text() == text
        back = read_coef_csv(text, arch="sm90")["kernels"]
        assert list(back)[: len(REQUIRED_ROWS["sm90"])] == list(REQUIRED_ROWS["sm90"])  # FlashQLA's own row order
        assert back["fused_bwd"] == pytest.approx(TRUE["fused_bwd"], rel=1e-9)
        assert back["correct_dht_dv128"] == {"a": 0.0035, "b": 8.4e-06, "c": 0.0061}
        res = CliRunner().invoke(app, ["configs", "export", "--format", "flash_qla", "-o", "-", "--db", url])
        assert res.exit_code == 0 and res.output == text
    finally:
        dispose_engine(url)


def test_tune_backend_flash_qla_without_a_gpu_is_one_line(tmp_path: Path) -> None:
    from db.migrate import upgrade
    from db.session import dispose_engine
    from runners.cli import main

    url = f"sqlite:///{tmp_path / 'cpbench.db'}"
    upgrade(url)

    def refusal(*args: str) -> str:
        err = io.StringIO()
        with contextlib.redirect_stderr(err), pytest.raises(SystemExit) as exc:
            main(["tune", "--backend", "flash_qla", *args, "--db", url])
        assert exc.value.code == 1 and len(err.getvalue().strip().splitlines()) == 1, err.getvalue()
        return err.getvalue()

    try:
        assert "no CUDA device" in refusal("--op", "gdn", "--shape", "T=8192,H=16")
        assert "GDN only" in refusal("--op", "kda", "--shape", "T=8192,H=16")
        assert "K=V=128 only" in refusal("--op", "gdn", "--shape", "T=8192,H=16,K=64,V=64")
        assert "B=1" in refusal("--op", "gdn", "--shape", "B=2,T=8192,H=16")
        assert "--flash-qla-splits must be one of decide, all" in refusal(
            "--op", "gdn", "--shape", "T=8192,H=16", "--flash-qla-splits", "every"
        )
    finally:
        dispose_engine(url)
