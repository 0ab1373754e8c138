"""GDN's two-kernel forward (issue 26, `kernels.ops.gdn.fused`) against today's WY forward and FlashQLA,
in one process on one GPU: o checked against the fp32 reference, then do_bench medians; GPU only.

    python benchmarks/fused_fwd_lab.py --out $OUT [--shapes 1x32768,1x131072,8x8192] [--lb -5] [--no-flash-qla]
        [--ref-max-tokens 32768] [--split-chunks N] [--configs 64:4:2,128:8:2] [--warm 0,2,4] [--deadline-s 540]
        [--variants exp2,tma,tma+ws@64:4:3,ag:two_chunks@32:1:2]   # (VARIANTS_DEFAULT: --variants default)
    TRITON_INTERPRET=1 python benchmarks/fused_fwd_lab.py --out /tmp/lab --dry-run   # CPU plumbing check, no timing

Inputs (the peers anchor's recipe, ../shared/anchors/peers-h200.md): bf16, H=HV=16, K=V=128, q and k L2-normalised,
g = lb * sigmoid(randn) fp32, beta = sigmoid(randn), B sequences packed as one varlen batch (`cu_seqlens`).
Per shape:
- check: o of each path against the fp32 per-token reference (`kernels.ops.gdn.naive`) up to --ref-max-tokens tokens,
  above that against the chunked torch path in fp32 (itself tested against the per-token one); relative L2;
- time (do_bench medians, warmup 25, rep 150): the old forward (`chunk_gdn_fwd(fwd_path="wy")`) and its two launchers
  (`wy_gdn_fwd`, `state_and_output`); the new one (`fwd_path="fused"`), its Ag pass (`wy_gdn_ag`, at its default
  16-row tiling and at 64-row tiles of 4 and 8 warps, each checked against the default's Ag) and the fused pass alone
  from a given Ag (the transitions, `seg_chain_fwd` and the state+output launch when the split runs, each also alone);
  with --splits the new forward at other segment lengths; FlashQLA's `chunk_gated_delta_rule` when it imports, at its
  default (`auto_cp=True`: its intra-card CP) and with `auto_cp=False` (its first call compiles, about 170 s cold);
- the bytes floor: q, k, v, g, beta read and o written once at 4.2 TB/s;
- with --warm w,...: the new forward with the split's gate-certified warmup of w chunks (`warm_chunks=w`, 0 = exact
  maps; `kernels.common.warm_split`), its error, the certified fraction of the (transition, head) pairs (read after the
  timed calls) and, where the windows exist, the two stages it adds alone: the windows' pass (the fused pass in
  state-only mode over the windows) and the certification (`certify_windows`, given the Ag pass's bound sums);
- with --configs BV:warps:stages,...: the fused pass from the given Ag at each launch config of
  `gdn_fused_state_output_fwd` (time and o's error each: a miscompile shows as an error, not a crash of the table);
- with --variants: the code variants of both passes (`LaunchConfig.VARIANT`), each caught on its own (a compile error
  or refusal is a row with its message, the lab goes on). A fused-pass variant is `+`-joined names of
  `kernels.ops.gdn.fused.FUSED_VARIANTS` (exp2, tma, pipe, ws) with an optional `@BV:warps:stages` (default 64:4:2):
  the fused pass from the given Ag (o's error against the reference) and its launchers alone (the transitions where
  the split runs, the state+output launch); an Ag-pass variant is `ag:<names of kernels.ops.gdn.wy_ag.AG_VARIANTS or
  base>@BK:warps:stages` (BR 16; its Ag's error against the default's). `--variants` also leaves out the old path
  and the BR 64 Ag rows, so that one call times only the new path and its variants.
Writes $OUT/fused_fwd_lab.{json,md} after every shape (a stopped run keeps its rows).
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

BT = 64
DIMS = {"H": 16, "K": 128, "V": 128}  # --dry-run: H=2, K=V=32
COPY_TBPS = 4.2
DEVICE = {"name": "cuda", "dtype": torch.bfloat16}  # --dry-run: "cpu", fp32 (the interpreter; wall-clock, one call)


def _inputs(B: int, T: int, lb: float, seed: int = 0) -> tuple[Any, ...]:
    """q, k, v, g, beta `[1, B*T, ...]` on the GPU, cu_seqlens int32 on the GPU and its host list."""
    dev = DEVICE["name"]
    gen = torch.Generator(device=dev).manual_seed(seed)
    n = B * T
    H, K, V = DIMS["H"], DIMS["K"], DIMS["V"]

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen, device=dev)

    q = torch.nn.functional.normalize(randn(1, n, H, K), dim=-1).to(DEVICE["dtype"])
    k = torch.nn.functional.normalize(randn(1, n, H, K), dim=-1).to(DEVICE["dtype"])
    v = randn(1, n, H, V).to(DEVICE["dtype"])
    g = lb * torch.sigmoid(randn(1, n, H))
    beta = torch.sigmoid(randn(1, n, H)).to(DEVICE["dtype"])
    bounds = [i * T for i in range(B + 1)]
    return q, k, v, g, beta, torch.tensor(bounds, dtype=torch.int32, device=dev), bounds


def _reference(q, k, v, g, beta, cu, bounds, max_tokens: int) -> tuple[torch.Tensor, str]:
    import kernels
    from kernels.ops.gdn.naive import naive_recurrent_gdn

    f = [x.float() for x in (q, k, v, g, beta)]
    if q.shape[1] <= max_tokens:
        o, _ = naive_recurrent_gdn(*f, scale=q.shape[-1] ** -0.5, cu_seqlens_cpu=bounds)
        return o, "per-token fp32"
    o, _ = kernels.forward("gdn", *f, cu_seqlens=cu, backend="torch")
    return o, "chunked torch fp32"


def _ms(fn: Any) -> float:
    if DEVICE["name"] != "cuda":
        t0 = time.perf_counter()
        fn()
        return (time.perf_counter() - t0) * 1e3
    from triton.testing import do_bench

    return float(do_bench(fn, warmup=25, rep=150, return_mode="median"))


def _floor_ms(n_tokens: int, H: int, K: int, V: int) -> float:
    per_token_head = (K + K + V + V) * 2 + 4 + 2  # q, k, v read, o written (bf16); g fp32, beta bf16
    return n_tokens * H * per_token_head / (COPY_TBPS * 1e12) * 1e3


def measure(
    B: int,
    T: int,
    lb: float,
    *,
    flash_qla: bool,
    ref_max_tokens: int,
    split: int | None,
    configs: list[str],
    splits: tuple[int, ...] = (),
    warms: tuple[int, ...] = (),
    variants: tuple[str, ...] = (),
) -> dict[str, Any]:
    from kernels.common.index import prepare_chunk_index
    from kernels.common.seqsplit import resolve_split, seg_chain_fwd, state_and_output, whole_sequences
    from kernels.common.wy import wy_gdn_fwd
    from kernels.configs import LaunchConfig
    from kernels.ops.gdn.chunk import chunk_gdn_fwd
    from kernels.ops.gdn.fused import (
        gdn_fused_fwd,
        gdn_fused_state_output,
        gdn_fused_transition,
    )
    from kernels.ops.gdn.wy_ag import wy_gdn_ag
    from kernels.plan import default_plan
    from runners.correctness import rel_l2

    q, k, v, g, beta, cu, bounds = _inputs(B, T, lb)
    H, K, V = v.shape[2], k.shape[3], v.shape[3]
    scale = K**-0.5
    launch = default_plan()
    index = prepare_chunk_index(cu, batch=1, seq_len=B * T, chunk_size=BT, device=q.device, cu_seqlens_cpu=bounds)
    row: dict[str, Any] = {"B": B, "T": T, "lb": lb, "floor_ms": _floor_ms(B * T, H, K, V)}

    def old() -> Any:
        return chunk_gdn_fwd(q, k, v, g, beta, scale=scale, cu_seqlens=cu, split_chunks=split, fwd_path="wy")

    def new() -> Any:
        return chunk_gdn_fwd(q, k, v, g, beta, scale=scale, cu_seqlens=cu, split_chunks=split, fwd_path="fused")

    o_ref, row["reference"] = _reference(q, k, v, g, beta, cu, bounds, ref_max_tokens)
    row["err_new"] = rel_l2(new()[0], o_ref)
    row["new_ms"] = _ms(new)
    if not variants:  # the old path and its two launchers
        row["err_old"] = rel_l2(old()[0], o_ref)
        row["old_ms"] = _ms(old)
        w, u, gcum_old, aqk = wy_gdn_fwd(q, k, v, g, beta, scale=scale, index=index, launch=launch)
        row["old_wy_ms"] = _ms(lambda: wy_gdn_fwd(q, k, v, g, beta, scale=scale, index=index, launch=launch))
        row["old_state_output_ms"] = _ms(lambda: state_and_output(
            index=index, k=k, w=w, u=u, g=gcum_old, q=q, aqk=aqk, gate_vector=False, scale=scale, initial_state=None,
            output_final_state=False, out_dtype=q.dtype, launch=launch, split_chunks=split, fuse_output=True))  # fmt: skip

    # the new path: the Ag pass (its default tiling and the 64-row one), the fused pass from a given Ag, its launchers
    ag, gcum = wy_gdn_ag(k, g, beta, index=index, launch=launch)
    row["ag_ms"] = _ms(lambda: wy_gdn_ag(k, g, beta, index=index, launch=launch))
    for br, warps in ((64, 4), (64, 8)) if not variants else ():
        wide = launch.with_configs({"wy_gdn_ag_fwd": LaunchConfig(BR=br, BK=64, num_warps=warps, num_stages=2)})
        try:
            row[f"ag_br{br}w{warps}_err"] = rel_l2(wy_gdn_ag(k, g, beta, index=index, launch=wide)[0], ag)
            row[f"ag_br{br}w{warps}_ms"] = _ms(lambda wide=wide: wy_gdn_ag(k, g, beta, index=index, launch=wide))
        except Exception as err:  # noqa: BLE001  (a config that fails to compile is a row, not a crash)
            row[f"ag_br{br}w{warps}_error"] = f"{type(err).__name__}: {err}"
    for seg in splits:

        def at(seg: int = seg) -> Any:
            return chunk_gdn_fwd(q, k, v, g, beta, scale=scale, cu_seqlens=cu, split_chunks=seg, fwd_path="fused")

        row[f"new_split{seg}_err"] = rel_l2(at()[0], o_ref)
        row[f"new_split{seg}_ms"] = _ms(at)

    for w in warms:
        row.update(_warm_row(w, q, k, v, g, beta, cu, o_ref, split=split, index=index, launch=launch))

    def given(*_: Any, **__: Any) -> tuple[torch.Tensor, torch.Tensor]:
        return ag, gcum

    def fused_pass(plan: Any = launch) -> Any:
        return gdn_fused_fwd(q, k, v, g, beta, scale=scale, index=index, launch=plan, split_chunks=split, ag_prep=given)

    row["new_pass_ms"] = _ms(fused_pass)
    for text in configs:
        bv, warps, stages = (int(x) for x in text.split(":"))
        cfg = LaunchConfig(BV=bv, num_warps=warps, num_stages=stages)
        variant = launch.with_configs({"gdn_fused_state_output_fwd": cfg})
        row[f"new_pass_{text}_err"] = rel_l2(fused_pass(variant)[0], o_ref)
        row[f"new_pass_{text}_ms"] = _ms(lambda variant=variant: fused_pass(variant))
    plan = resolve_split(index, split, H=H, NV=-(-V // 64), device=q.device)
    row["segments"] = plan.num_segments if plan is not None else 0
    layout, h0 = whole_sequences(index), None
    if plan is not None:
        M, S = gdn_fused_transition(k, v, ag, gcum, layout=plan.transitions, BT=BT, launch=launch)
        row["new_transition_ms"] = _ms(
            lambda: gdn_fused_transition(k, v, ag, gcum, layout=plan.transitions, BT=BT, launch=launch)
        )
        row["new_chain_ms"] = _ms(lambda: seg_chain_fwd(M, S, None, plan, launch=launch))
        layout, h0 = plan.final, seg_chain_fwd(M, S, None, plan, launch=launch)
    row["new_state_output_ms"] = _ms(
        lambda: gdn_fused_state_output(q, k, v, ag, gcum, layout=layout, BT=BT, scale=scale, h0=h0, launch=launch)
    )
    lanes = {"ag": (ag, gcum), "index": index, "launch": launch, "plan": plan, "layout": layout, "h0": h0}
    for name in variants:
        try:
            got = _variant_row(name, q, k, v, g, beta, o_ref, fused_pass, **lanes)
            row.update(got)
            print(json.dumps({"B": B, "T": T, **got}), flush=True)
        except Exception as err:  # noqa: BLE001  (a variant that fails to compile or is refused is a row, not a crash)
            row[f"var_{name}_error"] = f"{type(err).__name__}: {str(err).strip().splitlines()[-1][:300]}"
            print(f"variant {name}: {row[f'var_{name}_error']}", flush=True)

    if flash_qla:
        import flash_qla as fq

        t0 = time.perf_counter()
        o_fq, _ = fq.chunk_gated_delta_rule(q, k, v, g, beta, scale=scale, cu_seqlens=cu)
        row["flash_qla_first_call_s"] = time.perf_counter() - t0
        row["err_flash_qla"] = rel_l2(o_fq, o_ref)
        row["flash_qla_ms"] = _ms(lambda: fq.chunk_gated_delta_rule(q, k, v, g, beta, scale=scale, cu_seqlens=cu))
        row["flash_qla_nocp_ms"] = _ms(
            lambda: fq.chunk_gated_delta_rule(q, k, v, g, beta, scale=scale, cu_seqlens=cu, auto_cp=False)
        )
    return row


def _warm_row(w: int, q, k, v, g, beta, cu, o_ref, *, split: int | None, index: Any, launch: Any) -> dict[str, Any]:
    """The new forward with a warm window of w chunks: ms, err, certified fraction; the windows' pass and the
    certification alone where the split has windows of that length."""
    from kernels.common.seqsplit import resolve_split
    from kernels.common.warm_split import certify_windows, warm_inputs, window_plan, with_chunk_bound
    from kernels.ops.gdn.chunk import chunk_gdn_fwd
    from kernels.ops.gdn.fused import gdn_fused_state_output
    from kernels.ops.gdn.wy_ag import wy_gdn_ag
    from runners.correctness import rel_l2

    report: dict[str, torch.Tensor] = {}
    opts = {"scale": k.shape[-1] ** -0.5, "cu_seqlens": cu, "split_chunks": split, "fwd_path": "fused"}

    def fwd() -> Any:
        return chunk_gdn_fwd(q, k, v, g, beta, warm_chunks=w, warm_report=report, **opts)

    row: dict[str, Any] = {f"new_warm{w}_err": rel_l2(fwd()[0], o_ref), f"new_warm{w}_ms": _ms(fwd)}
    if "certified" in report:
        row[f"new_warm{w}_certified"] = float(report["certified"].float().mean())  # after the timed calls
    plan = resolve_split(index, split, H=v.shape[2], NV=-(-v.shape[3] // 64), device=q.device)
    x = with_chunk_bound(warm_inputs("gdn", k, v, g, beta, w), index.num_chunks)
    if plan is None or x is None:
        return row
    wp = window_plan(index, list(plan.bounds_cpu), list(plan.chunk_bounds_cpu), list(plan.transitions_cpu), w,
                     seg_chunks=plan.seg_chunks, cache={})  # fmt: skip
    if wp is None:
        return row
    ag, gcum = wy_gdn_ag(k, g, beta, index=index, launch=launch, bnd=x.chunk_bound, v=v)

    def windows() -> Any:
        return gdn_fused_state_output(None, k, v, ag, gcum, layout=wp.layout, BT=BT, output_final_state=True, launch=launch)[1]

    E_win = windows()
    row[f"warm{w}_windows_ms"] = _ms(windows)
    row[f"warm{w}_certify_ms"] = _ms(lambda: certify_windows(x, wp, E_win, None))
    return row


# --variants default: the Ag pass with exp2, at 2 and 4 warps (ptxas sm_90: 40 B spilled at 2, none at 4) and with two
# chunks per program at 4 warps; the fused pass's variants alone and together, TMA at 3 stages; warp specialisation
# last (a hang or a dead CUDA context there costs only what follows it; each variant's figures print as they come)
VARIANTS_DEFAULT = ("ag:exp2", "ag:base@32:2:2", "ag:base@32:4:2", "ag:two_chunks@32:4:2", "exp2", "pipe", "tma",
                    "exp2+tma", "tma@64:4:3", "tma+ws", "exp2+tma+ws")  # fmt: skip


def variant_config(name: str) -> tuple[str, Any]:
    """(kernel name, LaunchConfig) of one --variants item (module docstring); ValueError on a name it cannot read."""
    from kernels.configs import LaunchConfig
    from kernels.ops.gdn.fused import FUSED_VARIANTS
    from kernels.ops.gdn.wy_ag import AG_VARIANTS

    body, _, at = name.partition("@")
    is_ag = body.startswith("ag:")
    names, table = (body.removeprefix("ag:"), AG_VARIANTS) if is_ag else (body, FUSED_VARIANTS)
    unknown = [n for n in names.split("+") if n not in table and n != "base"]
    if unknown:
        raise ValueError(f"variant {name!r}: unknown {unknown}; known: {sorted(table)} (and base)")
    bits = sum(table.get(n, 0) for n in names.split("+")) or None
    a, warps, stages = (int(x) for x in (at or ("32:1:2" if is_ag else "64:4:2")).split(":"))
    if is_ag:
        return "wy_gdn_ag_fwd", LaunchConfig(BK=a, BV=64, num_warps=warps, num_stages=stages, BR=16, VARIANT=bits)
    return "gdn_fused_state_output_fwd", LaunchConfig(BV=a, num_warps=warps, num_stages=stages, VARIANT=bits)


def _variant_row(name: str, q, k, v, g, beta, o_ref, fused_pass, *, ag, index, launch, plan, layout, h0) -> dict[str, Any]:
    """One --variants item: its times and error (keys var_<name>_*)."""
    from kernels.ops.gdn.fused import gdn_fused_state_output, gdn_fused_transition
    from kernels.ops.gdn.wy_ag import wy_gdn_ag
    from runners.correctness import rel_l2

    kernel, cfg = variant_config(name)
    at = launch.with_configs({kernel: cfg})
    key = f"var_{name}"
    if kernel == "wy_gdn_ag_fwd":
        row = {f"{key}_err": rel_l2(wy_gdn_ag(k, g, beta, index=index, launch=at)[0], ag[0])}
        row[f"{key}_ms"] = _ms(lambda: wy_gdn_ag(k, g, beta, index=index, launch=at))
        return row
    row = {f"{key}_err": rel_l2(fused_pass(at)[0], o_ref), f"{key}_ms": _ms(lambda: fused_pass(at))}
    if plan is not None:
        row[f"{key}_transition_ms"] = _ms(lambda: gdn_fused_transition(k, v, *ag, layout=plan.transitions, BT=BT, launch=at))
    row[f"{key}_state_output_ms"] = _ms(lambda: gdn_fused_state_output(
        q, k, v, *ag, layout=layout, BT=BT, scale=k.shape[-1] ** -0.5, h0=h0, launch=at))  # fmt: skip
    return row


COLUMNS = [
    ("B", "B"),
    ("T", "T"),
    ("floor_ms", "floor"),
    ("old_ms", "old fwd"),
    ("new_ms", "new fwd"),
    ("new_pass_ms", "new pass (given Ag)"),
    ("flash_qla_ms", "FlashQLA (default: auto_cp)"),
    ("flash_qla_nocp_ms", "FlashQLA auto_cp=False"),
    ("old_wy_ms", "old: wy"),
    ("old_state_output_ms", "old: state+o"),
    ("ag_ms", "new: Ag pass"),
    ("new_transition_ms", "new: trans"),
    ("new_chain_ms", "new: chain"),
    ("new_state_output_ms", "new: state+o"),
    ("segments", "segments"),
    ("err_old", "err old"),
    ("err_new", "err new"),
    ("err_flash_qla", "err FlashQLA"),
]


def _markdown(state: dict[str, Any]) -> str:
    lines = [
        "# GDN two-kernel forward lab (`benchmarks/fused_fwd_lab.py`)",
        "",
        f"Command: `{state['command']}`  ",
        f"Environment: `{json.dumps(state['env'])}`",
        "",
        "Times in ms (do_bench medians); floor = q, k, v, g, beta read + o written at 4.2 TB/s; err = relative L2 of "
        "o against the fp32 reference (column `reference` in the JSON).",
        "",
        "| " + " | ".join(h for _, h in COLUMNS) + " |",
        "|" + "---:|" * len(COLUMNS),
    ]
    for row in state["rows"]:
        cells = []
        for key, _ in COLUMNS:
            x = row.get(key)
            cells.append(
                "" if x is None else f"{x:.3e}" if key.startswith("err") else f"{x:.3f}" if isinstance(x, float) else str(x)
            )
        lines.append("| " + " | ".join(cells) + " |")
    variants = [(r, key.removeprefix("new_pass_").removesuffix("_ms")) for r in state["rows"] for key in r
                if key.startswith("new_pass_") and key.endswith("_ms") and ":" in key]  # fmt: skip
    if variants:
        lines += ["", "Fused pass (given Ag) per launch config BV:warps:stages", "", "| B | T | config | ms | err |",
                  "|---:|---:|---|---:|---:|"]  # fmt: skip
        for r, c in variants:
            lines.append(f"| {r['B']} | {r['T']} | {c} | {r[f'new_pass_{c}_ms']:.3f} | {r[f'new_pass_{c}_err']:.3e} |")
    others = [(r, key.removesuffix("_ms")) for r in state["rows"] for key in r
              if key.endswith("_ms") and (key.startswith("ag_br") or key.startswith("new_split"))]  # fmt: skip
    if others:
        lines += ["", "Variants: the Ag pass at 64-row tiles (err against the default tiling's Ag), the new forward at "
                  "other segment lengths (chunks; err against the reference)", "", "| B | T | variant | ms | err |",
                  "|---:|---:|---|---:|---:|"]  # fmt: skip
        for r, c in others:
            lines.append(f"| {r['B']} | {r['T']} | {c} | {r[f'{c}_ms']:.3f} | {r.get(f'{c}_err', float('nan')):.3e} |")
    names = list(dict.fromkeys(key[4:].removesuffix("_error").removesuffix("_err") for r in state["rows"] for key in r
                               if key.startswith("var_") and key.endswith(("_err", "_error"))))  # fmt: skip
    if names:
        lines += ["", "Code variants (`--variants`; `LaunchConfig.VARIANT`): a fused-pass variant times the fused pass "
                  "given Ag (err: o against the reference) and its launchers alone, against the default's (base row); an "
                  "ag: variant times the Ag pass (err: its Ag against the default's)", "",
                  "| B | T | variant | ms | trans ms | state+o ms | err | failure |", "|---:|---:|---|---:|---:|---:|---:|---|"]  # fmt: skip
        for r in state["rows"]:
            base = ["base (default config)", r.get("new_pass_ms"), r.get("new_transition_ms"), r.get("new_state_output_ms"),
                    r.get("err_new"), ""]  # fmt: skip
            ag = ["ag:base (default config)", r.get("ag_ms"), None, None, None, ""]
            rows = [base, ag] + [[n, r.get(f"var_{n}_ms"), r.get(f"var_{n}_transition_ms"),
                                  r.get(f"var_{n}_state_output_ms"), r.get(f"var_{n}_err"), r.get(f"var_{n}_error", "")]
                                 for n in names]  # fmt: skip
            for n, *xs, err, fail in rows:
                cells = ["" if x is None else f"{x:.3f}" for x in xs] + ["" if err is None else f"{err:.3e}"]
                lines.append(f"| {r['B']} | {r['T']} | {n} | " + " | ".join(cells) + f" | {fail} |")
    warm = sorted({int(key[8:-3]) for r in state["rows"] for key in r if key.startswith("new_warm") and key.endswith("_ms")})
    if warm:
        lines += ["", "The new forward with the gate-certified warm split (`--warm`: window w chunks, 0 = exact maps); "
                  "certified: the fraction of (transition, head) pairs; the windows' pass and the certification alone",
                  "", "| B | T | w | ms | err | certified | windows pass ms | certify ms |",
                  "|---:|---:|---:|---:|---:|---:|---:|---:|"]  # fmt: skip
        for r in state["rows"]:
            for w in warm:
                cells = [r.get(f"new_warm{w}_{c}") for c in ("ms", "err", "certified")]
                cells += [r.get(f"warm{w}_{c}_ms") for c in ("windows", "certify")]
                text = ["" if x is None else f"{x:.3e}" if i == 1 else f"{x:.3f}" for i, x in enumerate(cells)]
                lines.append(f"| {r['B']} | {r['T']} | {w} | " + " | ".join(text) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--shapes", default="1x32768,1x131072,8x8192", help="BxT,... (B sequences of T tokens)")
    p.add_argument("--lb", type=float, default=-5.0, help="gate g = lb * sigmoid(randn)")
    p.add_argument("--no-flash-qla", action="store_true", help="skip FlashQLA even when it imports")
    p.add_argument("--ref-max-tokens", type=int, default=32768, help="per-token reference up to this many tokens")
    p.add_argument("--configs", default="", help="BV:warps:stages,... of the fused pass to time (given Ag)")
    p.add_argument("--split-chunks", type=int, default=None, help="segment length in chunks (default: automatic)")
    p.add_argument("--splits", default="", help="also time the new forward at these segment lengths (chunks), e.g. 8,16,32")
    p.add_argument("--warm", default="", help="also time the new forward with these warm windows (chunks), e.g. 0,2,4")
    p.add_argument("--variants", default="", help="code variants of both passes to time ('default': VARIANTS_DEFAULT)")
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="CPU under TRITON_INTERPRET=1: H=2, K=V=32, 1x200 and 2x70 tokens, split 1 (or --split-chunks)",
    )
    p.add_argument("--deadline-s", type=float, default=540.0, help="start no new shape after this many seconds")
    args = p.parse_args(argv)
    if args.dry_run:
        DEVICE["name"], args.shapes, args.no_flash_qla = "cpu", "1x200,2x70", True
        args.split_chunks = args.split_chunks or 1
        DIMS.update(H=2, K=32, V=32)
        DEVICE["dtype"] = torch.float32
    elif not torch.cuda.is_available():
        raise SystemExit("fused_fwd_lab needs a CUDA GPU (or --dry-run under TRITON_INTERPRET=1)")
    import triton

    from runners.versions import git_sha

    variants = VARIANTS_DEFAULT if args.variants == "default" else tuple(x for x in args.variants.split(",") if x)
    for name in variants:
        variant_config(name)  # a misspelt variant stops the lab before any work
    start = time.monotonic()
    flash_qla = not args.no_flash_qla and importlib.util.find_spec("flash_qla") is not None
    args.out.mkdir(parents=True, exist_ok=True)
    state: dict[str, Any] = {
        "command": " ".join(sys.argv),
        "rows": [],
        "env": {
            "gpu": torch.cuda.get_device_name() if not args.dry_run else "cpu (dry run)",
            "sha": git_sha(),
            "torch": torch.__version__,
            "triton": triton.__version__,
            "flash_qla": flash_qla,
        },
    }
    for text in args.shapes.split(","):
        if time.monotonic() - start > args.deadline_s:
            print(f"deadline: {text} not started", flush=True)
            break
        B, T = (int(x) for x in text.lower().split("x"))
        row = measure(
            B,
            T,
            args.lb,
            flash_qla=flash_qla,
            ref_max_tokens=args.ref_max_tokens,
            split=args.split_chunks,
            configs=[c for c in args.configs.split(",") if c],
            splits=tuple(int(x) for x in args.splits.split(",") if x),
            warms=tuple(int(x) for x in args.warm.split(",") if x),
            variants=variants,
        )
        print(json.dumps(row), flush=True)
        state["rows"].append(row)
        (args.out / "fused_fwd_lab.json").write_text(json.dumps(state, indent=1) + "\n")
        (args.out / "fused_fwd_lab.md").write_text(_markdown(state))
        if not args.dry_run:
            torch.cuda.empty_cache()
    print(_markdown(state))


if __name__ == "__main__":
    main()
