"""KDA's two-kernel forward (issue 26, `kernels.ops.kda.fused`) against its WY forward and FLA's Triton `chunk_kda`,
in one process on one GPU: o checked against the fp32 reference, then do_bench medians; GPU only.

    python benchmarks/kda_fused_lab.py --out $OUT [--shapes 1x131072,1x32768,8x8192] [--lbs -1,-5] [--no-fla]
        [--forms inline,gated,gated_tma,walk,walk_tl] [--no-old] [--ag-configs default,gated:16:4,...] [--ag-only]
        [--ref-max-tokens 8192] [--split-chunks N] [--deadline-s 540]
    TRITON_INTERPRET=1 python benchmarks/kda_fused_lab.py --out /tmp/lab --dry-run   # CPU plumbing check, no timing

Inputs: bf16, H=HV=16, K=V=128, q and k L2-normalised, g = lb * sigmoid(randn) `[.., H, K]` fp32 (lb -1: every
16-token span < FAST_SPAN, the Ag pass's tensor-core diagonal blocks; lb -5: spans up to 80, the same path; FLA's
safe-gate range), beta = sigmoid(randn), B sequences packed as one varlen batch (`cu_seqlens`). Per shape and lb:
- check: o of each path against the fp32 per-token reference (`kernels.ops.kda.naive`) up to --ref-max-tokens tokens,
  above that against the chunked torch path in fp32 (itself tested against the per-token one); relative L2;
- time (do_bench medians, warmup 25, rep 150): the new forward (`chunk_kda_fwd(fwd_path="fused")`) and its
  launchers: the Ag pass (`wy_kda_ag`), the fused pass given Ag (`fused_state_output_fwd`) and, when the split runs,
  its transitions, `seg_chain_fwd` and the state+output launch alone, once per --forms item (`FORMS`): `inline` (the
  Ag pass stores G, the fused pass exponentiates [BT, K] gate tiles per V block: the default), `gated` (the Ag pass's
  `gated` variant, `kernels.ops.kda.wy_ag.gated_ag_plan`: it stores qg, ke, kd, G_C and the fused pass reads them),
  and those with the fused pass's config changed (`_tma`: its tma variant, `_w8`: 8 warps), and `walk` (session 28:
  the gated Ag pass, then the TileLang walk's gated build, `LaunchPlan(fwd_pass="tilelang")`, `kernels.ops.gdn
  .fwd_walk`: its state+output launch on the same segments from the same states as the Triton forms' at value blocks
  128 and 64, and the whole pass with the walk's own one-wave split; H200 only), `walk_tl` (the same with the TileLang
  Ag pass, `LaunchPlan(ag_pass="tilelang")`, `kernels.ops.kda.ag_hopper`: the whole forward on TileLang); a form's
  keys are prefixed
  `<form>_` (inline: none), one row of the second table each; unless --no-old the old forward
  (`fwd_path="wy"`) and its two launchers (`wy_kda_fwd`, `state_and_output`); FLA's `chunk_kda` when `fla` imports
  (its first call's seconds too);
- floors (`runners.bench.floors`, bytes at HBM_TBPS): the whole forward (q, k, v, g, beta read and o written once)
  and each new launcher's (`ag`, `fused`; `gated_pass`: the gated form's state+output pass, which reads qg, ke, kd
  at the value heads, v, Ag, Aqk and G_C and writes o); new / FLA, the issue's target <= 0.5;
- with --ag-configs (the Ag pass's code variants `kernels.ops.kda.wy_ag.KDA_AG_VARIANTS`), first: per Ag config
  NAME[:BK:num_warps[:num_stages]] (NAME "default": the spec's default code, "tilelang": the TileLang pass of
  session 28, `kernels.ops.kda.ag_hopper`, else variants joined by "+"; a config
  `wy_kda_ag` refuses is an error row; session 12's 64-row-tile variants were removed after the H200 measured them
  1.4-2.4x slower, `benchmarks/results/kda_forms_h200.md`), the Ag pass alone (with the warm
  split's bound sums, as the forward runs it), its ag / aqk / gcum against the default code's (relative L2; gated: its
  G_C against gcum at each chunk's last row), and the whole two-kernel forward with that config (o against the
  reference): the Ag table; --ag-only: no launchers (each form's and the old forward's whole forward only).
Writes $OUT/kda_fused_lab.{json,md} after every row (a stopped run keeps its rows).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
import time
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.fused_fwd_lab import DEVICE, DIMS, _ms  # noqa: E402  (GDN's lab: the device, the dims, do_bench)


def _inputs(B: int, T: int, lb: float, seed: int = 0) -> tuple[Any, ...]:
    """q, k, v, g, beta `[1, B*T, ...]` on the device, cu_seqlens int32 there and its host list."""
    dev, n, (H, K, V) = DEVICE["name"], B * T, DIMS.values()
    gen = torch.Generator(device=dev).manual_seed(seed)

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen, device=dev)

    q, k = (torch.nn.functional.normalize(randn(1, n, H, K), dim=-1).to(DEVICE["dtype"]) for _ in range(2))
    v = randn(1, n, H, V).to(DEVICE["dtype"])
    g = lb * torch.sigmoid(randn(1, n, H, K))
    beta = torch.sigmoid(randn(1, n, H)).to(DEVICE["dtype"])
    bounds = [i * T for i in range(B + 1)]
    return q, k, v, g, beta, torch.tensor(bounds, dtype=torch.int32, device=dev), bounds


def _reference(q, k, v, g, beta, cu, max_tokens: int) -> tuple[torch.Tensor, str]:
    """o in fp32: the per-token reference up to max_tokens tokens, else the chunked torch path."""
    import kernels

    backend = "reference" if q.shape[1] <= max_tokens else "torch"
    o = kernels.forward("kda", *(x.float() for x in (q, k, v, g, beta)), cu_seqlens=cu, backend=backend)[0]
    return o, {"reference": "per-token fp32", "torch": "chunked torch fp32"}[backend]


def _floors(row: dict[str, Any], B: int, T: int, H: int, K: int, V: int) -> None:
    from runners.bench.floors import HBM_TBPS, bytes_floor, launcher_bytes

    def ms(nbytes: float) -> float:
        return nbytes / (HBM_TBPS * 1e12) * 1e3

    row["floor_ms"] = ms(bytes_floor("kda", B, T, H, K, V))
    row["ag_floor_ms"] = ms(launcher_bytes("kda", "ag", B, T, H, K, V))
    row["pass_floor_ms"] = ms(launcher_bytes("kda", "fused", B, T, H, K, V))
    # the gated form's pass (the Triton PRE_GATED pass, the walk): qg, ke, kd, v, Ag, Aqk and o per token and value
    # head in bf16, G_C fp32 per chunk
    row["gated_pass_floor_ms"] = ms(B * T * H * (2 * (3 * K + 2 * V + 2 * 64) + 4 * K / 64))


# the fused pass's forms (module docstring): the Ag pass gated or not, the fused pass's config fields over its default,
# and the plan's fwd_pass (the Triton pass, or the TileLang walk's gated build); FORM_AG_PASS: a form's ag_pass when
# not Triton's ("walk_tl": the TileLang Ag pass `kernels.ops.kda.ag_hopper` ahead of the walk, the whole forward on
# TileLang)
FORMS: dict[str, tuple[bool, dict[str, Any], str]] = {
    "inline": (False, {}, "triton"), "gated": (True, {}, "triton"), "gated_tma": (True, {"VARIANT": 2}, "triton"),
    "gated_w8": (True, {"num_warps": 8}, "triton"), "gated_tma_w8": (True, {"VARIANT": 2, "num_warps": 8}, "triton"),
    "inline_tma": (False, {"VARIANT": 2}, "triton"), "inline_w8": (False, {"num_warps": 8}, "triton"),
    "walk": (True, {}, "tilelang"), "walk_tl": (True, {}, "tilelang"),
}  # fmt: skip
FORM_AG_PASS = {"walk_tl": "tilelang"}


def form_plan(form: str) -> Any:
    """The default plan with a --forms item's Ag pass (gated or not) and fused-pass config."""
    import dataclasses

    from kernels.ops.gdn.fused import KDA_FUSED_STATE_OUTPUT_FWD as SPEC
    from kernels.ops.kda.wy_ag import gated_ag_plan

    gated, fields, fwd_pass = FORMS[form]
    plan = gated_ag_plan(None, gated).replace(fwd_pass=fwd_pass, ag_pass=FORM_AG_PASS.get(form, "triton"))
    return plan.with_configs({SPEC.name: dataclasses.replace(SPEC.default, **fields)}) if fields else plan


