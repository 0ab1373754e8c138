"""`kernels.first_call`: a call whose "auto" choices would take a TileLang kernel still building runs on Triton.

CPU tests (CI has no GPU and no TileLang, which is refused here): the plan resolution as pure functions; the mechanism
through the real `compile_ahead` and `dry_runs` with a launch sequence that asks for a real build (held by an event
until the test releases it) wherever its plan takes the "walk"; and the public op on the interpreter: a call made
while its kind waits runs the fallback plan, which its autograd node keeps for the backward after the build is done,
and the next call takes the plan. The GPU test (H200 with TileLang) checks the same on the real walks."""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Callable, Hashable, Iterator
from typing import Any

import pytest
import torch

import kernels
from kernels.builds import BUILDS, TILELANG_BUILD_ENV
from kernels.configs import LaunchConfig
from kernels.first_call import dry_runs, plan_for, resolve_plan, tilelang_fallback
from kernels.ops.gdn.fwd_walk import fwd_walk_refusal
from kernels.parallel_compile import PARALLEL_COMPILE_ENV, build_beside, compile_ahead
from kernels.plan import LaunchPlan, LaunchRecorder
from kernels.vocabulary import AUTO_BWD_GRADS
from tests.utils import TEST_DEVICE, make_inputs

LONG = 60.0  # s: generous; a held build is released long before
# the GPU test builds the walks: an H200 with tilelang (the refusal's reason as the skip's otherwise)
WALK_WHY = fwd_walk_refusal(128, 128, 64, torch.device("cuda")) if torch.cuda.is_available() else "no GPU"


def test_the_fallback_resolves_the_auto_options_only() -> None:
    rec = LaunchRecorder()
    plan = LaunchPlan(configs={"wy_gdn_ag": LaunchConfig(num_warps=2)}, keep="ag+states", bwd_warm=2, recorder=rec)
    fb = tilelang_fallback(plan, "gdn")
    assert (fb.fwd_pass, fb.ag_pass, fb.bwd_grads) == ("triton", "triton", AUTO_BWD_GRADS["gdn"]) == (
        "triton", "triton", "fused")  # fmt: skip
    assert (fb.keep, fb.bwd_warm, fb.recorder, dict(fb.configs)) == ("ag+states", 2, rec, dict(plan.configs))
    assert tilelang_fallback(LaunchPlan(), "kda").bwd_grads == "pair"  # the op's Triton kernels under "auto"
    explicit = LaunchPlan(fwd_pass="tilelang", ag_pass="tilelang", bwd_grads="reverse")
    assert tilelang_fallback(explicit, "gdn") is explicit  # explicit options never tier: they wait for their builds
    mixed = tilelang_fallback(LaunchPlan(fwd_pass="tilelang", bwd_grads="reverse"), "gdn")
    assert (mixed.fwd_pass, mixed.ag_pass, mixed.bwd_grads) == ("tilelang", "triton", "reverse")
    on_triton = LaunchPlan(fwd_pass="triton", ag_pass="triton", bwd_grads="pair")
    assert tilelang_fallback(on_triton, "gdn") is on_triton


def test_resolve_plan_takes_the_plan_once_its_builds_are_ready() -> None:
    plan = LaunchPlan()
    needs = frozenset({("fwd_walk", 16), ("reverse_bwd", 16)})
    assert resolve_plan(plan, "gdn", needs, {("fwd_walk", 16), ("reverse_bwd", 16), "other"}) is plan
    assert resolve_plan(plan, "gdn", frozenset(), set()) is plan
    for ready in (set(), {("fwd_walk", 16)}):
        got = resolve_plan(plan, "gdn", needs, ready)
        assert got == tilelang_fallback(plan, "gdn") and got.fwd_pass == "triton"
    explicit = LaunchPlan(fwd_pass="tilelang")
    assert resolve_plan(explicit, "gdn", needs, set()).fwd_pass == "tilelang"


class _Walk:
    """A call's launch sequence for `dry_runs`: wherever its plan takes the "walk" (fwd_pass "auto" / "tilelang") or
    the "reverse" walk (bwd_grads "auto" / "reverse"), it asks for that kernel's build (`build_beside`, as the
    TileLang launchers do), the build held until `release`. Records the plans it was dry-run under."""

    gates: list[threading.Event] = []  # every walk's, released after each test (`_released`)

    def __init__(self, fail: bool = False) -> None:
        self.tag = uuid.uuid4().hex  # build keys no other test submitted to the process's builds
        self.gate = threading.Event()
        self.gates.append(self.gate)
        self.fail = fail
        self.plans: list[LaunchPlan] = []

    def key(self, walk: str) -> tuple[str, str]:
        return (walk, self.tag)

    def build(self) -> None:
        assert self.gate.wait(LONG)
        if self.fail:
            raise RuntimeError("tvm.error.InternalError: the walk does not lower")

    def __call__(self, plan: LaunchPlan) -> None:
        self.plans.append(plan)
        if plan.fwd_pass in ("auto", "tilelang"):
            build_beside(self.key("fwd_walk"), self.build)
        if plan.bwd_grads in ("auto", "reverse"):
            build_beside(self.key("reverse_bwd"), self.build)

    def release(self) -> None:
        self.gate.set()
        assert BUILDS.wait([self.key("fwd_walk"), self.key("reverse_bwd")], timeout=LONG)


