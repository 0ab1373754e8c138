"""The suite's vocabulary, standard library only: names and plain-fact counts that the web process, the spec, the
dashboards and the kernels share without importing torch.

- `OPS`, `BACKENDS` (every backend name `kernels.forward` takes), `BENCHMARKED_BACKENDS` (the contenders a
  sweep times), `OUR_BACKENDS` (ours, not peers), `PEER_BACKENDS` (the built-in peers among them), `LAYOUTS`;
- `MODES` (the CP scheme registry's keys, in its order; `kernels.cp.MODES` maps them to their modules),
  `MODE_OPTIONS` (each mode's option defaults), `SINGLE_DEVICE`, `EXACT_MODES` / `APPROXIMATE_MODES`,
  `HAND_BACKWARD` / `AUTOGRAD_MODES` (how a mode trains);
- `KEEP_POLICIES` and `BACKEND_OPTIONS` (our backends' own options: triton's recompute policy);
- two direction concepts: `POINT_DIRECTIONS` (what a point may ask for: the forward, or the training step) and
  `PHASES` (what a profile splits a step into); `COUNTED_DIRECTIONS` are both, the directions collectives are
  counted for;
- `DTYPE_BYTES` (dtype name -> bytes per element) and `DTYPES` (the names; `runners.workload.TORCH_DTYPES` maps
  them to torch dtypes);
- `collective_count(mode, ...)`: the collectives one step of a mode issues on one rank, from plain facts (the
  crossing facts of the partition come from `kernels.cp.CPContext` in `kernels.cp.expected_collectives`);
  `tail_exchange_options(options)` resolves that mode's options.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from types import MappingProxyType
from typing import Any

__all__ = [
    "APPROXIMATE_MODES",
    "AUTOGRAD_MODES",
    "BACKEND_OPTIONS",
    "BACKENDS",
    "BENCHMARKED_BACKENDS",
    "AUTO_BWD_GRADS",
    "AUTO_BWD_WARM",
    "AUTO_KEEP",
    "AUTO_REVERSE_MIN_TOKEN_HEADS",
    "AUTO_FWD_PATH",
    "BWD_GRADS",
    "REVERSE_WALKS",
    "FWD_PASSES",
    "AG_PASSES",
    "COUNTED_DIRECTIONS",
    "DTYPES",
    "DTYPE_BYTES",
    "EXACT_MODES",
    "HAND_BACKWARD",
    "KEEP_POLICIES",
    "LAYOUTS",
    "MODES",
    "MODE_OPTIONS",
    "OPS",
    "OUR_BACKENDS",
    "PEER_BACKENDS",
    "PHASES",
    "POINT_DIRECTIONS",
    "REGRESS_RUN_TAG",
    "SINGLE_DEVICE",
    "TAIL_EXCHANGE_FALLBACKS",
    "TAIL_EXCHANGE_WINDOW_CHUNKS",
    "collective_count",
    "regress_run",
    "tail_exchange_options",
]

OPS: tuple[str, ...] = ("gdn", "kda")
# every backend `kernels.forward` takes; "reference" (per-token fp32) is the correctness yardstick, "auto" picks
BACKENDS: tuple[str, ...] = ("reference", "torch", "triton", "fla", "auto")
# the backends a sweep benchmarks (peer plugins come on top: runners.plugins)
BENCHMARKED_BACKENDS: tuple[str, ...] = ("torch", "triton", "fla", "fla_dispatch", "flash_qla", "flash_kda")
OUR_BACKENDS: tuple[str, ...] = ("torch", "triton")  # our implementations (not peers): one library, "ours"
# the built-in peers (runners.peers): FLA's Triton path pinned, FLA as its dispatch picks, FlashQLA, FlashKDA
PEER_BACKENDS: tuple[str, ...] = ("fla", "fla_dispatch", "flash_qla", "flash_kda")
LAYOUTS: tuple[str, ...] = ("contiguous", "zigzag")
# the tag on every sweep one `cpbench regress` invocation submits, followed by the run's id (the CLI's status and the
# dashboards show a run's sweeps as one row)
REGRESS_RUN_TAG = "regress-run:"


def regress_run(tags: Sequence[str] | None) -> str | None:
    """The regression run a sweep belongs to (the id after its `REGRESS_RUN_TAG` tag), or None."""
    return next((t[len(REGRESS_RUN_TAG) :] for t in tags or () if t.startswith(REGRESS_RUN_TAG)), None)


TAIL_EXCHANGE_FALLBACKS: tuple[str, ...] = ("none", "true_cp")
TAIL_EXCHANGE_WINDOW_CHUNKS = 2  # tail_exchange's window (chunks of 64 tokens) under `window: auto`
_CHUNK = 64  # the kernels' chunk size (kernels.cp.intra.CHUNK), named in tail_exchange's option errors

# the CP schemes (DESIGN §2) in the registry's order, each with its option defaults (kernels.cp.forward's `options`)
MODE_OPTIONS: Mapping[str, Mapping[str, Any]] = MappingProxyType({
    "none": MappingProxyType({"segment_len": None}),
    "headwise": MappingProxyType({"segment_len": None}),
    "all_gather": MappingProxyType({"segment_len": None}),
    "ring": MappingProxyType({}),
    "true_cp": MappingProxyType({"segment_len": "auto"}),
    "warmup_correct": MappingProxyType({"segments": "auto", "tol": 1e-3, "window": "auto", "fallback": "auto"}),
    "tail_exchange": MappingProxyType({"window": "auto", "fallback": "none"}),
})
MODES: tuple[str, ...] = tuple(MODE_OPTIONS)
# the modes that run on one device (W must be 1)
SINGLE_DEVICE: tuple[str, ...] = ("none", "warmup_correct")
# exact: equal to the one-device forward up to rounding; approximate: within a tolerance (warmup windows)
EXACT_MODES: tuple[str, ...] = ("none", "headwise", "all_gather", "ring", "true_cp")
APPROXIMATE_MODES: tuple[str, ...] = tuple(m for m in MODES if m not in EXACT_MODES)
# schemes that move computed states: their backward is written by hand (kernels.cp.step_grad); the others train
# through plain autograd (the differentiable op + kernels.cp.comm_grad)
HAND_BACKWARD: tuple[str, ...] = ("ring", "true_cp", "tail_exchange")
# the schemes whose training step is the differentiable op (`kernels.dispatch.ChunkFunction`) under plain autograd,
# so the triton backend's recompute policy applies to them; warmup_correct and HAND_BACKWARD run their forward
# without autograd and call the chunked backward, which recomputes
AUTOGRAD_MODES: tuple[str, ...] = tuple(m for m in MODES if m not in (*HAND_BACKWARD, "warmup_correct"))

# the triton backend's recompute policies (what its forward keeps for the backward), the default first: "auto" (AUTO_KEEP's
# choice per op), then the policies; "ag+states": "ag" and the chunk states of GDN's fused forward
# (`kernels.ops.gdn.fused`); the last one keeps the most (FLA's disable_recompute)
KEEP_POLICIES: tuple[str, ...] = ("auto", "inputs", "ag", "ag+states", "wy", "wy+states")
# the backward's gradient kernels: "auto" (the default: AUTO_BWD_GRADS's choice per op), chunk_bwd_dqk + wy_bwd, or one
# kernel per chunk (`kernels.common.dqk_wy_bwd`). (Session 13's "fused_dh", the reverse pass's last walk fused in, was
# removed in session 16: 1.86x slower than what it replaced on the H200, its ds_mem variant crashed; kernels/NOTES.md);
# "reverse": GDN's TileLang reverse walk from the forward's Ag (`kernels.ops.gdn.reverse_bwd`: Hopper, K = V = 128,
# chunk 64; no dh or dv_new through memory, the reverse state pass's last walk fused in; "auto" takes it for long
# bf16 steps, AUTO_REVERSE_MIN_TOKEN_HEADS below)
# (Session 27's "stages", the same walk in lockstep stages, was removed in session 30: 1.75x the shipped walk's time on
# the H200, session 29)
# "tilelang": KDA's backward from the forward's kept gated Ag on two chunk-parallel TileLang kernels
# (`kernels.ops.kda.ag_bwd.tilelang_grads`: the state products, then the decayed products and the finish; session 30;
# any layout since session 31; "auto" takes them for KDA where they run since session 33: the step 0.66x FLA's at
# 1x64K on an H100, `kernels.ops.kda.ag_bwd.KDA_TILELANG_GRADS_AUTO`)
BWD_GRADS: tuple[str, ...] = ("auto", "pair", "fused", "reverse", "tilelang")
# the values that run GDN's TileLang reverse walk
REVERSE_WALKS: frozenset[str] = frozenset({"reverse"})
# the forward's state+output pass (and the reverse walk's state recompute) of GDN's two-kernel forward: "auto" (the
# default: the TileLang walk `kernels.ops.gdn.fwd_walk` in bf16 where it runs: Hopper, K = V = 128, chunk 64, tilelang
# installed; else Triton), "triton" (`kernels.ops.gdn.fused`'s pass, `kernels.common.chunk_state.chunk_state_ag_fwd`)
# or "tilelang" (the walk, refused in one line where it cannot run). KDA's two-kernel forward too (session 28: the
# walk's gated build on the Ag pass's gated form; "auto" takes it since session 29, `fwd_walk.KDA_WALK_AUTO`). H200,
# session 25
# (benchmarks/results/fwd_walk_lab_s25_h200.md, kernels_train_issue26_s25_h200.md): the output pass 0.79 -> 0.53 ms and
# the state recompute 0.69 -> 0.42 at 1x64K on the same ranges; the 1x64K step 3.95 ms (fwd_pass "triton", device
# call 2) -> 3.56 (call 4; FlashQLA CP 2.49 there)
FWD_PASSES: tuple[str, ...] = ("auto", "triton", "tilelang")
# the two-kernel forward's first kernel, the Ag pass (GDN's `kernels.ops.gdn.wy_ag.wy_gdn_ag`, KDA's
# `kernels.ops.kda.wy_ag.wy_kda_ag`): "auto" (the default: Triton until the TileLang kernels are checked and timed on
# an H200, `kernels.ops.gdn.ag_hopper.AG_HOPPER_AUTO`, `kernels.ops.kda.ag_hopper.KDA_AG_HOPPER_AUTO`), "triton" or
# "tilelang" (`kernels.ops.gdn.ag_hopper`, `kernels.ops.kda.ag_hopper` (bf16): Hopper, K = V = 128, chunk 64, tilelang
# installed; refused in one line where it cannot run)
AG_PASSES: tuple[str, ...] = ("auto", "triton", "tilelang")
# `kernels.common.chunk_fwd`'s "auto" forward path per op: "fused" (the two-kernel forward), "wy", or "walk" (the
# two-kernel forward where its state+output pass runs on the TileLang walk under the plan's `fwd_pass`, else the WY
# path). From the H200: KDA's two-kernel forward on Triton is no faster than its WY path (session 11,
# kda_fused_lab_h200.md: 10.38 vs 10.49 ms at 1x128K; its step's first-call peak rose 898 -> 1124 MiB); on the walk
# it is (session 29, kda_fused_lab_s29_h200.md: 8.84 ms at 1x128K, the state+output launch 0.86 ms against the
# Triton gated pass's 2.20; 4.36 vs 5.11 at 8x8K), and its kept gated Ag makes the step 0.86x FLA's (AUTO_KEEP)
AUTO_FWD_PATH: Mapping[str, str] = MappingProxyType({"gdn": "fused", "kda": "walk"})
# `LaunchPlan.bwd_grads` "auto" per op, from the H200 (session 11, benchmarks/results/bwd_ag_lab_h200.md,
# dqk_wy_lab_h200.md): GDN's training step at 1x64K 8.97 -> 8.70 ms and its peak 4616 -> 3336 MB with the fused
# kernel; KDA's step 29.6 -> 32.1 ms (slower). KDA's "auto" takes "tilelang" first where it runs (session 33,
# `kernels.ops.kda.ag_bwd.grads_mode`); "pair" is what runs elsewhere and while those kernels build
AUTO_BWD_GRADS: Mapping[str, str] = MappingProxyType({"gdn": "fused", "kda": "pair"})
# ... except that GDN's "auto" takes the TileLang reverse walk ("reverse") from the kept Ag (keep "ag", the default, or
# "ag+states") in bf16 where the kernel runs (`kernels.ops.gdn.reverse_bwd.reverse_bwd_refusal`: Hopper, K = V = 128,
# chunk 64, tilelang installed) and the step has at least this many tokens x value heads (session 24, H200,
# benchmarks/results/bwd_ag_lab_s24_h200.md, one process: fused / reverse 1.52 / 2.70 ms at 1x8K, 2.20 / 2.61 at
# 1x16K, 3.57 / 3.09 at 1x32K with 16 heads; the short steps wait on the host, and the reverse path issues more)
AUTO_REVERSE_MIN_TOKEN_HEADS = 32768 * 16
# `LaunchPlan.bwd_warm` None (the default) per op: the reverse state pass's gate-certified warm window in chunks
# (`kernels.common.warm_bwd`), from the H200 (session 12, benchmarks/results/bwd_warm_h200.md): GDN's training step
# 8.67 -> 7.85 ms at 1x64K (1x128K, 8x8K in the same file), gradients unchanged, every window certified at lb -1; KDA's
# 12.57 -> 12.17 ms at 1x32K (session 13, benchmarks/results/kda_bwd_warm_h200.md), every window certified,
# gradients identical to the exact pass's
AUTO_BWD_WARM: Mapping[str, int] = MappingProxyType({"gdn": 4, "kda": 4})
# `LaunchPlan.keep` "auto" (the default) per op, from the H200 (session 18, benchmarks/results/host_bound_lab_h200.md,
# kernels_train_issue26_s18b_h200.md, _s18c_): GDN's forward keeps its Ag pass's outputs (what FLA's forward holds: 132 B per
# token and value head) and its backward forms w, u, Aqk, T from them in one launch instead of the WY prep and the
# inverse. KDA too (session 29, benchmarks/results/kernels_train_issue26_s29k_h200.md, one process with FLA's
# chunk_kda, HV 16, lb -1): on its two-kernel forward (where the walk runs, AUTO_FWD_PATH "walk") "ag" keeps the
# gated Ag pass's outputs and the backward forms w, u from them (`kernels.ops.kda.ag_bwd`: no WY prep): the step
# 22.60 -> 19.26 ms at 1x64K (FLA 22.49; 0.86x), 21.97 -> 18.69 at 8x8K (FLA 20.37; 0.92x), held 1032 MB against
# "inputs"' 1160, peak 5778 MB (FLA 7192); on the WY path "ag" keeps nothing (as "inputs")
AUTO_KEEP: Mapping[str, str] = MappingProxyType({"gdn": "ag", "kda": "ag"})
# our backends' own options (`mode_options: {triton: {keep: wy+states}}`): backend -> name -> values, default first
BACKEND_OPTIONS: Mapping[str, Mapping[str, tuple[str, ...]]] = MappingProxyType({"triton": {"keep": KEEP_POLICIES}})

# what a point may ask for: the forward step, or the training step (forward, then backward)
POINT_DIRECTIONS: tuple[str, ...] = ("fwd", "fwd+bwd")
# what a profile splits a training step into (runners.profile's record_function ranges)
PHASES: tuple[str, ...] = ("fwd", "bwd")
# the directions collectives are counted for: a phase alone or a point's whole step
COUNTED_DIRECTIONS: tuple[str, ...] = ("fwd", "bwd", "fwd+bwd")

DTYPE_BYTES: Mapping[str, int] = MappingProxyType({"float32": 4, "bfloat16": 2, "float16": 2})
DTYPES: tuple[str, ...] = tuple(DTYPE_BYTES)


def tail_exchange_options(options: Mapping[str, Any]) -> tuple[int, str]:
    """(window chunks, fallback) from tail_exchange's full options; ValueError naming the bad option."""
    window, fallback = options["window"], options["fallback"]
    if window == "auto":
        window = TAIL_EXCHANGE_WINDOW_CHUNKS
    if isinstance(window, bool) or not isinstance(window, int) or window < 1:
        raise ValueError(f"option window must be 'auto' or an int >= 1 (chunks of {_CHUNK} tokens), got window={window!r}")
    if fallback not in TAIL_EXCHANGE_FALLBACKS:
        raise ValueError(f"option fallback must be one of {TAIL_EXCHANGE_FALLBACKS}, got fallback={fallback!r}")
    return window, fallback


