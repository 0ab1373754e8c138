"""GPU benchmark of the Triton forward against FLA's on the same inputs, with floors and correctness checks.

    cpbench bench kernels [--out benchmarks/results] [--ops gdn,kda] [--shapes 1x8192,8x8192] [--explore]
                          [--no-fla] [--jobs 8] [--dry-run]      (also: python -m runners.bench.kernels ...)

Method (the one ../shared/anchors/fla-h200.md used for FLA, so our figures stand next to FLA's published ones;
that is why the inputs take `runners.workload`'s FLA recipe, not a sweep point's): bf16, H=16, K=V=128; q, k L2-normalised in
fp32, v = randn, beta = sigmoid(randn), g = logsigmoid(randn) ([B,T,H] for GDN, [B,T,H,K] for KDA); forward
only, under no_grad, no final state; `triton.testing.do_bench` median (L2 flushed between repetitions,
warm-up 25 ms, 200 ms of repetitions) after one untimed call that compiles (and, for FLA, autotunes).
FLA runs with FLA_DISABLE_BACKEND_DISPATCH=1 (its Triton path). Ours is timed through the public entry
`kernels.forward(..., backend="triton")`, the same inputs as FLA in the same process.

Floors: bytes (q, k, v, g, beta read once and o written once) over the measured device-to-device copy
bandwidth; flops of the chunked algorithm (K K^T, Q K^T, w, u, A v: 2 C^2 (3K + 2V); w S, q S, K^T v: 6 K V,
per chunk and head) over the measured bf16 matmul rate. The floor is the larger of the two.

Correctness: ours vs the fp32 per-token reference (`kernels.reference`) on reduced shapes (dense, varlen
with odd lengths and an initial state, a slow-decay gate that makes the segment chain matter, fp32 inputs),
the transition (M S0 + S_ext vs the final state from S0), and ours vs FLA at every benchmark shape.

`--explore` also times variants (segment lengths of the intra-device split, output fused or not, launch
configs) so the defaults can be chosen from measurements; compilation of all variants is first done in
parallel worker processes (`--jobs`) on small inputs with the same specialisations, filling Triton's cache.
Writes `kernels_<device>.json` and `.md` into `--out`. `--dry-run` runs the plumbing on CPU (interpreter,
tiny shapes, wall-clock timer, no FLA) to check the script itself.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
from collections.abc import Callable
from typing import Any

import torch

from runners.bench.common import environment, result_stem
from runners.bench.kernels_ops import (
    FLA_MS_ANCHOR,
    H_DEFAULT,
    K_DIM,
    SHAPES_DEFAULT,
    V_DIM,
    Timer,
    _timed,
    bytes_floor,
    fla_fn,
    fla_inputs,
    flops_floor,
    measure_ceilings,
    ours,
    variants,
)
from runners.bench.kernels_report import to_markdown
from runners.correctness import rel_l2

# ---------------------------------------------------------------------------------------------------------------------
# parallel precompile (fills Triton's on-disk cache; the timed process then only loads binaries)


def _warm_job(job: tuple[str, int, int, str, dict[str, Any]]) -> str:
    op, B, T, label, kw = job
    try:
        if label == "correctness":
            rows = correctness([op], "cuda", quiet=True)
            return f"{op} correctness: " + ", ".join(r.get("error", "ok") for r in rows)
        q, k, v, g, beta = fla_inputs(op, B, T, H_DEFAULT, device="cuda").tensors
        with torch.no_grad():
            ours(op, q, k, v, g, beta, **kw)
        torch.cuda.synchronize()
        return f"{op} {label}: ok"
    except Exception as err:  # noqa: BLE001 - reported, the timed run will show it again
        return f"{op} {label}: {type(err).__name__}: {err}"


def precompile(ops: list[str], shapes: list[tuple[int, int]], explore: bool | str | None, jobs: int, timeout_s: float = 150,
               warm: tuple[int, ...] = ()) -> list[str]:
    """Run every variant once on a small input with the same specialisations, `jobs` processes at a time.

    Only the launch specialisations matter (split or not, fused or not, configs), so split lengths collapse
    to one stand-in. Failures and a timeout are reported, never raised: the timed run compiles what is missing.
    """
    import multiprocessing as mp

    todo: list[tuple[str, int, int, str, dict[str, Any]]] = [(op, 0, 0, "correctness", {}) for op in ops]
    seen: set[str] = set()
    for op in ops:
        for B, T in shapes:
            for label, kw in variants(op, B, T, explore, warm):
                small = (2, 1024) if B > 1 else (1, 4096)
                kw2 = dict(kw)
                # the automatic rule splits every B=1 shape and none of the B=8 ones
                kw2.setdefault("split", 8 if B == 1 else 0)
                kw2["split"] = 8 if kw2["split"] else 0
                key = f"{op}|{small}|{sorted((a, repr(b)) for a, b in kw2.items())}"
                if key not in seen:
                    seen.add(key)
                    todo.append((op, *small, label, kw2))
    if jobs <= 1:
        return [_warm_job(j) for j in todo]
    ctx = mp.get_context("spawn")
    pool = ctx.Pool(jobs)
    try:
        return list(pool.map_async(_warm_job, todo, chunksize=1).get(timeout=timeout_s))
    except Exception as err:  # noqa: BLE001 - a timeout or a broken pool: carry on, kernels compile on first use
        return [f"precompile stopped: {type(err).__name__}: {err}"]
    finally:
        pool.terminate()
        pool.join()


# ---------------------------------------------------------------------------------------------------------------------
# correctness


DRY_RUN_SHAPES = [(1, 128)]  # --dry-run: a tiny shape (B x T), H=2, K=V=32, in the Triton interpreter
DRY_RUN_REPS = (0, 1)  # --dry-run: warm-up and timed calls of each variant (the CPU timer makes 1 to 3 calls)
DRY_RUN_CHECKS = ("varlen+h0",)  # --dry-run: the correctness case (varlen, initial state, T=128) per op


def correctness(ops: list[str], device: str, quiet: bool = False) -> list[dict[str, Any]]:
    """Ours vs the fp32 per-token reference on reduced shapes (bf16 inputs unless stated)."""
    import kernels

    small = device != "cuda"
    # H=16 on the GPU: the same specialisations as the timed shapes (compiled once, in the precompile phase)
    H, K, V = (2, 32, 32) if small else (H_DEFAULT, K_DIM, V_DIM)
    T = 128 if small else 2048
    rows: list[dict[str, Any]] = []
    for op in ops:
        cases: list[tuple[str, dict[str, Any], dict[str, Any]]] = [
            ("dense B=2", {"B": 2, "T": T // 2}, {}),
            ("varlen+h0", {"B": 1, "T": T, "cu": [0, 37, 37 + T // 3, T - 5, T]}, {"h0": True}),
            ("slow decay lb=-0.01, split auto", {"B": 1, "T": T, "lb": -0.01}, {"h0": True}),
            ("slow decay, split 1 chunk", {"B": 1, "T": T, "lb": -0.01}, {"h0": True, "split": 1}),
            ("slow decay, unfused", {"B": 1, "T": T, "lb": -0.01}, {"h0": True, "fuse": False}),
            ("fp32 inputs", {"B": 1, "T": T // 2, "dtype": "float32"}, {"h0": True}),
        ]
        for name, shp, opt in cases:
            if small and name not in DRY_RUN_CHECKS:
                continue
            print(f"check {op} {name}", flush=True)
            rec: dict[str, Any] = {"op": op, "case": name, "H": H, "K": K, "V": V}
            try:
                q, k, v, g, beta = fla_inputs(op, shp["B"], shp["T"], H, device=device, K=K, V=V, seed=1,
                                              lb=shp.get("lb"), dtype=shp.get("dtype", "bfloat16")).tensors
                cu = shp.get("cu")
                cu_t = torch.tensor(cu, dtype=torch.int32, device=device) if cu else None
                N = len(cu) - 1 if cu else shp["B"]
                h0 = torch.randn(N, H, K, V, device=device) if opt.get("h0") else None
                with torch.no_grad():
                    o_ref, ht_ref = kernels.reference(op, q, k, v, g, beta, initial_state=h0, output_final_state=True,
                                                      cu_seqlens=cu_t)
                    o_ref32, _ = kernels.reference(op, *(x.float() for x in (q, k, v, g, beta)), initial_state=h0,
                                                   cu_seqlens=cu_t)
                    kw = {k2: opt[k2] for k2 in ("split", "fuse") if k2 in opt}
                    o, ht = ours(op, q, k, v, g, beta, initial_state=h0, output_final_state=True, cu_seqlens=cu_t, **kw)
                rec.update(T=shp["T"], B=shp["B"], dtype=str(q.dtype).removeprefix("torch."),
                           o_rel_l2=rel_l2(o, o_ref32), ht_rel_l2=rel_l2(ht, ht_ref),
                           ref_bf16_rounding=rel_l2(o_ref, o_ref32))
                # transition: M S0 + S_ext == final state from S0
                M, S_ext = kernels.transition(op, k, v, g, beta, cu_seqlens=cu_t, backend="triton")
                S0 = torch.randn(N, H, K, V, device=device)
                _, ht_s0 = kernels.reference(op, q, k, v, g, beta, initial_state=S0, output_final_state=True,
                                             cu_seqlens=cu_t)
                rec["transition_rel_l2"] = rel_l2(M @ S0 + S_ext, ht_s0)
            except Exception as err:  # noqa: BLE001 - recorded in the results
                rec["error"] = f"{type(err).__name__}: {err}"
                if not quiet:
                    traceback.print_exc()
            rows.append(rec)
            if not quiet:
                print("CHECK", json.dumps(rec, default=str), flush=True)
    return rows


# ---------------------------------------------------------------------------------------------------------------------
# main


# the arguments of this run as the benchmark saw them (also when started through `cpbench bench kernels`)
ARGV: list[str] = []


def _shape(text: str) -> tuple[int, int]:
    """`"8x8192"` -> (8, 8192): a `--shapes` item, B x T."""
    B, T = (int(x) for x in text.split("x"))
    return B, T


def _env(device: str) -> dict[str, Any]:
    return environment(torch.device(device, 0) if device == "cuda" else torch.device("cpu"),
                       command=" ".join([os.path.basename(sys.executable), "-m", "runners.bench.kernels", *ARGV]),
                       cpu_label="cpu (dry run, interpreter)",
                       env_vars=("FLA_DISABLE_BACKEND_DISPATCH", "NCCL_NVLS_ENABLE", "TRITON_CACHE_DIR"))


def run(args: argparse.Namespace) -> dict[str, Any]:
    device = "cpu" if args.dry_run else "cuda"
    ops = args.ops.split(",")
    shapes = [_shape(s) for s in args.shapes.split(",")] if args.shapes else list(SHAPES_DEFAULT)
    if args.dry_run:
        shapes = list(DRY_RUN_SHAPES)
    H = 2 if args.dry_run else H_DEFAULT
    K = V = 32 if args.dry_run else K_DIM
    timer = Timer(device == "cuda")
    t_start = time.time()
    result: dict[str, Any] = {"env": _env(device), "H": H, "K": K, "V": V, "shapes": shapes, "lb": args.lb}
    if device == "cuda" and args.jobs > 0:
        t0 = time.time()
        result["precompile"] = precompile(ops, shapes, args.explore, args.jobs, warm=_ints(args.warm))
        result["precompile_s"] = round(time.time() - t0, 1)
        print(f"precompile {result['precompile_s']} s:", *result["precompile"], sep="\n  ", flush=True)
    result["ceilings"] = measure_ceilings(timer, device)
    print("ceilings", result["ceilings"], flush=True)
    if not args.no_check:
        result["correctness"] = correctness(ops, device)
    bw = result["ceilings"]["copy_GBps"] * 1e9
    mm = result["ceilings"]["matmul_TFLOPs"] * 1e12
    rows: list[dict[str, Any]] = []
    explore_rows: list[dict[str, Any]] = []
    for B, T in shapes:
        for op in ops:
            print(f"[{time.time() - t_start:.0f}s] {op} B={B} T={T}", flush=True)
            if args.deadline and time.time() - t_start > args.deadline:
                print(f"deadline reached, skipping {op} {B}x{T}", flush=True)
                continue
            q, k, v, g, beta = fla_inputs(op, B, T, H, device=device, K=K, V=V, lb=args.lb).tensors
            rec: dict[str, Any] = {"op": op, "B": B, "T": T, "H": H, "K": K, "V": V,
                                   "bytes": bytes_floor(op, B, T, H, K, V), "flops": flops_floor(B, T, H, K, V)}
            rec["floor_bytes_ms"] = rec["bytes"] / bw * 1e3 if bw == bw else float("nan")
            rec["floor_flops_ms"] = rec["flops"] / mm * 1e3 if mm == mm else float("nan")
            rec["floor_ms"] = max(rec["floor_bytes_ms"], rec["floor_flops_ms"])
            o_fla = None
            if not args.no_fla and device == "cuda":
                try:
                    fn = fla_fn(op)
                    t0 = time.time()
                    with torch.no_grad():
                        o_fla, _ = fn(q, k, v, g, beta)
                    torch.cuda.synchronize()
                    rec["fla_first_call_s"] = round(time.time() - t0, 1)
                    with torch.no_grad():
                        rec["fla_ms"], rec["fla_p20"], rec["fla_p80"] = _timed(timer, fn, q, k, v, g, beta)
                except Exception as err:  # noqa: BLE001
                    rec["fla_error"] = f"{type(err).__name__}: {err}"
                    traceback.print_exc()
            rec["fla_anchor_ms"] = FLA_MS_ANCHOR.get((op, B, T))
            for label, kw in variants(op, B, T, args.explore, _ints(args.warm), _ints(args.warm_splits)):
                vrec: dict[str, Any] = {"op": op, "B": B, "T": T, "variant": label,
                                        "kwargs": {a: repr(b) for a, b in kw.items()}}
                try:
                    t0 = time.time()
                    with torch.no_grad():
                        o, _ = ours(op, q, k, v, g, beta, **kw)
                    if device == "cuda":
                        torch.cuda.synchronize()
                    vrec["first_call_s"] = round(time.time() - t0, 2)
                    if o_fla is not None:
                        vrec["rel_l2_vs_fla"] = rel_l2(o, o_fla)
                    del o
                    reps = (25, 200) if label == "ours" else (10, 100)  # variants: shorter, still >= 10 calls
                    if args.dry_run:  # the interpreter: a check that the script runs, not a timing
                        reps = DRY_RUN_REPS
                    with torch.no_grad():
                        vrec["ms"], vrec["p20"], vrec["p80"] = _timed(timer, ours, op, q, k, v, g, beta, warmup=reps[0],
                                                                      rep=reps[1], **kw)
                except Exception as err:  # noqa: BLE001
                    vrec["error"] = f"{type(err).__name__}: {err}"
                    traceback.print_exc()
                if kw.get("warm"):
                    vrec.update(_certified(op, q, k, v, g, beta, kw))
                print("VARIANT", json.dumps(vrec, default=str), flush=True)
                if label == "ours":
                    rec.update({k2: vrec.get(k2) for k2 in ("ms", "p20", "p80", "first_call_s", "rel_l2_vs_fla", "error")})
                else:
                    explore_rows.append(vrec)
            if args.profile and device == "cuda":
                try:
                    rec["profile"] = profile_kernels(op, q, k, v, g, beta, timer, warm=max(_ints(args.warm), default=0))
                except Exception as err:  # noqa: BLE001
                    rec["profile"] = {"error": f"{type(err).__name__}: {err}"}
                    traceback.print_exc()
            if B == 1 and T == 8192 and device == "cuda" and rec.get("ms"):
                rec.update(_graph_times(op, q, k, v, g, beta, timer, with_fla=o_fla is not None))
            if rec.get("ms") and rec.get("fla_ms"):
                rec["ratio"] = rec["ms"] / rec["fla_ms"]
            if rec.get("ms") and rec["floor_ms"] == rec["floor_ms"]:
                rec["x_floor"] = rec["ms"] / rec["floor_ms"]
            rows.append(rec)
            print("RESULT", json.dumps(rec, default=str), flush=True)
            del q, k, v, g, beta, o_fla  # free the inputs before the next shape
            if device == "cuda":
                torch.cuda.empty_cache()
    result["rows"] = rows
    result["explore"] = explore_rows
    result["wall_s"] = round(time.time() - t_start, 1)
    return result


def _ints(text: str | None) -> tuple[int, ...]:
    """`"0,2"` -> (0, 2): a comma list of ints (`--warm`, `--warm-splits`); None or "" -> ()."""
    return tuple(int(x) for x in text.split(",")) if text else ()


def _certified(op: str, q, k, v, g, beta, kw: dict[str, Any]) -> dict[str, Any]:
    """One more untimed call of a warm variant: the fraction of (transition, head) pairs its gates certified."""
    report: dict[str, Any] = {}
    with torch.no_grad():
        ours(op, q, k, v, g, beta, warm_report=report, **kw)
    ok = report.get("certified")
    if ok is None:
        return {"certified": None}  # no split at this shape, or the window not shorter than a segment
    return {"certified": _fraction(ok), "transitions": int(ok.shape[0])}


def _fraction(ok: Any) -> float:
    """The certified fraction of a [transitions, H] bool tensor (read after the untimed call)."""
    return round(float(ok.float().mean().item()), 4)


def profile_kernels(op: str, q, k, v, g, beta, timer: Timer, warm: int = 0) -> dict[str, Any]:
    """Each launcher of our forward timed alone (do_bench median, ms) with its unique bytes (reads + writes).

    Intermediates come from one untimed pass; the split stages use the automatic plan of the shape. warm > 0:
    also the stages of the gate-certified warmup with that window (`kernels.common.warm_split`): the windows'
    pass, the certification (bound, norms), the masked transition pass and all of `warm_transitions`.
    """
    from kernels.common.chunk_state import SeqLayout, chunk_state_output_fwd, chunk_state_transition_fwd
    from kernels.common.index import prepare_chunk_index
    from kernels.common.seqsplit import resolve_split, seg_chain_fwd
    from kernels.common.wy import BT_WY, wy_gdn_fwd, wy_kda_fwd

    B, T, H, K = k.shape
    V = v.shape[-1]
    scale = K**-0.5
    th = B * T * H  # token-heads
    index = prepare_chunk_index(None, batch=B, seq_len=T, chunk_size=BT_WY, device=k.device)
    out: dict[str, Any] = {}
    with torch.no_grad():
        if op == "gdn":
            wy_args = (q, k, v, g, beta)
            w, u, gg, aqk = wy_gdn_fwd(*wy_args, scale=scale, index=index)
            kk, qq, gv = k, q, False
            wy_bytes = th * (2 * (2 * K + V) + 4 + 2 * (K + V) + 4 + 2 * 64)
        else:
            wy_args = (q, k, v, g, beta)
            w, u, kk, gg, qq, aqk = wy_kda_fwd(*wy_args, scale=scale, index=index)
            gv = True
            wy_bytes = th * (2 * (4 * K + V) + 2 + 2 * (3 * K + V) + 2 * 64)
        fn = wy_gdn_fwd if op == "gdn" else wy_kda_fwd
        out["wy_ms"] = _timed(timer, fn, *wy_args, scale=scale, index=index)[0]
        out["wy_GBps"] = wy_bytes / (out["wy_ms"] * 1e-3) / 1e9
        step_bytes = th * (2 * (3 * K + V) + 2 * 64 + 4 + 2 * V)  # w, k, q, u, aqk, gate in; o out
        plain = SeqLayout(index.num_seqs)
        out["state_plain_ms"] = _timed(timer, chunk_state_output_fwd, kk, w, u, gg, qq, layout=plain, BT=BT_WY,
                                       gate_vector=gv, scale=scale, aqk=aqk)[0]
        plan = resolve_split(index, None, H=H, NV=V // 64, device=k.device)
        if plan is not None:
            out["seg_chunks"], out["segments"] = plan.seg_chunks, plan.num_segments
            M, S = chunk_state_transition_fwd(kk, w, u, gg, layout=plan.transitions, BT=BT_WY, gate_vector=gv)
            out["transition_ms"] = _timed(timer, chunk_state_transition_fwd, kk, w, u, gg, layout=plan.transitions,
                                          BT=BT_WY, gate_vector=gv)[0]
            hs = seg_chain_fwd(M, S, None, plan)
            out["chain_ms"] = _timed(timer, seg_chain_fwd, M, S, None, plan)[0]
            out["state_split_ms"] = _timed(timer, chunk_state_output_fwd, kk, w, u, gg, qq, layout=plan.final, BT=BT_WY,
                                           gate_vector=gv, scale=scale, aqk=aqk, h0=hs)[0]
            out["state_split_GBps"] = step_bytes / (out["state_split_ms"] * 1e-3) / 1e9
            if warm:
                out.update(_profile_warm(op, q, (k, v, g, beta), (kk, w, u, gg), index, plan, warm, gv, timer))
        out["state_plain_GBps"] = step_bytes / (out["state_plain_ms"] * 1e-3) / 1e9
    return {k2: (round(v2, 4) if isinstance(v2, float) else v2) for k2, v2 in out.items()}


def _profile_warm(op: str, q: Any, raw: tuple[Any, ...], prep: tuple[Any, ...], index: Any, plan: Any, warm: int,
                  gv: bool, timer: Timer) -> dict[str, Any]:
    """The warm path's stages timed alone (see profile_kernels), and the WY pass with its chunk bound (bnd=)."""
    from kernels.common.chunk_state import chunk_state_final_fwd, chunk_state_transition_fwd
    from kernels.common.seqsplit import seg_chain_fwd
    from kernels.common.warm_split import WarmInputs, certify_windows, warm_transitions, window_plan, with_chunk_bound
    from kernels.common.wy import BT_WY, wy_gdn_fwd, wy_kda_fwd

    wp = window_plan(index, list(plan.bounds_cpu), list(plan.chunk_bounds_cpu), list(plan.transitions_cpu), warm,
                     seg_chunks=plan.seg_chunks, cache=plan.windows)
    if wp is None:
        return {"warm": warm, "warm_note": "window not shorter than a segment: exact split"}
    k, v, g, beta = raw
    # the WY pass sums the bound's terms per chunk: its cost over wy_ms
    x = with_chunk_bound(WarmInputs(op, k, v, g, beta, window_chunks=warm), index.num_chunks)
    assert x is not None
    out: dict[str, Any] = {"warm": warm}
    wy, scale = (wy_gdn_fwd if op == "gdn" else wy_kda_fwd), q.shape[-1] ** -0.5
    wy(q, *raw, scale=scale, index=index, bnd=x.chunk_bound)
    out["wy_bound_ms"] = _timed(timer, wy, q, *raw, scale=scale, index=index, bnd=x.chunk_bound)[0]
    E = chunk_state_final_fwd(*prep, layout=wp.layout, BT=BT_WY, gate_vector=gv)
    out["warm_window_ms"] = _timed(timer, chunk_state_final_fwd, *prep, layout=wp.layout, BT=BT_WY, gate_vector=gv)[0]
    ok = certify_windows(x, wp, E, None)
    out["warm_certify_ms"] = _timed(timer, certify_windows, x, wp, E, None)[0]
    out["warm_masked_transition_ms"] = _timed(timer, chunk_state_transition_fwd, *prep, layout=plan.transitions,
                                              BT=BT_WY, gate_vector=gv, need=~ok)[0]
    out["warm_transitions_ms"] = _timed(timer, warm_transitions, *prep, transitions=plan.transitions, wp=wp, BT=BT_WY,
                                        gate_vector=gv, x=x, h0=None)[0]
    M, S, _ = warm_transitions(*prep, transitions=plan.transitions, wp=wp, BT=BT_WY, gate_vector=gv, x=x, h0=None)
    out["warm_chain_ms"] = _timed(timer, seg_chain_fwd, M, S, None, plan, drop=ok)[0]
    out["warm_certified"] = _fraction(ok)
    return out


