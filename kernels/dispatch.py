"""The one dispatch path of the chunked ops, validate -> backend -> op table, and their autograd Function.

    ChunkOp            one entry of the op table: what an op runs on each backend (its per-token reference, its
                       Triton forward and backward); `kernels/ops/<op>/chunk.py` defines it (`GDN`, `KDA`) and
                       `kernels.api.OPS` lists them by name
    run                every public forward (`kernels.forward`, `kernels.reference`, `kernels.chunk_gdn`,
                       `kernels.chunk_kda`): FLA's options parsed, the inputs validated (a ValueError before any launch),
                       the backend resolved; then `fla` runs FLA's own autograd op (every option passed on), the others
                       the in-op gate / beta / l2norm, grouped heads and the op's entry: `reference` autograd through
                       the per-token recurrence, `torch` / `triton` ChunkFunction, or `chunk_forward` alone when grad is
                       off (inference saves nothing)
    ChunkFunction      one `torch.autograd.Function` for both ops on the torch and triton backends (the op's entry
                       travels with the call): forward = `chunk_forward`, backward = `chunk_backward_impl`
    compile_ahead      (`kernels.parallel_compile`) the first triton call of a kind (`_call_kind`) compiles every kernel
                       of its forward and backward at once, in threads, from a dry run of its launches (`_launch_sequence`)
    first_call         (`kernels.first_call`) where that dry run asked for TileLang kernels that are not built yet, the
                       call's "auto" choices run on Triton (`plan_for`, once per call at the entry; the Function keeps
                       that plan for its backward) while they build in the background (CPBENCH_TILELANG_BUILD)

Recompute policy (`LaunchPlan.keep` of the call's launch plan, `kernels.plan`; triton backend), what the forward holds
until the backward:
    "auto"        (default) the op's policy in `kernels.vocabulary.AUTO_KEEP` (`LaunchPlan.keep_for`): "ag" for both
                  (session 18: GDN's step 8-9 % faster on the H200, its peak below FLA's at HV = H; session 29: KDA's
                  step 15 % faster where its forward runs on the TileLang walk, elsewhere as "inputs")
    "inputs"      the inputs (q, k, v, g, beta and the initial state) and, where the forward
                  splits the sequence (B*H small), its segments' entering states [NS, H, K, V] fp32 (~17 MB at
                  K = V = 128 whatever T is; `kernels.common.seqsplit.keep_segment_states`); the backward recomputes
                  the WY factors (w, u), the chunk states (from those segment states) and v_new
    "ag"          GDN: also its two-kernel forward's Ag = T diag(beta) [B, T, H, 64] (k's dtype) and gate cumsum
                  [B, T, H] fp32 (what FLA holds beyond its inputs: its T and gate cumsum); the backward forms w, u,
                  Aqk and T from them in one launch, then the chunk states from w, u and the segment states
                  (`kernels.ops.gdn.ag_bwd`: no WY prep, no inverse). Under the plan's bwd_warm also the q, k side
                  of the reverse windows' bound sums, [B, T, H] and [NT, H, 2] fp32 (`kernels.common.warm_bwd`: the
                  backward reads do alone for them). KDA: on its fused path ("auto" takes it where the TileLang walk
                  runs, else the WY path: `kernels.common.chunk_fwd.check_fwd_path`) its Ag pass's gated
                  outputs (Ag, Aqk [B, T, H, 64], qg, ke, kd [B, T, H, K] in k's dtype, G_C [NT, H, K] fp32); the
                  backward forms w, u from them in one launch (`kernels.ops.kda.ag_bwd`: no WY prep); on the WY path
                  as "inputs"
    "ag+states"   GDN: "ag" and the chunk states h, v_new that its fused output pass stores (STORE_STATES in the
                  output launch), with the maps of every segment from exact transitions, or after the warm split and
                  without maps under the plan's bwd_warm (`kernels.ops.gdn.fused`): the backward skips the state
                  recompute too (as many bytes as "wy+states"'s states). KDA: as "ag" (its chunk states recomputed)
    "wy"          also the WY factors (w, u, Aqk, the gate cumsum; KDA: the gated k and q): the backward skips the
                  WY prep, for [B, T, H, 2K + V + 64] (GDN: + [B, T, H] fp32; KDA: [B, T, H, 4K + V + 64] and
                  [NT, H, K] fp32) held per call
    "wy+states"   also the chunk states h [NT, H, K, V] and v_new [B, T, H, V] (k's dtype) and the maps of every
                  segment [NS, H, K, K] fp32: the backward skips the forward state pass and the transition pass
                  (per call 2.9x v's bytes more than "wy" at K = V = 128: 785 MB at T=64K, H=16; "wy" holds
                  2.4x v's bytes for GDN, 4.3x for KDA)
The figures of each policy on the H200 (time, the bytes held, the peak): `benchmarks/results/kernels_train_h200.md`,
`kernels_train_issue26_s18b_h200.md`, `host_bound_lab_h200.md`.
A caller passes it in its plan (`kernels.forward(..., plan=LaunchPlan(keep="wy"))`; ChunkFunction keeps the plan of
its forward for its backward); a sweep sets it per point with `mode_options: {triton: {keep: ...}}` (`TRITON_OPTIONS`,
the triton backend's options; runners.backend_options turns them into the point's plan).
Extra memory of the backward: O(chunks x H x K x V) (the chunk states and their gradients,
`kernels.common.chunk_bwd_torch`); never `[T, K, K]` or per-token states.
The final state's incoming gradient (`dht`) is honoured; the Function always produces the final state (one
`[N, H, K, V]` tensor) and the entries drop it when it was not asked for (its gradient is then None).

Grouped value heads (v, g, beta and the state with HV = G * H heads; q/k head h // G serves value head h):
the triton backend takes q, k with H heads as they are (its kernels read head h // G and its backward sums dq, dk
over each group, `kernels.common.chunk_bwd`); the torch and reference backends expand q and k with
`repeat_interleave(G, dim=2)` before the Function, so they compute with HV heads and autograd sums the G gradients
of each q/k head (memory: one `[B, T, HV, K]` copy of q and of k).
`use_qk_l2norm_in_kernel` normalises q and k (`kernels.common.l2norm`) before that, differentiably.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor
from torch.autograd.function import once_differentiable

from kernels import first_call
from kernels.backends import fla_forward, resolve_backend
from kernels.builds import build_mode
from kernels.common.chunk_bwd_torch import chunk_bwd_torch
from kernels.common.chunk_torch import chunk_fwd_torch
from kernels.common.gate import activate_beta, activate_gate
from kernels.common.index import ChunkIndex, prepare_chunk_index
from kernels.common.l2norm import l2norm
from kernels.configs import KERNELS, LaunchConfig
from kernels.fla_args import check_fla_backend, check_fla_tensors, parse_fla_args
from kernels.parallel_compile import compile_ahead
from kernels.plan import LaunchPlan, plan_with
from kernels.validate import check_backend, check_config, check_grad_outputs, check_inputs
from kernels.vocabulary import BACKEND_OPTIONS, KEEP_POLICIES

__all__ = ["KEEP_POLICIES", "TRITON_OPTIONS", "ChunkFunction", "ChunkOp", "check_config_names", "chunk_backward_impl",
           "checked_forward", "chunk_forward", "import_triton", "needs_grad", "public_op", "run"]

# the triton backend's options a sweep may set (`mode_options: {triton: {...}}`): name -> its allowed values, the first
# the default
TRITON_OPTIONS = BACKEND_OPTIONS["triton"]

ConfigArg = LaunchConfig | Mapping[str, LaunchConfig] | None


@dataclass(frozen=True)
class ChunkOp:
    """One entry of the op table: the op's name, whether its gate is per key dim (KDA) or per head (GDN), its per-token
    reference (the reference backend) and its WY prep (the op-specific pass of the Triton forward,
    `kernels.common.chunk_fwd.WyFn`); the torch backend and the rest of the Triton path are shared (`kernels.common`)."""

    name: str
    gate_vector: bool
    naive: Callable[..., tuple[Tensor, Tensor | None]]
    wy_prep: Callable[..., Any]
    fused_fwd: Callable[..., Any] | None = None  # the op's two-kernel forward (`fwd_path` "auto"/"fused"; GDN's, KDA's)
    ag_bwd: Callable[..., Any] | None = None  # its backward from the kept Ag (keep "ag", "ag+states"; GDN's `ops.gdn.ag_bwd`)
    # (k, v, chunk_size, plan) -> whether its two-kernel forward's state+output pass runs on the TileLang walk
    # (`kernels.common.chunk_fwd.WalkFn`; what "auto" reads where `kernels.vocabulary.AUTO_FWD_PATH` says "walk": KDA)
    fwd_walk: Callable[..., bool] | None = None

    def per_key_gate(self, g: Tensor) -> Tensor:
        """The torch path works on a `[B, T, H, Kg]` gate: GDN's scalar gate is Kg = 1 and broadcasts over K."""
        return g if self.gate_vector else g.unsqueeze(-1)

    def triton_fwd(self, q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, *, scale: float,
                   **options: Any) -> tuple[Tensor, Tensor | None]:
        """The op's forward on the Triton backend: (o `[B, T, H, V]` in q's dtype, final state `[N, H, K, V]` fp32 or
        None); its WY prep, then the shared state pass with the output. options: those of
        `kernels.common.chunk_fwd.chunk_fwd` (initial_state, output_final_state, cu_seqlens, plan, split_chunks,
        fuse_output, keep, keep_states, chunk_size, warm_chunks, warm_report, fwd_path)."""
        chunk_fwd = import_triton("kernels.common.chunk_fwd", "chunk_fwd")
        return chunk_fwd(self.wy_prep, q, k, v, g, beta, op=self.name, gate_vector=self.gate_vector, scale=scale,
                         fused_fwd=self.fused_fwd, fwd_walk=self.fwd_walk, **options)

    def triton_bwd(self, q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, do: Tensor,
                   **options: Any) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor | None]:
        """(dq, dk, dv, dg, dbeta, dh0) on the Triton backend: `kernels.common.chunk_bwd.chunk_bwd` for this op (its
        launch sequence and options: scale, initial_state, dht, cu_seqlens, plan, wy, split_chunks, chunk_size,
        seg_states)."""
        if self.ag_bwd is not None and "ag" in (options.get("wy") or {}):  # the forward kept its Ag (keep "ag")
            return self.ag_bwd(q, k, v, g, beta, do, **options)
        return import_triton("kernels.common.chunk_bwd", "chunk_bwd")(self.name, q, k, v, g, beta, do, **options)