@pytest.fixture(autouse=True)
def _released() -> Iterator[None]:
    """A failing test leaves no build held (the process would wait for it at exit)."""
    yield
    for gate in _Walk.gates:
        gate.set()
    _Walk.gates.clear()


@pytest.fixture
def dry_run_on(monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[[Hashable, LaunchPlan, _Walk], None]]:
    """`first(kind, plan, walk)`: a first call's dry run of `kind` (`compile_ahead`, on for it: outside the
    interpreter, whose setting comes back after it)."""
    monkeypatch.setenv(PARALLEL_COMPILE_ENV, "1")
    monkeypatch.delenv(TILELANG_BUILD_ENV, raising=False)

    def first(kind: Hashable, plan: LaunchPlan, walk: _Walk) -> None:
        with monkeypatch.context() as m:
            m.delenv("TRITON_INTERPRET", raising=False)
            assert compile_ahead(kind, lambda: dry_runs(kind, "gdn", plan, walk))

    yield first


def test_a_kind_runs_on_triton_while_its_builds_run_then_takes_the_plan(dry_run_on: Any) -> None:
    walk, plan = _Walk(), LaunchPlan()
    kind = ("test_first_call", walk.tag)
    dry_run_on(kind, plan, walk)
    fallback = tilelang_fallback(plan, "gdn")
    assert walk.plans == [plan, fallback]  # both plans' launches dry-run (compiled) in the first call
    got = plan_for(kind, "gdn", plan)
    assert got == fallback and plan_for(kind, "gdn", plan) is got  # the fallback made once per plan object
    assert plan_for(("test_first_call", "another kind"), "gdn", plan) is plan
    walk.release()
    assert plan_for(kind, "gdn", plan) is plan
    assert compile_ahead(kind, lambda: dry_runs(kind, "gdn", plan, walk)) is False and len(walk.plans) == 2  # once


