"""`cpbench tune --backend fla --direction fwd+bwd`: FLA's tuner times FLA's training step (forward +
`o.backward(do)`, fresh leaves each call, the `fla` peer's Hopper-guard context around it), and refuses a GDN
backward that FLA's guard forbids here unless opted in, with FLA's reason on one line.

FLA's kernels do not run under the CPU interpreter (its fwd_h kernel), so the step is composed here around a
stand-in for FLA's forward: our torch backend's differentiable forward, whose gradients autograd checks directly.
The guard is FLA's real flag (`fla.ops.common.chunk_o.TRITON_ABOVE_3_7_1`), observed during and after the step."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

from tests.utils.cli import cpbench as _cli

HAS_FLA = importlib.util.find_spec("fla") is not None
SHAPE = {"B": 1, "T": 80, "H": 2, "K": 16, "V": 16, "dtype": "float32", "initial_state": True}


@pytest.mark.skipif(not HAS_FLA, reason="needs fla-core (requirements-ci.txt installs it)")
def test_fla_training_step_runner(monkeypatch: pytest.MonkeyPatch) -> None:
    import fla.ops.common.chunk_o as chunk_o

    import kernels
    from kernels import backends
    from runners.tuner.fla import _fla_runner
    from runners.tuner.tune import Shape, make_case

    seen: list[bool] = []

    def stand_in(op, q, k, v, g, beta, *, scale, initial_state, output_final_state, cu_seqlens, cu_seqlens_cpu=None):
        seen.append(chunk_o.TRITON_ABOVE_3_7_1)  # the guard flag while FLA's op would run
        return kernels.forward(op, q, k, v, g, beta, scale=scale, initial_state=initial_state,
                               output_final_state=output_final_state, cu_seqlens=cu_seqlens, backend="torch")

    monkeypatch.setattr(backends, "fla_forward", stand_in)
    case = make_case("gdn", Shape.of(SHAPE), "cpu")
    monkeypatch.setattr(chunk_o, "TRITON_ABOVE_3_7_1", False)  # the guarded case (Hopper, Triton < 3.7.1)
    run = _fla_runner("gdn", case, "fwd+bwd", {"bypass_hopper_guard": True})
    got = run()
    assert seen == [True] and not chunk_o.TRITON_ABOVE_3_7_1  # lifted inside the step only
    assert len(got) == 8  # o, final state, dq, dk, dv, dg, dbeta, dh0

    xs = [case[n].detach().clone().requires_grad_() for n in ("q", "k", "v", "g", "beta", "initial_state")]
    o, ht = kernels.forward("gdn", *xs[:5], scale=SHAPE["K"] ** -0.5, initial_state=xs[5], output_final_state=True,
                            backend="torch")
    o.backward(case["do"])
    for name, a, b in zip(("o", "ht", "dq", "dk", "dv", "dg", "dbeta", "dh0"), got,
                          [o.detach(), ht.detach(), *(x.grad for x in xs)], strict=True):
        assert torch.allclose(a, b, rtol=1e-6, atol=1e-7), name
    again = run()  # fresh leaves: gradients do not accumulate across calls
    for a, b in zip(got[2:], again[2:], strict=True):
        assert torch.equal(a, b)
    assert _fla_runner("gdn", case, "fwd")()[0].shape == o.shape  # the forward runner is unchanged


@pytest.mark.skipif(not HAS_FLA, reason="needs fla-core (requirements-ci.txt installs it)")
def test_tune_fla_checks_direction_and_guard_first() -> None:
    from runners.peers.fla import HOPPER_GUARD, triton_version
    from runners.tuner import TuneSpec
    from runners.tuner.fla import tune_fla

    with pytest.raises(ValueError, match=r"^direction must be one of fwd, fwd\+bwd, got 'bwd'$"):
        tune_fla(op="kda", shapes=[SHAPE], device="cpu", spec=TuneSpec(direction="bwd"))
    tv = triton_version()
    if tv is not None and HOPPER_GUARD[0] <= tv < HOPPER_GUARD[1]:  # CI's Triton (3.6): FLA's guard applies
        with pytest.raises(ValueError, match=r"FLA refuses the GDN backward on Hopper.*--fla-bypass-hopper-guard"):
            tune_fla(op="gdn", shapes=[SHAPE], device="cpu", spec=TuneSpec(direction="fwd+bwd"))
    # opted in (or KDA, which FLA does not guard), the next check is the device's
    for op, opts in (("gdn", {"bypass_hopper_guard": True}), ("kda", None)):
        with pytest.raises(ValueError, match="needs a CUDA GPU"):
            tune_fla(op=op, shapes=[SHAPE], device="cpu", spec=TuneSpec(direction="fwd+bwd"), options=opts)


@pytest.mark.skipif(not HAS_FLA, reason="needs fla-core (requirements-ci.txt installs it)")
def test_cli_tune_fla_fwd_bwd_errors_are_one_line(tmp_path: Path) -> None:
    from runners.peers.fla import HOPPER_GUARD, triton_version

    url = f"sqlite:///{tmp_path / 'x.db'}"
    assert _cli("db", "upgrade", "--db", url)[0] == 0
    args = ["tune", "--backend", "fla", "--direction", "fwd+bwd", "--op", "gdn", "--shape", "B=1,T=64,H=1,K=16,V=16",
            "--device", "cpu", "--db", url]
    code, _, err = _cli(*args)
    tv = triton_version()
    want = ("--fla-bypass-hopper-guard" if tv is not None and HOPPER_GUARD[0] <= tv < HOPPER_GUARD[1]
            else "needs a CUDA GPU")
    assert code == 1 and want in err and len(err.strip().splitlines()) == 1, err
    code, _, err = _cli(*args, "--fla-bypass-hopper-guard")
    assert code == 1 and "needs a CUDA GPU" in err and len(err.strip().splitlines()) == 1, err
    code, _, err = _cli(*args, "--fla-bypass-hopper-guard", "--fla-min-gain", "0.6")
    assert code == 1 and "min_gain must be a fraction in [0, 0.5), got 0.6" in err and len(err.strip().splitlines()) == 1, err


def test_fla_tuner_keeps_flas_pick_unless_a_config_wins_by_the_min_gain() -> None:
    """One kernel's config moves FLA's whole op by less than the trial noise: a "winner" within `min_gain` of
    FLA's own pick is a coin toss (two H200 runs of KDA's training step picked opposite configs), so FLA's pick
    stays; a real gain replaces it. Configs are compared by identity, as the tuner pins Triton's objects."""
    from runners.tuner.fla import MIN_GAIN, winner

    own, a, b = object(), object(), object()
    assert MIN_GAIN == 0.01
    # 0.4 % faster than FLA's pick: within the noise, FLA's pick stays and the fastest is the runner-up
    assert winner([(2.8292, a), (2.8303, own), (2.85, b)], own, 2.8303) == (2.8303, own, 2.8292)
    # 2 % faster: a finding
    assert winner([(2.80, a), (2.86, own), (2.90, b)], own, 2.86) == (2.80, a, 2.86)
    # FLA's pick fastest; and a pick that was never measured (own_ms None) cannot be kept
    assert winner([(2.90, a), (2.86, own)], own, 2.86) == (2.86, own, 2.90)
    assert winner([(2.85, a), (2.90, b)], own, None) == (2.85, a, 2.90)
    assert winner([(2.85, a)], own, None) == (2.85, a, None)
    # min_gain=0 is the plain fastest
    assert winner([(2.8292, a), (2.8303, own)], own, 2.8303, min_gain=0.0) == (2.8292, a, 2.8303)