def collective_count(mode: str, *, crossing: bool, sends: int, recvs: int, options: Mapping[str, Any] | None = None,
                     direction: str = "fwd") -> dict[str, int]:
    """Collectives one step of `mode` issues on one rank: keys all_to_all, all_gather, reduce_scatter, send, recv
    (zeros omitted).

    The plain facts of the partition: `crossing` (a sequence crosses a part boundary), `sends` / `recvs` (the
    forward's point-to-point hand-offs this rank posts: states for ring, tail windows for tail_exchange; the
    same count). `options`: the mode options where they change the count (tail_exchange's `fallback`).
    `direction`: one of COUNTED_DIRECTIONS; the backward of headwise is 2 all-to-alls, of all_gather 1
    reduce-scatter, of true_cp 1 all-gather (when a sequence crosses), of ring and tail_exchange the forward's
    send/recv pairs reversed (kernels/cp/README.md §7); "fwd+bwd" is their sum, kind by kind.
    """
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got mode={mode!r}")
    if direction not in COUNTED_DIRECTIONS:
        raise ValueError(f"direction must be one of {COUNTED_DIRECTIONS}, got direction={direction!r}")
    if direction == "fwd+bwd":
        f, b = (collective_count(mode, crossing=crossing, sends=sends, recvs=recvs, options=options, direction=d)
                for d in PHASES)
        return {k: f.get(k, 0) + b.get(k, 0) for k in sorted({*f, *b})}
    bwd = direction == "bwd"
    if mode == "tail_exchange":
        _, fallback = tail_exchange_options({**MODE_OPTIONS[mode], **(options or {})})
        mode = "true_cp" if fallback == "true_cp" else "ring"  # its windows go where ring's states go
    if mode == "headwise":
        return {"all_to_all": 2}
    if mode == "all_gather":
        return {"reduce_scatter": 1} if bwd else {"all_gather": 1}
    if mode == "true_cp":
        return {"all_gather": 1} if crossing else {}
    if mode == "ring":
        return _p2p(recvs, sends) if bwd else _p2p(sends, recvs)
    return {}


def _p2p(sends: int, recvs: int) -> dict[str, int]:
    return {k: n for k, n in (("send", sends), ("recv", recvs)) if n}
