"""GPU benchmark of the Triton forward against FLA's and FlashQLA's on the same inputs, with floors and correctness
checks.

    cpbench bench kernels [--out benchmarks/results] [--ops gdn,kda] [--shapes 1x8192,8x8192] [--hv 16,32]
                          [--lb=-5,-1] [--preset issue26] [--peers fla,flash_qla] [--no-fla] [--profile]
                          [--deadline 540] [--explore] [--jobs 8] [--dry-run]   (also: python -m runners.bench.kernels)

Rows: shapes x HV x lb (`runners.bench.kernels_grid`: `--preset issue26` is issue 26's grid), most important
first; `--deadline` starts a row only while it fits and lists the rest as cut; the report is written after every
row. Peers (`runners.bench.kernels_peers`): FLA's Triton path, and FlashQLA (GDN) in two columns, `auto_cp=False`
and its intra-card CP (`auto_cp=True`, its default), with the split it chose; where a peer cannot run, one line
says why. Each library's first call (its compile / autotune on the cache it found) is in the report; ours runs on
Triton where the TileLang kernels its "auto" choices take are still building, and every timing waits for them
first (`kernels.wait_for_builds`; the report names CPBENCH_TILELANG_BUILD's mode, `kernels.builds.first_call_note`).

Method (the one ../shared/anchors/fla-h200.md used for FLA, so our figures stand next to FLA's published ones;
that is why the inputs take `runners.workload`'s FLA recipe, not a sweep point's): bf16, H=16, K=V=128; q, k L2-normalised in
fp32, v = randn, beta = sigmoid(randn), g = logsigmoid(randn) ([B,T,H] for GDN, [B,T,H,K] for KDA); forward
only, under no_grad, no final state; `triton.testing.do_bench` median (L2 flushed between repetitions,
warm-up 25 ms, 200 ms of repetitions) after one untimed call that compiles (and, for FLA, autotunes).
FLA runs with FLA_DISABLE_BACKEND_DISPATCH=1 (its Triton path). Ours is timed through the public entry
`kernels.forward(..., backend="triton")`, the same inputs as FLA in the same process.

Floors (`runners.bench.floors`, the one definition): bytes (q, k, v, g, beta read once and o written once) at
4.2 TB/s; flops of the chunked algorithm (K K^T, Q K^T, w, u, A v: 2 C^2 (3K + 2V); w S, q S, K^T v: 6 K V,
per chunk and head) at the bf16 matmul rate measured in the run (an 8192^3 torch.matmul). The floor is the larger
of the two. `--profile` also times each launcher alone beside its own floors (the WY path's launchers), and (session 31) lists
the headline forward's kernels by CUDA time (torch profiler, one call): where the default path's time goes.

Correctness: ours vs the fp32 per-token reference (`kernels.reference`) on reduced shapes (dense, varlen
with odd lengths and an initial state, a slow-decay gate that makes the segment chain matter, fp32 inputs),
the transition (M S0 + S_ext vs the final state from S0), ours and each peer's o vs the fp32 reference at one
reduced shape, and ours vs FLA (and FlashQLA vs ours) at every benchmark shape. `--no-check` skips all of them.

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

from kernels.builds import build_mode
from runners.bench.common import environment, result_stem
from runners.bench.floors import LAUNCHERS, bytes_floor, floor_ms, flops_floor, launcher_bytes, launcher_flops
from runners.bench.kernels_grid import PRESETS, Case, Deadline, expand_cases, parse_floats, parse_shapes
from runners.bench.kernels_ops import (
    FLA_MS_ANCHOR,
    H_DEFAULT,
    K_DIM,
    V_DIM,
    Timer,
    _timed,
    fla_fn,
    fla_inputs,
    measure_ceilings,
    ours,
    variants,
)
from runners.bench.kernels_peers import (
    FLASH_QLA_COLUMNS,
    FlashQLAColumns,
    first_call,
    first_calls_s,
    flash_qla_reason,
    parse_peers,
)
from runners.bench.kernels_report import to_markdown
from runners.correctness import rel_l2
from runners.versions import peer_versions

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


def _env(device: str) -> dict[str, Any]:
    env = environment(torch.device(device, 0) if device == "cuda" else torch.device("cpu"),
                      command=" ".join([os.path.basename(sys.executable), "-m", "runners.bench.kernels", *ARGV]),
                      cpu_label="cpu (dry run, interpreter)",
                      env_vars=("FLA_DISABLE_BACKEND_DISPATCH", "NCCL_NVLS_ENABLE", "TRITON_CACHE_DIR", "TILELANG_CACHE_DIR"))
    env.update(peer_versions(), tilelang_build=build_mode())  # what ours' first call holds (`first_call_note`)
    return env


def cases_of(args: argparse.Namespace, H: int) -> list[Case]:
    """The run's rows (`runners.bench.kernels_grid`): --preset or --shapes / --hv / --lb; a dry run keeps the lists'
    gates but runs its tiny shape at HV = H."""
    if args.dry_run:
        return expand_cases(shapes=DRY_RUN_SHAPES, hv=(H,), lb=parse_floats(args.lb, "--lb") or (None,), H=H)
    return expand_cases(preset=args.preset, shapes=parse_shapes(args.shapes or ""), hv=_ints(args.hv),
                        lb=parse_floats(args.lb, "--lb"), H=H)


def run(args: argparse.Namespace, write: Callable[[dict[str, Any]], None] = lambda res: None) -> dict[str, Any]:
    """The benchmark; `write(result)` after every row, so a run cut short (deadline, crash) keeps what it measured."""
    device = "cpu" if args.dry_run else "cuda"
    ops = args.ops.split(",")
    H = 2 if args.dry_run else H_DEFAULT
    K = V = 32 if args.dry_run else K_DIM
    cases = cases_of(args, H)
    peers = parse_peers(args.peers, args.no_fla)
    shapes = list(dict.fromkeys((c.B, c.T) for c in cases))
    timer = Timer(device == "cuda")
    deadline = Deadline(args.deadline)
    result: dict[str, Any] = {"env": _env(device), "H": H, "K": K, "V": V, "shapes": shapes, "peers": list(peers),
                              "cases": [c.label for c in cases], "rows": [], "explore": [], "cut": []}
    if device == "cuda" and args.jobs > 0:
        t0 = time.time()
        result["precompile"] = precompile(ops, shapes, args.explore, args.jobs, warm=_ints(args.warm))
        result["precompile_s"] = round(time.time() - t0, 1)
        print(f"precompile {result['precompile_s']} s:", *result["precompile"], sep="\n  ", flush=True)
    result["ceilings"] = measure_ceilings(timer, device)
    print("ceilings", result["ceilings"], flush=True)
    qla = FlashQLAColumns() if "flash_qla" in peers else None
    if not args.no_check:
        result["correctness"] = correctness(ops, device)
        result["accuracy"] = peer_accuracy(ops, device, peers, qla, H=H, K=K, V=V)
    for case in cases:
        for op in ops:
            if not deadline.allows():
                result["cut"].append({"op": op, "case": case.label, "why": deadline.why()})
                print(f"{op} {case.label}: {deadline.why()}", flush=True)
                continue
            print(f"[{deadline.elapsed():.0f}s] {op} {case.label}", flush=True)
            rec = run_row(args, op, case, device, peers, qla, timer, result)
            rec["row_s"] = round(deadline.done(first_calls_s(rec)), 1)
            result["rows"].append(rec)
            print("RESULT", json.dumps(rec, default=str), flush=True)
            write(result)
            if device == "cuda":
                torch.cuda.empty_cache()
    result["wall_s"] = round(deadline.elapsed(), 1)
    write(result)
    return result


def peer_accuracy(ops: list[str], device: str, peers: tuple[str, ...], qla: FlashQLAColumns | None, *, H: int, K: int,
                  V: int, T: int = 2048) -> list[dict[str, Any]]:
    """o of ours and of each peer vs the fp32 per-token reference on one reduced shape (B=1, T, lb=-1, bf16): the
    same inputs for all; a peer that cannot run gives its reason. The first peer calls also pay their compile."""
    import kernels

    T = 128 if device != "cuda" else T
    rows: list[dict[str, Any]] = []
    for op in ops:
        wl = fla_inputs(op, 1, T, H, device=device, K=K, V=V, lb=-1.0, seed=3)
        x = wl.tensors
        with torch.no_grad():
            ref, _ = kernels.reference(op, *(t.float() for t in x))
        calls: list[tuple[str, Callable[[], Any]]] = [("ours", lambda: ours(op, *x)[0])]  # noqa: B023
        if "fla" in peers and device == "cuda":
            calls.append(("fla", lambda: fla_fn(op)(*x)[0]))  # noqa: B023
        why = flash_qla_reason(op, H=H, HV=H, K=K, V=V) if "flash_qla" in peers else None
        for col in FLASH_QLA_COLUMNS if "flash_qla" in peers else ():
            if why is None and qla is not None:
                fn, xs = qla.forward(col, wl)
                calls.append((col, lambda fn=fn, xs=xs: fn(*xs)))  # type: ignore[misc]
            else:
                rows.append({"op": op, "who": col, "T": T, "error": why})
        for who, call in calls:
            rec: dict[str, Any] = {"op": op, "who": who, "T": T}
            try:
                with torch.no_grad():
                    o, rec["first_call_s"] = first_call(call, device == "cuda")
                rec["o_rel_l2"] = rel_l2(o, ref)
            except Exception as err:  # noqa: BLE001 - a failing peer is a result
                rec["error"] = f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"[:300]
            rows.append(rec)
            print("ACCURACY", json.dumps(rec, default=str), flush=True)
    return rows


def run_row(args: argparse.Namespace, op: str, case: Case, device: str, peers: tuple[str, ...],
            qla: FlashQLAColumns | None, timer: Timer, result: dict[str, Any]) -> dict[str, Any]:
    """One (op, case) row: ours (and its variants), FLA, FlashQLA's columns, the floors, the profile."""
    H, K, V = result["H"], result["K"], result["V"]
    B, T, HV = case.B, case.T, case.HV
    wl = fla_inputs(op, B, T, H, device=device, K=K, V=V, lb=case.lb, HV=HV)
    q, k, v, g, beta = wl.tensors
    rec: dict[str, Any] = {"op": op, "B": B, "T": T, "H": H, "HV": HV, "lb": case.lb, "K": K, "V": V,
                           "bytes": bytes_floor(op, B, T, HV, K, V), "flops": flops_floor(B, T, HV, K, V)}
    fl = floor_ms(rec["bytes"], rec["flops"], result["ceilings"]["matmul_TFLOPs"])
    rec.update(floor_bytes_ms=fl["bytes_ms"], floor_flops_ms=fl["flops_ms"], floor_ms=fl["floor_ms"])
    o_fla = None
    if "fla" in peers and device == "cuda":
        try:
            fn = fla_fn(op)
            with torch.no_grad():
                (o_fla, _), rec["fla_first_call_s"] = first_call(lambda: fn(q, k, v, g, beta), cuda=True)
                rec["fla_ms"], rec["fla_p20"], rec["fla_p80"] = _timed(timer, fn, q, k, v, g, beta)
        except Exception as err:  # noqa: BLE001
            rec["fla_error"] = f"{type(err).__name__}: {err}"
            traceback.print_exc()
    elif "fla" in peers:
        rec["fla_error"] = "FLA's Triton path needs a CUDA device (a dry run times ours only)"
    rec["fla_anchor_ms"] = FLA_MS_ANCHOR.get((op, B, T)) if HV == H and case.lb is None else None  # its recipe: logsigmoid
    o_ours = None
    for label, kw in variants(op, B, T, args.explore, _ints(args.warm), _ints(args.warm_splits)):
        vrec: dict[str, Any] = {"op": op, "B": B, "T": T, "HV": HV, "lb": case.lb, "variant": label,
                                "kwargs": {a: repr(b) for a, b in kw.items()}}
        try:
            with torch.no_grad():
                (o, _), vrec["first_call_s"] = first_call(lambda: ours(op, q, k, v, g, beta, **kw), device == "cuda")  # noqa: B023
            if o_fla is not None and not args.no_check:
                vrec["rel_l2_vs_fla"] = rel_l2(o, o_fla)
            if label == "ours":
                o_ours = o
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
            result["explore"].append(vrec)
    if "flash_qla" in peers:
        rec.update(flash_qla_row(qla, op, wl, None if args.no_check else o_ours, timer, H=H, K=K, V=V))
    if args.profile and device == "cuda":
        try:  # (session 31) where ours' headline forward goes, by kernel (the launchers below time the WY path's)
            from runners.bench.kernels_train import kernel_times

            with torch.no_grad():
                rec["ours_kernels_ms"] = kernel_times(lambda: ours(op, q, k, v, g, beta))
        except Exception as err:  # noqa: BLE001
            rec["ours_kernels_ms"] = {"error": f"{type(err).__name__}: {err}"}
            traceback.print_exc()
        try:
            rec["profile"] = profile_kernels(op, q, k, v, g, beta, timer, warm=max(_ints(args.warm), default=0))
            rec["launchers"] = launcher_floors(op, B, T, HV, K, V, rec["profile"], result["ceilings"])
        except Exception as err:  # noqa: BLE001
            rec["profile"] = {"error": f"{type(err).__name__}: {err}"}
            traceback.print_exc()
    if B == 1 and T == 8192 and HV == H and device == "cuda" and rec.get("ms"):
        rec.update(_graph_times(op, q, k, v, g, beta, timer, with_fla=o_fla is not None))
    if rec.get("ms") and rec.get("fla_ms"):
        rec["ratio"] = rec["ms"] / rec["fla_ms"]
    for col in FLASH_QLA_COLUMNS:
        if rec.get("ms") and rec.get(f"{col}_ms"):
            rec[f"ratio_{col}"] = rec["ms"] / rec[f"{col}_ms"]
    if rec.get("ms") and rec["floor_ms"] == rec["floor_ms"]:
        rec["x_floor"] = rec["ms"] / rec["floor_ms"]
    return rec