def _graph_times(op: str, q, k, v, g, beta, timer: Timer, with_fla: bool) -> dict[str, float]:
    """CUDA-graph replay times (launch overhead removed) of ours and FLA."""
    out: dict[str, float] = {}
    fns: list[tuple[str, Callable[[], Any]]] = [("graph_ms", lambda: ours(op, q, k, v, g, beta))]
    if with_fla:
        fns.append(("fla_graph_ms", lambda: fla_fn(op)(q, k, v, g, beta)))
    for name, fn in fns:
        try:
            s = torch.cuda.Stream()
            s.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(s), torch.no_grad():
                for _ in range(2):
                    fn()
            torch.cuda.current_stream().wait_stream(s)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph), torch.no_grad():
                fn()
            out[name] = timer(graph.replay)[0]
        except Exception as err:  # noqa: BLE001
            out[name + "_error"] = f"{type(err).__name__}: {err}"  # type: ignore[assignment]
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="cpbench bench kernels", description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="benchmarks/results")
    ap.add_argument("--name", default=None, help="file stem (default kernels_<device>)")
    ap.add_argument("--ops", default="gdn,kda")
    ap.add_argument("--shapes", default=None, help="comma list of BxT (default: the issue's five shapes)")
    ap.add_argument("--explore", nargs="?", const="full", default=None, choices=("full", "light"),
                    help="also time variants: split lengths, fusion and launch configs (full) or the first two (light)")
    ap.add_argument("--profile", action="store_true", help="also time each launcher of our forward alone")
    ap.add_argument("--warm", default=None,
                    help="comma list of warmup windows (chunks) of the split's gate-certified warmup to time, e.g. 0,2 "
                         "(0: exact maps); --profile then also times the warm stages at the largest")
    ap.add_argument("--warm-splits", default=None,
                    help="comma list of segment lengths (chunks) at which to time each --warm window too, e.g. 8,16,32")
    ap.add_argument("--lb", type=float, default=None,
                    help="gates g = lb * sigmoid(randn) (the engine's workload, e.g. -5 or -1) instead of FLA's "
                         "logsigmoid(randn): how strongly they decay decides what the --warm windows certify")
    ap.add_argument("--no-fla", action="store_true")
    ap.add_argument("--no-check", action="store_true")
    ap.add_argument("--jobs", type=int, default=8, help="parallel precompile processes (0: none)")
    ap.add_argument("--deadline", type=float, default=0, help="stop starting new shapes after this many seconds")
    ap.add_argument("--dry-run", action="store_true", help="CPU interpreter, tiny shapes, no FLA: checks the script")
    args = ap.parse_args(argv)
    ARGV[:] = list(sys.argv[1:] if argv is None else argv)
    os.environ.setdefault("FLA_DISABLE_BACKEND_DISPATCH", "1")
    if args.dry_run:
        args.no_fla, args.jobs = True, 0
        if os.environ.get("TRITON_INTERPRET") != "1":
            raise SystemExit("--dry-run needs TRITON_INTERPRET=1 in the environment (set before the kernels are imported)")
        from kernels.interpreter import patch_bf16_dot

        patch_bf16_dot()
    res = run(args)
    name = result_stem("kernels", args.name, res["env"].get("device"))
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, name + ".json"), "w") as f:
        json.dump(res, f, indent=1, default=str)
    md = to_markdown(res)
    with open(os.path.join(args.out, name + ".md"), "w") as f:
        f.write(md)
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