def _prefix(form: str) -> str:
    return "" if form == "inline" else f"{form}_"


def ag_plans(text: str) -> dict[str, Any]:
    """--ag-configs: {label: LaunchPlan or None (the default plan)} from NAME[:BK:num_warps[:num_stages]],..., NAME
    "default" (the default code), "tilelang" (the TileLang pass, `kernels.ops.kda.ag_hopper`: LaunchPlan.ag_pass) or
    variants of `KDA_AG_VARIANTS` joined by "+" (e.g. gated)."""
    from kernels.configs import LaunchConfig
    from kernels.ops.kda.wy_ag import KDA_AG_VARIANTS, WY_KDA_AG_FWD
    from kernels.plan import default_plan

    plans: dict[str, Any] = {}
    for item in filter(None, text.split(",")):
        if item == "tilelang":
            plans[item] = default_plan().replace(ag_pass="tilelang")
            continue
        name, *nums = item.split(":")
        names = [] if name == "default" else name.split("+")
        if any(n not in KDA_AG_VARIANTS for n in names) or len(nums) not in (0, 2, 3):
            raise SystemExit(f"--ag-configs: bad {item!r}: NAME[:BK:num_warps[:num_stages]], NAME default or "
                             f"'+'-joined names of {sorted(KDA_AG_VARIANTS)}")  # fmt: skip
        if not names and not nums:
            plans[item] = None
            continue
        base = WY_KDA_AG_FWD.default
        bk, warps, stages = ([int(x) for x in nums] + [base.num_stages])[:3] if nums else (base.BK, base.num_warps, base.num_stages)  # fmt: skip
        variant = sum(KDA_AG_VARIANTS[n] for n in set(names)) or None
        cfg = LaunchConfig(BK=bk, BV=base.BV, num_warps=warps, num_stages=stages, VARIANT=variant)
        plans[item] = default_plan().with_configs({WY_KDA_AG_FWD.name: cfg})
    return plans