def needs_grad(*xs: Tensor | None) -> bool:
    """True when autograd is on and one of the tensors requires a gradient."""
    return torch.is_grad_enabled() and any(x is not None and x.requires_grad for x in xs)


def run(
    op: ChunkOp, q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, *, scale: float | None,
    initial_state: Tensor | None, output_final_state: bool, cu_seqlens: Tensor | None, backend: str,
    config: ConfigArg = None, cu_seqlens_cpu: Tensor | Sequence[int] | None = None, plan: LaunchPlan | None = None,
    use_qk_l2norm_in_kernel: bool = False, fla_kwargs: Mapping[str, Any] | None = None,
) -> tuple[Any, ...]:
    """(o, final state or None[, chunk states]) of `op`: validate -> backend -> op table (the module docstring).

    fla_kwargs: FLA's other keyword arguments (`kernels.fla_args`; `kernels.chunk_gdn`'s table); with
    return_intermediate_states the chunk states come third."""
    args = parse_fla_args(op.name, fla_kwargs or {})
    if not isinstance(use_qk_l2norm_in_kernel, bool):
        raise ValueError(f"use_qk_l2norm_in_kernel must be a bool, got {use_qk_l2norm_in_kernel!r}")
    check_backend(backend)
    be = resolve_backend(backend, k.device) if isinstance(k, Tensor) else backend
    check_fla_backend(op.name, args, be)
    bounds = check_inputs(op.name, q, k, v, g, beta, backend=be, scale=scale, initial_state=initial_state,
                          cu_seqlens=cu_seqlens, cu_seqlens_cpu=cu_seqlens_cpu, grouped=True,
                          raw_gate=args.use_gate_in_kernel, gate_bound=args.gate_bound,
                          state_v_first=args.state_v_first)
    check_fla_tensors(op.name, args, k=k, v=v, bounds=bounds)
    configs = check_config(config)
    scale = k.shape[-1] ** -0.5 if scale is None else float(scale)
    states: list[Tensor] | None = [] if args.return_intermediate_states else None
    if be == "fla":
        o, ht = fla_forward(op.name, q, k, v, g, beta, scale=scale, initial_state=initial_state,
                            output_final_state=output_final_state, cu_seqlens=cu_seqlens, cu_seqlens_cpu=bounds,
                            use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel, options=args.given, states=states)
        return (o, ht) if states is None else (o, ht, states[0])
    if be == "triton":
        check_config_names(configs)
    launch = plan_with(plan, configs)
    if args.disable_recompute:  # FLA keeps every intermediate for the backward: our "wy+states" policy
        launch = launch.replace(keep=KEEP_POLICIES[-1])
    if args.use_gate_in_kernel:  # differentiable: the op sees the activated gate with its graph
        g = activate_gate(op.name, g, A_log=args.A_log, dt_bias=args.dt_bias, lower_bound=args.lower_bound)
    if args.use_beta_sigmoid_in_kernel:
        beta = activate_beta(beta, allow_neg_eigval=args.allow_neg_eigval)
    if args.state_v_first and initial_state is not None:
        initial_state = initial_state.transpose(-1, -2)
    if use_qk_l2norm_in_kernel:
        q, k = l2norm(q, fused=be == "triton"), l2norm(k, fused=be == "triton")
    group = v.shape[2] // k.shape[2]
    if group > 1 and be != "triton":  # grouped value heads on the references: q/k head h // group serves value head h
        q, k = q.repeat_interleave(group, dim=2), k.repeat_interleave(group, dim=2)
    o, ht = checked_forward(op, be, q, k, v, g, beta, scale=scale, initial_state=initial_state,
                     output_final_state=output_final_state, cu_seqlens=cu_seqlens, cu_seqlens_cpu=cu_seqlens_cpu,
                     bounds=bounds, plan=launch, states=states, chunk_size=args.chunk_size)
    if args.state_v_first and ht is not None:
        ht = ht.transpose(-1, -2).contiguous()
    if states is None:
        return o, ht
    return o, ht, _intermediate_states(states[0], batch=k.shape[0], dtype=k.dtype, v_first=args.state_v_first)