def flash_qla_row(qla: FlashQLAColumns | None, op: str, wl: Any, o_ours: Any, timer: Timer, *, H: int, K: int,
                  V: int) -> dict[str, Any]:
    """FlashQLA's columns of a row (`FLASH_QLA_COLUMNS`): ms, first call, the split it chose, rel_l2 vs ours; or
    `flash_qla_reason`, the one line saying why it cannot run here."""
    HV = wl.v.shape[2]
    why = flash_qla_reason(op, H=H, HV=HV, K=K, V=V, dtype=str(wl.q.dtype).removeprefix("torch."))
    if why or qla is None:
        return {"flash_qla_reason": why or "not asked for"}
    out: dict[str, Any] = {}
    for col in FLASH_QLA_COLUMNS:
        try:
            fn, xs = qla.forward(col, wl)
            with torch.no_grad():
                o, out[f"{col}_first_call_s"] = first_call(lambda: fn(*xs), cuda=True)  # noqa: B023
                out[f"{col}_split"] = qla.split()
                if o_ours is not None:
                    out[f"{col}_rel_l2_vs_ours"] = rel_l2(o, o_ours)
                del o
                out[f"{col}_ms"], out[f"{col}_p20"], out[f"{col}_p80"] = _timed(timer, fn, *xs)
        except Exception as err:  # noqa: BLE001 - FlashQLA failing is a result, not a crash of the benchmark
            out[f"{col}_error"] = f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"[:300]
            traceback.print_exc()
    return out