def _chunk_last(gcum: torch.Tensor, index: Any) -> torch.Tensor:
    """gcum `[1, T, HV, K]` at each chunk's last row: `[NT_total, HV, K]`, the gated variant's G_C."""
    seq, chunk = index.chunk_indices.long().unbind(1)
    cu = index.cu_seqlens.long()
    ends = torch.minimum(cu[seq] + (chunk + 1) * index.chunk_size, cu[seq + 1])
    return gcum[0, ends - 1]


def measure_ag(row: dict[str, Any], q, k, v, g, beta, cu, index, o_ref, plans: dict[str, Any],
               split: int | None) -> None:  # fmt: skip
    """The Ag pass alone and the two-kernel forward per Ag config (`ag_plans`), into row["ag_configs"]."""
    from kernels.common.warm_split import WARM_DEFAULT
    from kernels.ops.kda.chunk import chunk_kda_fwd
    from kernels.ops.kda.wy_ag import GatedKeys, wy_kda_ag
    from kernels.plan import default_plan
    from runners.correctness import rel_l2

    scale, H = k.shape[3] ** -0.5, v.shape[2]
    bnd = torch.empty(index.num_chunks, H, 2, dtype=torch.float32, device=q.device)
    base = wy_kda_ag(q, k, g, beta, scale=scale, index=index, launch=default_plan())
    below = torch.ones(64, 64, dtype=torch.bool, device=q.device).tril()
    # Aqk's entries above the diagonal are not written: compare on and below it (rows of a chunk = token % 64 here)
    mask = below[torch.arange(q.shape[1], device=q.device) % 64][None, :, None, :]
    out: dict[str, Any] = {}
    for label, plan in plans.items():
        res: dict[str, Any] = {}
        launch = plan if plan is not None else default_plan()
        try:
            ag, aqk, gates = wy_kda_ag(q, k, g, beta, scale=scale, index=index, launch=launch)
            res["err_ag"] = rel_l2(ag, base[0])
            # the gated variant stores G_C (GatedKeys.gc), not gcum: against gcum at each chunk's last row
            gated = isinstance(gates, GatedKeys)
            res["err_gcum"] = rel_l2(gates.gc, _chunk_last(base[2], index)) if gated else rel_l2(gates, base[2])
            res["err_aqk"] = rel_l2(aqk.masked_fill(~mask, 0), base[1].masked_fill(~mask, 0))
            res["ag_ms"] = _ms(lambda launch=launch: wy_kda_ag(q, k, g, beta, scale=scale, index=index, launch=launch,
                                                               bnd=bnd, v=v))  # fmt: skip

            def fwd(launch=launch) -> Any:
                return chunk_kda_fwd(q, k, v, g, beta, scale=scale, cu_seqlens=cu, split_chunks=split, fwd_path="fused",
                                     plan=launch)  # fmt: skip

            res["err_fwd"] = rel_l2(fwd()[0], o_ref)
            res["fwd_ms"] = _ms(fwd)
        except Exception as err:  # a config that fails to compile or run is a row, not a crash
            res["error"] = f"{type(err).__name__}: {str(err).splitlines()[0][:160] if str(err) else ''}"
        out[label] = res
        print(json.dumps({"ag_config": label, **res}), flush=True)
    row["ag_configs"] = out
    row["warm_chunks_fused"] = WARM_DEFAULT.get("fused")