def public_op(op: ChunkOp, doc: str) -> Callable[..., tuple[Any, ...]]:
    """The public op of `op` (`kernels.chunk_gdn` / `kernels.chunk_kda`) with FLA's signature and the docstring `doc`:
    a drop-in for FLA's `chunk_gated_delta_rule` / `chunk_kda`, one signature for both ops."""

    def chunk(
        q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, *, scale: float | None = None,
        initial_state: Tensor | None = None, output_final_state: bool = False, cu_seqlens: Tensor | None = None,
        backend: str = "auto", use_qk_l2norm_in_kernel: bool = False, config: ConfigArg = None,
        cu_seqlens_cpu: Tensor | Sequence[int] | None = None, plan: LaunchPlan | None = None, **kwargs: Any,
    ) -> tuple[Any, ...]:
        return run(op, q, k, v, g, beta, scale=scale, initial_state=initial_state,
                   output_final_state=output_final_state, cu_seqlens=cu_seqlens, backend=backend, config=config,
                   cu_seqlens_cpu=cu_seqlens_cpu, plan=plan, use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel,
                   fla_kwargs=kwargs)

    chunk.__name__ = chunk.__qualname__ = f"chunk_{op.name}"
    chunk.__module__ = f"kernels.ops.{op.name}.chunk"
    chunk.__doc__ = doc
    return chunk