def test_wait_mode_waits_for_the_builds_in_the_first_call(dry_run_on: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(TILELANG_BUILD_ENV, "wait")
    walk, plan = _Walk(), LaunchPlan()
    kind = ("test_first_call", walk.tag)
    threading.Timer(0.1, walk.gate.set).start()
    dry_run_on(kind, plan, walk)
    assert walk.plans == [plan] and {walk.key("fwd_walk"), walk.key("reverse_bwd")} <= BUILDS.built
    assert plan_for(kind, "gdn", plan) is plan


@pytest.mark.parametrize("mode", ["background", "wait"])
def test_a_failed_build_keeps_its_kind_on_triton(dry_run_on: Any, monkeypatch: pytest.MonkeyPatch,
                                                 caplog: pytest.LogCaptureFixture, mode: str) -> None:  # fmt: skip
    monkeypatch.setenv(TILELANG_BUILD_ENV, mode)
    caplog.set_level(logging.WARNING, logger="kernels.builds")
    walk, plan = _Walk(fail=True), LaunchPlan()
    kind = ("test_first_call", walk.tag)
    if mode == "wait":
        threading.Timer(0.1, walk.gate.set).start()
    dry_run_on(kind, plan, walk)
    walk.release()
    fallback = tilelang_fallback(plan, "gdn")
    assert walk.plans == [plan, fallback]
    assert plan_for(kind, "gdn", plan) == fallback == plan_for(kind, "gdn", plan)  # for good
    logged = sorted(r.getMessage() for r in caplog.records if r.name == "kernels.builds")
    assert len(logged) == 2 and all("does not lower" in line for line in logged)  # the two keys, once each
    assert logged[0].startswith("the background build of fwd_walk failed") and "reverse_bwd" in logged[1]


def test_explicit_tilelang_options_never_tier(dry_run_on: Any) -> None:
    walk = _Walk()
    explicit = LaunchPlan(fwd_pass="tilelang", ag_pass="triton", bwd_grads="fused")
    dry_run_on(("test_first_call", walk.tag, "explicit"), explicit, walk)
    assert walk.plans == [explicit]  # no fallback: the call waits for the walk at its launch
    assert plan_for(("test_first_call", walk.tag, "explicit"), "gdn", explicit) is explicit
    mixed = LaunchPlan(fwd_pass="tilelang")  # the forward walk asked for, the reverse walk on "auto"
    kind = ("test_first_call", walk.tag, "mixed")
    dry_run_on(kind, mixed, walk)
    got = plan_for(kind, "gdn", mixed)
    assert (got.fwd_pass, got.bwd_grads) == ("tilelang", "fused")  # only "auto" went to Triton
    walk.release()
    assert plan_for(kind, "gdn", mixed) is mixed


def test_the_backward_runs_its_forwards_plan(dry_run_on: Any) -> None:
    """The public op while its kind waits: the forward and its autograd node run the fallback; the build finishes
    before the backward, which still runs the forward's plan; the next call takes the plan. (Interpreted on the CPU,
    where its first call's own dry run is off; on a GPU under CPBENCH_TEST_GPU=1 the dry run below is the kind's.)"""
    from kernels.common.index import prepare_chunk_index
    from kernels.dispatch import _call_kind
    from kernels.ops.gdn.chunk import GDN

    q, k, v, g, beta, _ = make_inputs("gdn", B=1, T=64, H=1, K=16, V=16, seed=3, device=TEST_DEVICE)
    leaves = [x.requires_grad_() for x in (q, k, v, g, beta)]
    plan = LaunchPlan(recorder=LaunchRecorder())
    index = prepare_chunk_index(None, batch=1, seq_len=64, chunk_size=64, device=k.device)
    kind = _call_kind((GDN, "triton", index, None, plan, 0.25, q, k, v, g, beta, None), True, False, False)
    walk = _Walk()
    dry_run_on(kind, plan, walk)  # the kind's first call found the walks not built (as on a GPU with TileLang)

    def step(o: torch.Tensor) -> list[torch.Tensor]:
        return list(torch.autograd.grad(o.square().sum(), leaves))

    o, _ = kernels.chunk_gdn(*leaves, backend="triton", plan=plan)
    kept = o.grad_fn.meta[4]  # what ChunkFunction keeps for the backward (`kernels.dispatch`)
    assert kept == tilelang_fallback(plan, "gdn") and kept.recorder is plan.recorder
    walk.release()
    assert plan_for(kind, "gdn", plan) is plan  # built: the next call takes the plan ...
    assert o.grad_fn.meta[4] is kept  # ... this call's backward still runs its forward's
    grads = step(o)
    o2, _ = kernels.chunk_gdn(*leaves, backend="triton", plan=plan)
    assert o2.grad_fn.meta[4] is plan
    for a, b in zip(grads, step(o2), strict=True):  # on the CPU both plans run the same Triton kernels
        assert torch.isfinite(a).all() and torch.equal(a, b)


@pytest.mark.gpu
@pytest.mark.skipif(WALK_WHY is not None, reason=str(WALK_WHY))
def test_the_first_call_runs_triton_while_the_walks_build_then_takes_them() -> None:
    """H200 with TileLang: a scale no other call used makes new builds of both walks (their build key holds it) and an
    initial state with the final state returned a kind of call no other test makes, so the first call of the kind runs
    on Triton (the builds take ~20 s, its Triton compiles a few); after `wait_for_builds` the next call runs the walks, and
    both steps' gradients agree within bf16 rounding."""
    torch.manual_seed(11)
    B, T, H, D = 1, 32768, 16, 128  # the reverse walk's "auto" threshold (AUTO_REVERSE_MIN_TOKEN_HEADS)
    q = torch.nn.functional.normalize(torch.randn(B, T, H, D, device="cuda"), dim=-1).bfloat16().requires_grad_()
    k = torch.nn.functional.normalize(torch.randn(B, T, H, D, device="cuda"), dim=-1).bfloat16().requires_grad_()
    v = torch.randn(B, T, H, D, device="cuda").bfloat16().requires_grad_()
    g = (-torch.sigmoid(torch.randn(B, T, H, device="cuda"))).requires_grad_()
    beta = torch.sigmoid(torch.randn(B, T, H, device="cuda")).bfloat16().requires_grad_()
    h0 = torch.randn(B, H, D, D, device="cuda").requires_grad_()
    scale = D**-0.5 * (1 + uuid.uuid4().int % 1000 * 1e-7)
    plan = LaunchPlan()

    def step() -> tuple[LaunchPlan, list[torch.Tensor]]:
        o, ht = kernels.chunk_gdn(q, k, v, g, beta, scale=scale, initial_state=h0, output_final_state=True,
                                  backend="triton", plan=plan)  # fmt: skip
        kept = o.grad_fn.meta[4]
        return kept, list(torch.autograd.grad(o.float().square().sum() + ht.sum(), (q, k, v, g, beta, h0)))

    first, grads = step()
    assert first == tilelang_fallback(plan, "gdn")  # the walks were building: on Triton, forward and backward
    assert kernels.wait_for_builds(timeout=600)
    second, grads2 = step()
    assert second is plan
    for a, b in zip(grads, grads2, strict=True):
        assert ((a.float() - b.float()).norm() / b.float().norm()).item() < 2e-2