def measure(B: int, T: int, lb: float, *, fla: bool, ref_max_tokens: int, split: int | None,
            forms: tuple[str, ...] = ("inline",), old: bool = True, ag_configs: dict[str, Any] | None = None,
            ag_only: bool = False) -> dict[str, Any]:  # fmt: skip
    """One row: the Ag configs (first: the slower full comparison after them), each form's forward and (unless
    ag_only) its launchers, the old forward and its launchers (unless not old), FLA."""
    from kernels.common.index import prepare_chunk_index
    from kernels.ops.kda.chunk import chunk_kda_fwd
    from kernels.plan import default_plan
    from runners.correctness import rel_l2

    q, k, v, g, beta, cu, bounds = _inputs(B, T, lb)
    H, K, V = v.shape[2], k.shape[3], v.shape[3]
    scale = K**-0.5
    index = prepare_chunk_index(cu, batch=1, seq_len=B * T, chunk_size=64, device=q.device, cu_seqlens_cpu=bounds)
    row: dict[str, Any] = {"B": B, "T": T, "lb": lb}
    _floors(row, B, T, H, K, V)

    def run(path: str, launch: Any) -> Any:
        return chunk_kda_fwd(q, k, v, g, beta, scale=scale, cu_seqlens=cu, split_chunks=split, fwd_path=path, plan=launch)

    o_ref, row["reference"] = _reference(q, k, v, g, beta, cu, ref_max_tokens)
    if ag_configs:
        measure_ag(row, q, k, v, g, beta, cu, index, o_ref, ag_configs, split)
    for form in forms:
        launch, p = form_plan(form), _prefix(form)
        row[f"{p}err_new"] = rel_l2(run("fused", launch)[0], o_ref)
        row[f"{p}new_ms"] = _ms(lambda launch=launch: run("fused", launch))
        if not ag_only:
            _form_launchers(row, p, q, k, v, g, beta, index, scale, launch, split)
    for form in forms:
        if "new_ms" in row:
            row[f"{_prefix(form)}over_inline"] = row[f"{_prefix(form)}new_ms"] / row["new_ms"]
    if old:
        launch = default_plan()
        row["err_old"] = rel_l2(run("wy", launch)[0], o_ref)
        row["old_ms"] = _ms(lambda: run("wy", launch))
        if not ag_only:
            _old_launchers(row, q, k, v, g, beta, index, scale, launch, split)
    return _fla(row, q, k, v, g, beta, cu, scale, o_ref) if fla else row