def checked_forward(
    op: ChunkOp, backend: str, q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, *, scale: float,
    initial_state: Tensor | None, output_final_state: bool, cu_seqlens: Tensor | None,
    cu_seqlens_cpu: Tensor | Sequence[int] | None, bounds: list[int] | None, plan: LaunchPlan,
    states: list[Tensor] | None, chunk_size: int,
) -> tuple[Tensor, Tensor | None]:
    """The op's entry for a resolved backend (not fla) on checked inputs with one head count: the per-token reference,
    ChunkFunction when a gradient is wanted, else `chunk_forward` alone (no autograd node, nothing saved)."""
    if backend == "reference":
        return op.naive(q, k, v, g, beta, scale=scale, initial_state=initial_state,
                        output_final_state=output_final_state, cu_seqlens_cpu=bounds)
    B, T = k.shape[:2]
    index = prepare_chunk_index(cu_seqlens, batch=B, seq_len=T, chunk_size=chunk_size, device=k.device,
                                cu_seqlens_cpu=cu_seqlens_cpu)
    args = (op, backend, index, cu_seqlens, plan, scale, q, k, v, g, beta, initial_state)
    grad = needs_grad(q, k, v, g, beta, initial_state)
    if backend == "triton":  # a new kind of call compiles its kernels in parallel first (`kernels.parallel_compile`)
        call = (args, grad, output_final_state, states is not None)
        kind = _call_kind(*call)
        if compile_ahead(kind, lambda: first_call.dry_runs(kind, op.name, plan, lambda p: _launch_sequence(*call, plan=p))):
            build_mode()  # a bad CPBENCH_TILELANG_BUILD raises here (the dry run drops its errors)
        tiered = first_call.plan_for(kind, op.name, plan)  # on Triton while its "auto" TileLang kernels build
        if tiered is not plan:  # (the Function keeps it for the backward: one plan per call)
            args = (*args[:4], tiered, *args[5:])
    if grad:
        o, ht = ChunkFunction.apply(*args)
        return o, (ht if output_final_state else None)
    return chunk_forward(*args, output_final_state=output_final_state, states=states)