def launcher_floors(op: str, B: int, T: int, HV: int, K: int, V: int, prof: dict[str, Any],
                    ceilings: dict[str, float]) -> list[dict[str, Any]]:
    """Each profiled launcher's ms beside its own floors (`runners.bench.floors`: bytes at HBM_TBPS, flops at the
    run's matmul rate) and ms / floor."""
    rows = []
    segments = int(prof.get("segments") or 0)
    for name in LAUNCHERS:
        ms = prof.get(f"{name}_ms")
        if ms is None:
            continue
        nbytes = launcher_bytes(op, name, B, T, HV, K, V, segments=segments)
        flops = launcher_flops(op, name, B, T, HV, K, V, segments=segments)
        fl = floor_ms(nbytes, flops, ceilings["matmul_TFLOPs"])
        rows.append({"launcher": name, "ms": ms, "bytes": nbytes, "flops": flops, **fl,
                     "x_floor": ms / fl["floor_ms"] if fl["floor_ms"] > 0 else None})
    return rows


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
    """Each launcher of our forward timed alone (do_bench median, ms); GB/s from its unique bytes (reads + writes,
    `runners.bench.floors.launcher_bytes`, the one count the floor table uses too).

    Intermediates come from one untimed pass; the split stages use the automatic plan of the shape. warm > 0:
    also the stages of the gate-certified warmup with that window (`kernels.common.warm_split`): the windows'
    pass, the certification (bound, norms), the masked transition pass and all of `warm_transitions`.
    """
    from kernels.common.chunk_state import SeqLayout, chunk_state_output_fwd, chunk_state_transition_fwd
    from kernels.common.index import prepare_chunk_index
    from kernels.common.seqsplit import resolve_split, seg_chain_fwd
    from kernels.common.wy import BT_WY, wy_gdn_fwd, wy_kda_fwd

    if v.shape[2] != k.shape[2]:  # grouped value heads: the launchers take q, k per value head (as dispatch does)
        q, k = (x.repeat_interleave(v.shape[2] // k.shape[2], dim=2) for x in (q, k))
    B, T, H, K = k.shape
    V = v.shape[-1]
    scale = K**-0.5
    index = prepare_chunk_index(None, batch=B, seq_len=T, chunk_size=BT_WY, device=k.device)
    out: dict[str, Any] = {}
    with torch.no_grad():
        wy_args = (q, k, v, g, beta)
        if op == "gdn":
            w, u, gg, aqk = wy_gdn_fwd(*wy_args, scale=scale, index=index)
            kk, qq, gv = k, q, False
        else:
            w, u, kk, gg, qq, aqk = wy_kda_fwd(*wy_args, scale=scale, index=index)
            gv = True
        fn = wy_gdn_fwd if op == "gdn" else wy_kda_fwd
        out["wy_ms"] = _timed(timer, fn, *wy_args, scale=scale, index=index)[0]
        out["wy_GBps"] = launcher_bytes(op, "wy", B, T, H, K, V) / (out["wy_ms"] * 1e-3) / 1e9
        step_bytes = launcher_bytes(op, "state_plain", B, T, H, K, V)  # w, k, q, u, aqk, gate in; o out
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
    ok, need = certify_windows(x, wp, E, None)
    out["warm_certify_ms"] = _timed(timer, certify_windows, x, wp, E, None)[0]
    out["warm_masked_transition_ms"] = _timed(timer, chunk_state_transition_fwd, *prep, layout=plan.transitions,
                                              BT=BT_WY, gate_vector=gv, need=need, skipped=E)[0]  # (as the split runs it)
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
    ap.add_argument("--hv", default=None, help="comma list of value-head counts, multiples of H=16 (default 16)")
    ap.add_argument("--preset", default=None, choices=sorted(PRESETS),
                    help="a named grid of shapes x HV x lb (issue26: the five shapes x HV 16, 32 x lb -1, -5); "
                         "--shapes / --hv / --lb given beside it replace its lists")
    ap.add_argument("--explore", nargs="?", const="full", default=None, choices=("full", "light"),
                    help="also time variants: split lengths, fusion and launch configs (full) or the first two (light)")
    ap.add_argument("--profile", action="store_true", help="also time each launcher of our forward alone")
    ap.add_argument("--warm", default=None,
                    help="comma list of warmup windows (chunks) of the split's gate-certified warmup to time, e.g. 0,2 "
                         "(0: exact maps); --profile then also times the warm stages at the largest")
    ap.add_argument("--warm-splits", default=None,
                    help="comma list of segment lengths (chunks) at which to time each --warm window too, e.g. 8,16,32")
    ap.add_argument("--lb", default=None,
                    help="comma list of gate strengths: g = lb * sigmoid(randn) (the engine's workload, e.g. -5,-1) "
                         "instead of FLA's logsigmoid(randn); how strongly they decay decides what the --warm "
                         "windows certify and what FlashQLA's intra-card CP chooses")
    ap.add_argument("--peers", default=None,
                    help="comma list of libraries timed beside ours: fla (its Triton path), flash_qla (FlashQLA, "
                         "GDN: auto_cp=False and its default intra-card CP); default fla,flash_qla; none: ours alone")
    ap.add_argument("--no-fla", action="store_true", help="leave FLA out of --peers")
    ap.add_argument("--no-check", action="store_true", help="skip every accuracy check (ours and the peers')")
    ap.add_argument("--jobs", type=int, default=8, help="parallel precompile processes (0: none)")
    ap.add_argument("--deadline", type=float, default=0,
                    help="seconds: start a row only if the elapsed time plus the longest row so far fits (the first "
                         "row always runs); the rows left are listed as cut in the report, written after every row")
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
    try:
        parse_peers(args.peers, args.no_fla)
        cases_of(args, 2 if args.dry_run else H_DEFAULT)
    except ValueError as err:
        ap.error(str(err))
    md: list[str] = []

    def write(res: dict[str, Any]) -> None:
        name = result_stem("kernels", args.name, res["env"].get("device"))
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, name + ".json"), "w") as f:
            json.dump(res, f, indent=1, default=str)
        md[:] = [to_markdown(res)]
        with open(os.path.join(args.out, name + ".md"), "w") as f:
            f.write(md[0])

    run(args, write)
    print(md[0] if md else "")
    return 0


if __name__ == "__main__":
    sys.exit(main())