def _form_launchers(row: dict[str, Any], p: str, q, k, v, g, beta, index, scale: float, launch, split: int | None) -> None:
    """The new path's launchers with a form's plan, keys prefixed p: the Ag pass, the fused pass given Ag, and (split)
    its three pieces."""
    from kernels.common.seqsplit import resolve_split, seg_chain_fwd, whole_sequences
    from kernels.ops.gdn.fused import fused_state_output_fwd, gdn_fused_state_output, gdn_fused_transition
    from kernels.ops.kda.wy_ag import GatedKeys, wy_kda_ag

    H, V = v.shape[2], v.shape[3]
    ag, aqk, gates = wy_kda_ag(q, k, g, beta, scale=scale, index=index, launch=launch)
    row[f"{p}ag_ms"] = _ms(lambda: wy_kda_ag(q, k, g, beta, scale=scale, index=index, launch=launch))
    if isinstance(gates, GatedKeys):  # the pass reads qg, ke, G_C in q's, k's and gcum's places, and kd
        qx, kx, gx, kd = gates.qg, gates.ke, gates.gc, gates.kd
    else:
        qx, kx, gx, kd = q, k, gates, None
    pa = {"ag": ag, "gcum": gx, "launch": launch, "kd": kd}
    row[f"{p}pass_ms"] = _ms(lambda: fused_state_output_fwd(qx, kx, v, aqk=aqk, scale=scale, index=index,
                                                            split_chunks=split, **pa))  # fmt: skip
    plan = resolve_split(index, split, H=H, NV=-(-V // 64), device=q.device)
    row["segments"] = plan.num_segments if plan is not None else 0
    layout, h0 = whole_sequences(index), None
    if plan is not None:
        tr = {"layout": plan.transitions, "BT": 64, **pa}
        M, S = gdn_fused_transition(kx, v, **tr)
        row[f"{p}transition_ms"] = _ms(lambda: gdn_fused_transition(kx, v, **tr))
        row["chain_ms"] = _ms(lambda: seg_chain_fwd(M, S, None, plan, launch=launch))
        layout, h0 = plan.final, seg_chain_fwd(M, S, None, plan, launch=launch)
    if launch.fwd_pass == "tilelang":  # the walk on the same segments from the same states, at both value blocks
        from kernels.ops.gdn.fwd_walk import fwd_walk_tilelang

        wa = {"layout": layout, "h0": h0, "aqk": aqk, "kd": kd}
        fwd_walk_tilelang(qx, kx, v, ag, gx, BV=64, **wa)  # (its build, outside do_bench's first estimate)
        row[f"{p}state_output_ms"] = _ms(lambda: fwd_walk_tilelang(qx, kx, v, ag, gx, BV=128, **wa))
        row[f"{p}state_output_bv64_ms"] = _ms(lambda: fwd_walk_tilelang(qx, kx, v, ag, gx, BV=64, **wa))
        return
    so = {"aqk": aqk, "layout": layout, "BT": 64, "scale": scale, "h0": h0, **pa}
    row[f"{p}state_output_ms"] = _ms(lambda: gdn_fused_state_output(qx, kx, v, **so))


def _old_launchers(row: dict[str, Any], q, k, v, g, beta, index, scale: float, launch, split: int | None) -> None:
    """The old path's two launchers: the WY prep and the state+output pass."""
    from kernels.common.seqsplit import state_and_output
    from kernels.common.wy import wy_kda_fwd

    w, u, kg, gc, qg, aqk_old = wy_kda_fwd(q, k, v, g, beta, scale=scale, index=index, launch=launch)
    row["old_wy_ms"] = _ms(lambda: wy_kda_fwd(q, k, v, g, beta, scale=scale, index=index, launch=launch))
    row["old_state_output_ms"] = _ms(lambda: state_and_output(
        index=index, k=kg, w=w, u=u, g=gc, q=qg, aqk=aqk_old, gate_vector=True, scale=scale, initial_state=None,
        output_final_state=False, out_dtype=q.dtype, launch=launch, split_chunks=split, fuse_output=True))  # fmt: skip


def _fla(row: dict[str, Any], q, k, v, g, beta, cu, scale: float, o_ref) -> dict[str, Any]:
    """FLA's chunk_kda on the same inputs: its error, first call's seconds and time; new / FLA (each form)."""
    from fla.ops.kda import chunk_kda

    from runners.correctness import rel_l2

    def fla_fwd() -> Any:
        return chunk_kda(q, k, v, g, beta, scale=scale, cu_seqlens=cu.long())

    t0 = time.perf_counter()
    row["err_fla"] = rel_l2(fla_fwd()[0], o_ref)
    row["fla_first_call_s"] = time.perf_counter() - t0
    row["fla_ms"] = _ms(fla_fwd)
    for form in FORMS:
        if f"{_prefix(form)}new_ms" in row:
            row[f"{_prefix(form)}new_over_fla"] = row[f"{_prefix(form)}new_ms"] / row["fla_ms"]
    return row


COLUMNS = [
    ("B", "B"), ("T", "T"), ("lb", "lb"), ("floor_ms", "floor"), ("new_ms", "new fwd"), ("old_ms", "old fwd (WY)"),
    ("fla_ms", "FLA chunk_kda"), ("new_over_fla", "new / FLA"), ("ag_ms", "new: Ag pass"), ("ag_floor_ms", "Ag floor"),
    ("pass_ms", "new: fused pass (given Ag)"), ("pass_floor_ms", "pass floor"),
    ("gated_pass_floor_ms", "gated pass floor"), ("transition_ms", "new: trans"),
    ("chain_ms", "new: chain"), ("state_output_ms", "new: state+o"), ("segments", "segments"),
    ("old_wy_ms", "old: wy"), ("old_state_output_ms", "old: state+o"), ("err_new", "err new"), ("err_old", "err old"),
    ("err_fla", "err FLA"),
]  # fmt: skip
# the second table: one row per (shape, lb, form), the form's keys without their prefix
FORM_COLUMNS = [
    ("new_ms", "fwd"), ("over_inline", "/ inline"), ("new_over_fla", "/ FLA"), ("ag_ms", "Ag pass"),
    ("pass_ms", "fused pass (given Ag)"), ("transition_ms", "trans"), ("state_output_ms", "state+o"),
    ("state_output_bv64_ms", "state+o BV 64"), ("err_new", "err"),
]  # fmt: skip


NOTE = (
    "Times in ms (do_bench medians); floors: bytes at 4.2 TB/s (`runners.bench.floors`: the forward reads q, k, v, g, "
    "beta and writes o once; `ag`, `fused` per launcher); err = relative L2 of o against the fp32 reference (column "
    "`reference` in the JSON); the issue's target: new / FLA <= 0.5."
)


def _cell(key: str, x: Any) -> str:
    if x is None:
        return ""
    if isinstance(x, float):
        return f"{x:.3e}" if key.startswith("err") else f"{x:.3f}"
    return str(x)


AG_COLUMNS = [
    ("ag_ms", "Ag pass ms (with bnd)"), ("fwd_ms", "two-kernel fwd ms"), ("err_ag", "err ag vs default"),
    ("err_aqk", "err aqk vs default"), ("err_gcum", "err gcum vs default"), ("err_fwd", "err fwd"), ("error", "error"),
]  # fmt: skip
AG_NOTE = (
    "Ag configs (`--ag-configs`, NAME[:BK:num_warps[:num_stages]]; `kernels.ops.kda.wy_ag.KDA_AG_VARIANTS`): the Ag "
    "pass alone with the warm split's bound sums (as the forward runs it), its outputs against the default code's "
    "(relative L2; Aqk on and below the diagonal; gated: G_C against gcum at each chunk's last row), and the whole "
    "two-kernel forward with that config (o against the reference); old fwd (WY) and FLA in the first table."
)


def _ag_table(rows: list[dict[str, Any]]) -> list[str]:
    if not any(row.get("ag_configs") for row in rows):
        return []
    lines = ["", AG_NOTE, "", "| B | T | lb | Ag config | " + " | ".join(h for _, h in AG_COLUMNS) + " |",
             "|" + "---:|" * 3 + "---|" + "---:|" * (len(AG_COLUMNS) - 1) + "---|"]  # fmt: skip
    for row in rows:
        for label, res in (row.get("ag_configs") or {}).items():
            cells = [_cell(key, res.get(key)) for key, _ in AG_COLUMNS]
            lines.append(f"| {row['B']} | {row['T']} | {row['lb']:.3f} | `{label}` | " + " | ".join(cells) + " |")
    return lines


def _markdown(state: dict[str, Any]) -> str:
    head = f"# KDA two-kernel forward lab (`benchmarks/kda_fused_lab.py`)\n\nCommand: `{state['command']}`  \n"
    head += f"Environment: `{json.dumps(state['env'])}`\n\n{NOTE}\n\n"
    table = ["| " + " | ".join(h for _, h in COLUMNS) + " |", "|" + "---:|" * len(COLUMNS)]
    table += ["| " + " | ".join(_cell(key, row.get(key)) for key, _ in COLUMNS) + " |" for row in state["rows"]]
    table += [
        "",
        "Per form (`--forms`; ms; / inline: the whole forward's ratio):",
        "",
        "| B | T | lb | form | " + " | ".join(h for _, h in FORM_COLUMNS) + " |",
        "|" + "---:|" * (len(FORM_COLUMNS) + 4),
    ]
    for row in state["rows"]:
        for form in FORMS:
            p = _prefix(form)
            if f"{p}new_ms" in row:
                cells = [_cell(key, row.get(p + key)) for key, _ in FORM_COLUMNS]
                table.append(f"| {row['B']} | {row['T']} | {row['lb']} | {form} | " + " | ".join(cells) + " |")
    return head + "\n".join(table + _ag_table(state["rows"])) + "\n"


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--shapes", default="1x131072,1x32768,8x8192", help="BxT,... (B sequences of T tokens)")
    p.add_argument("--lbs", default="-1,-5", help="gate lower bounds: g = lb * sigmoid(randn)")
    p.add_argument("--no-fla", action="store_true", help="skip FLA's chunk_kda even when fla imports")
    p.add_argument("--ref-max-tokens", type=int, default=8192, help="per-token reference up to this many tokens")
    p.add_argument("--split-chunks", type=int, default=None, help="segment length in chunks (default: automatic)")
    p.add_argument("--forms", default="inline,gated", help=f"the fused pass's forms to time, of {','.join(FORMS)}")
    p.add_argument("--no-old", action="store_true", help="skip the old (WY) forward and its launchers")
    p.add_argument(
        "--ag-configs",
        default="",
        help="Ag pass configs to time, NAME[:BK:num_warps[:num_stages]],... "
        "(NAME: default or KDA_AG_VARIANTS keys joined by +), e.g. default,default:32:2,gated:16:4",
    )
    p.add_argument("--ag-only", action="store_true", help="no launchers: the whole forwards and the Ag configs' table")
    p.add_argument("--dry-run", action="store_true", help="CPU under TRITON_INTERPRET=1: H=2, K=V=32, 1x200, split 1")
    p.add_argument("--deadline-s", type=float, default=540.0, help="start no new row after this many seconds")
    args = p.parse_args(argv)
    forms = tuple(args.forms.split(","))
    if not forms or set(forms) - set(FORMS):
        raise SystemExit(f"--forms: give some of {','.join(FORMS)}, got {args.forms!r}")
    plans = ag_plans(args.ag_configs)  # a misspelt item stops here, before any work
    if args.dry_run:
        DEVICE.update(name="cpu", dtype=torch.float32)
        DIMS.update(H=2, K=32, V=32)
        args.shapes, args.lbs, args.no_fla, args.split_chunks = "1x200", "-1", True, args.split_chunks or 1
    elif not torch.cuda.is_available():
        raise SystemExit("kda_fused_lab needs a CUDA GPU (or --dry-run under TRITON_INTERPRET=1)")
    import triton

    from runners.versions import git_sha

    start = time.monotonic()
    fla = not args.no_fla and importlib.util.find_spec("fla") is not None
    args.out.mkdir(parents=True, exist_ok=True)
    env = {"gpu": torch.cuda.get_device_name() if not args.dry_run else "cpu (dry run)", "sha": git_sha(),
           "torch": torch.__version__, "triton": triton.__version__, "fla": fla}  # fmt: skip
    state: dict[str, Any] = {"command": " ".join(sys.argv), "rows": [], "env": env}
    cases = [(text, float(lb)) for text in args.shapes.split(",") for lb in args.lbs.split(",")]
    for text, lb in cases:
        if time.monotonic() - start > args.deadline_s:
            print(f"deadline: {text} lb {lb} not started", flush=True)
            continue
        B, T = (int(x) for x in text.lower().split("x"))
        state["rows"].append(measure(B, T, lb, fla=fla, ref_max_tokens=args.ref_max_tokens, split=args.split_chunks,
                                     forms=forms, old=not args.no_old, ag_configs=plans, ag_only=args.ag_only))  # fmt: skip
        print(json.dumps(state["rows"][-1]), flush=True)
        for ext, text_of in (("json", lambda st: json.dumps(st, indent=1) + "\n"), ("md", _markdown)):
            (args.out / f"kda_fused_lab.{ext}").write_text(text_of(state))
        if not args.dry_run:
            torch.cuda.empty_cache()
    print(_markdown(state))


if __name__ == "__main__":
    main()