def _intermediate_states(h: Tensor, *, batch: int, dtype: torch.dtype, v_first: bool) -> Tensor:
    """FLA's layout of the chunk states: `[B, NT, HV, K, V]` (varlen: B = 1, NT all chunks), k's dtype; `[.., V, K]`
    with state_v_first."""
    h = h.reshape(batch, h.shape[0] // batch, *h.shape[1:]).to(dtype)
    return h.transpose(-1, -2).contiguous() if v_first else h


class ChunkFunction(torch.autograd.Function):
    """(o, final_state) of the chunked op with gradients for q, k, v, g, beta and the initial state."""

    @staticmethod
    def forward(  # type: ignore[override]
        ctx: Any, op: ChunkOp, backend: str, index: ChunkIndex, cu_seqlens: Tensor | None, plan: LaunchPlan,
        scale: float, q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, initial_state: Tensor | None,
    ) -> tuple[Tensor, Tensor]:
        ctx.set_materialize_grads(False)
        o, ht, keep, seg = _forward_kept(op, backend, index, cu_seqlens, plan, scale, q, k, v, g, beta, initial_state)
        names = tuple(sorted(keep)) if keep else ()
        hs = (seg["hs"],) if seg else ()  # the split's segment states (`kernels.common.seqsplit.keep_segment_states`)
        ctx.save_for_backward(q, k, v, g, beta, initial_state, *(keep[n] for n in names), *hs)  # type: ignore[index]
        # the backward launches with the same plan (and the forward's split, when it kept its segment states)
        ctx.meta = (op, backend, index, cu_seqlens, plan, scale, names, seg["seg_chunks"] if seg else None)
        return o, ht

    @staticmethod
    @once_differentiable
    def backward(ctx: Any, do: Tensor | None, dht: Tensor | None) -> tuple[Tensor | None, ...]:  # type: ignore[override]
        q, k, v, g, beta, h0, *kept = ctx.saved_tensors
        op, backend, index, cu_seqlens, plan, scale, names, seg_chunks = ctx.meta
        seg = None if seg_chunks is None else {"hs": kept.pop(), "seg_chunks": seg_chunks}
        if do is None:  # only the final state was used
            do = q.new_zeros(v.shape)
        dq, dk, dv, dg, dbeta, dh0 = chunk_backward_impl(
            op, backend, q, k, v, g, beta, do, scale=scale, initial_state=h0, dht=dht, index=index,
            cu_seqlens=cu_seqlens, plan=plan, wy=dict(zip(names, kept, strict=True)) if names else None,
            seg_states=seg)
        if dh0 is not None and h0 is not None:
            dh0 = dh0.to(h0.dtype)
        return None, None, None, None, None, None, dq, dk, dv, dg, dbeta, dh0


def _forward_kept(*args: Any) -> tuple[Tensor, Tensor, dict[str, Tensor] | None, dict[str, Any] | None]:
    """ChunkFunction's forward on `chunk_forward`'s positional args: (o, final state, what the plan keeps for the
    backward by name or None, the split's segment states or None)."""
    keep_wy, keep_states = args[4].keeps(args[0].name)
    keep: dict[str, Tensor] | None = {} if args[1] == "triton" and keep_wy else None
    seg: dict[str, Any] = {}
    o, ht = chunk_forward(*args, keep=keep, keep_states=keep_states, seg_states=seg)
    assert ht is not None
    return o, ht, keep or None, seg or None


def _call_kind(args: tuple[Any, ...], grad: bool, output_final_state: bool, states: bool) -> tuple[Any, ...]:
    """What decides the kernels a triton call compiles (shapes but T, dtypes, options): `compile_ahead`'s key."""
    op, _, index, cu_seqlens, plan, _, q, k, v, g, beta, h0 = args
    (B, T, H, K), (*_, HV, V) = k.shape, v.shape
    return (op.name, k.device, grad, output_final_state, states, index.chunk_size, cu_seqlens is None, B == 1, T % 16,
            H, HV, K, V, q.dtype, v.dtype, g.dtype, beta.dtype, h0 is None or h0.dtype, plan.keep, plan.bwd_grads,
            plan.bwd_warm, plan.fwd_pass, plan.ag_pass, id(plan.table),
            tuple(sorted(plan.configs.items())) if plan.configs else ())


def _launch_sequence(args: tuple[Any, ...], grad: bool, output_final_state: bool, states: bool, *,
                     plan: LaunchPlan | None = None) -> None:
    """`checked_forward`'s Triton launches for `compile_ahead`'s dry run: the forward as the entry runs it, then with a
    gradient the backward on an uninitialised `do` (and `dht` when the final state is returned); under `plan` (None:
    the call's; `kernels.first_call.dry_runs` passes its fallback too), no recorder."""
    args = (*args[:4], (plan or args[4]).with_recorder(None), *args[5:])
    op, backend, index, cu_seqlens, plan, scale, q, k, v, g, beta, h0 = args
    with torch.no_grad():
        if not grad:
            chunk_forward(*args, output_final_state=output_final_state, states=[] if states else None)
            return
        o, ht, keep, seg = _forward_kept(*args)
        chunk_backward_impl(op, backend, q, k, v, g, beta, torch.empty_like(o), scale=scale, initial_state=h0,
                            dht=torch.empty_like(ht) if output_final_state else None, index=index,
                            cu_seqlens=cu_seqlens, plan=plan, wy=keep, seg_states=seg)


def chunk_forward(
    op: ChunkOp, backend: str, index: ChunkIndex, cu_seqlens: Tensor | None, plan: LaunchPlan, scale: float,
    q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, initial_state: Tensor | None, *,
    output_final_state: bool = True, keep: dict[str, Tensor] | None = None, keep_states: bool = False,
    states: list[Tensor] | None = None, seg_states: dict[str, Any] | None = None,
) -> tuple[Tensor, Tensor | None]:
    """ChunkFunction's forward without autograd: (o, final state or None). keep / keep_states: what the triton
    forward holds for the backward (the plan's policy); states: a list that receives the chunk states
    `[NT, H, K, V]` (the state entering each chunk; fp32 on torch, k's dtype on triton); seg_states: a dict that
    receives the triton forward's segment states where it splits (`kernels.common.seqsplit.keep_segment_states`)."""
    if backend == "torch":
        return chunk_fwd_torch(q, k, v, op.per_key_gate(g), beta, scale=scale, initial_state=initial_state,
                               output_final_state=output_final_state, index=index, states=states)
    if states is not None:
        keep, keep_states = ({} if keep is None else keep), True
    o, ht = op.triton_fwd(q, k, v, g, beta, scale=scale, initial_state=initial_state,
                          output_final_state=output_final_state, cu_seqlens=cu_seqlens, plan=plan, keep=keep,
                          keep_states=keep_states, chunk_size=index.chunk_size, seg_states=seg_states)
    if states is not None and keep is not None:
        states.append(keep["h"])
    return o, ht


def chunk_backward_impl(
    op: ChunkOp, backend: str, q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, do: Tensor, *,
    scale: float, initial_state: Tensor | None, dht: Tensor | None, index: ChunkIndex, cu_seqlens: Tensor | None,
    plan: LaunchPlan, wy: Mapping[str, Tensor] | None = None, seg_states: Mapping[str, Any] | None = None,
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor | None]:
    """The backend's backward on checked inputs (same heads everywhere); checks do / dht first. wy: the forward's
    WY factors and with "wy+states" its chunk states, or with "ag" its Ag and gate cumsum (and with "ag+states" its
    chunk states; triton, the plan's `keep`); seg_states: the triton forward's segment states (`chunk_forward`)."""
    check_grad_outputs(do, dht, q=q, v=v, num_seqs=index.num_seqs)
    do = do.contiguous()
    dht = dht.contiguous() if dht is not None else None
    if backend == "torch":
        dq, dk, dv, dg, dbeta, dh0 = chunk_bwd_torch(q, k, v, op.per_key_gate(g), beta, do, scale=scale,
                                                     initial_state=initial_state, dht=dht, index=index)
        return dq, dk, dv, (dg if op.gate_vector else dg.squeeze(-1)), dbeta, dh0
    if backend != "triton":
        raise ValueError(f"backend {backend!r} has no chunked backward here (use 'torch' or 'triton')")
    return op.triton_bwd(q, k, v, g, beta, do, scale=scale, initial_state=initial_state, dht=dht,
                         cu_seqlens=cu_seqlens, plan=plan, wy=wy, chunk_size=index.chunk_size, seg_states=seg_states)


def check_config_names(configs: Mapping[str, LaunchConfig]) -> None:
    """Every config names a registered Triton kernel (a ValueError listing them otherwise)."""
    unknown = sorted(set(configs) - set(KERNELS))
    if unknown and KERNELS:
        raise ValueError(f"config names unknown kernel(s) {unknown}; registered kernels: {sorted(KERNELS)}")


def import_triton(module: str, name: str) -> Callable[..., Any]:
    """`module.name` of a Triton module, imported on first use (the torch backend runs without Triton); an ImportError
    naming the backend when it cannot load."""
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as err:
        raise ImportError(f"backend 'triton' could not load {module}.{name}: {err}") from err
