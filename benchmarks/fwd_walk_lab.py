"""GDN's warp-specialised TileLang forward walk (`kernels.ops.gdn.fwd_walk`) against the Triton state+output pass it
can replace (`kernels.ops.gdn.fused.gdn_fused_state_output`) and the Triton state recompute (`kernels.common.chunk_state
.chunk_state_ag_fwd`), on the same inputs and ranges in one process, beside their floors (issue 26).

    python benchmarks/fwd_walk_lab.py --out $OUT [--shapes 1x65536,8x8192,1x32768,1x131072] [--hv 16] [--lb -1] [--own-split] [--flash-qla]
        [--autotune benchmarks/results/autotune_h200.json]
    python benchmarks/fwd_walk_lab.py --compile-only [--jobs 2]   # fill TileLang's cache (no GPU needed)

Per shape (bf16, H = HV value heads, K = V = 128, chunk 64; q, k L2-normalised, g = lb * sigmoid(randn)): our Ag pass
(`wy_gdn_ag`) makes Ag and the gate cumsum; the forward's split for the Triton pass (`output_split`; none: whole sequences from
zero) and the exact entering state of each segment (`exact_segment_states`) give the ranges. Timed (do_bench medians, ms):
- output: the Triton pass and the walk (value blocks 64 and 128) over those ranges from those states (o and the
  final states), and the walk of the step under "ag+states" (o and every chunk's entering state, STORE_H); with `--own-split` also over the walk's one-wave split (`kernels.ops.gdn.fwd_walk.wave_seg_chunks`);
  with `--flash-qla` FlashQLA's CP step profiled per shape in this process (its fused forward and state pass: the
  peer's figures beside ours);
- state: `chunk_state_ag_fwd` and the walk without q (STORE_H) over the same ranges (every chunk's entering state).
Each walk's largest relative difference from the Triton result (max |a - b| / max |b| over o, ht or h), and the floor:
unique bytes at `runners.bench.floors.HBM_TBPS`, matmul flops at the rate measured in this run. Writes
$OUT/fwd_walk_lab.{json,md} after every shape.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.tilelang_builds import build_ahead  # noqa: E402
from runners.bench.floors import HBM_TBPS, floor_ms, launcher_flops  # noqa: E402

DIM, BT = 128, 64


def compile_all(hvs: list[int], jobs: int) -> dict[str, float]:
    """Seconds per (H, Hk, BV) build, `jobs` side by side (`benchmarks.tilelang_builds.build_ahead`)."""
    todo = [(hv, 16, bv) for hv in hvs for bv in (64, 128)]
    secs = build_ahead([("kernels.ops.gdn.fwd_walk", (H, Hk, BV, DIM**-0.5, "bfloat16")) for H, Hk, BV in todo], jobs)
    return {f"H{H}/Hk{Hk}/BV{BV}": t for (H, Hk, BV), t in zip(todo, secs, strict=True)}


def _rel(a: torch.Tensor | None, b: torch.Tensor | None) -> float:
    if a is None or b is None:
        return float("nan")
    return float((a.float() - b.float()).abs().max() / b.float().abs().max().clamp_min(1e-30))


def _bytes(B: int, T: int, HV: int, *, output: bool, segments: int) -> float:
    """Unique bytes: k (and q), v, Ag, the gate cumsum read; o (output) or h per chunk (state) written; the segments'
    entering states read (fp32)."""
    el, F32 = 2, 4
    read = el * DIM * (2 if output else 1) + el * DIM + el * BT + F32  # (q and) k per value head as read, v, Ag, G
    written = el * DIM if output else el * DIM * DIM / BT  # o, or h once per chunk
    return B * T * HV * (read + written) + segments * HV * DIM * DIM * F32


def run_shape(B: int, T: int, HV: int, lb: float, timer: Any, rate: float, own_split: bool,
              flash_qla: bool = False) -> dict[str, Any]:  # fmt: skip
    from kernels.common.index import prepare_chunk_index
    from kernels.ops.gdn.fused import output_split
    from kernels.ops.gdn.wy_ag import wy_gdn_ag
    from kernels.plan import default_plan

    dev = "cuda"
    gen = torch.Generator(device=dev).manual_seed(0)
    bf = torch.bfloat16
    q = torch.nn.functional.normalize(torch.randn(B, T, 16, DIM, generator=gen, device=dev), dim=-1).to(bf)
    k = torch.nn.functional.normalize(torch.randn(B, T, 16, DIM, generator=gen, device=dev), dim=-1).to(bf)
    v = torch.randn(B, T, HV, DIM, generator=gen, device=dev).to(bf)
    g = lb * torch.sigmoid(torch.randn(B, T, HV, generator=gen, device=dev))
    beta = torch.sigmoid(torch.randn(B, T, HV, generator=gen, device=dev)).to(bf)
    launch = default_plan()
    index = prepare_chunk_index(None, batch=B, seq_len=T, chunk_size=BT, device=torch.device(dev))
    ag, gs = wy_gdn_ag(k, g, beta, index=index, launch=launch)
    out: dict[str, Any] = {"output": {}, "state": {}}
    plans = {"triton split": output_split(index, k, v, gs, launch=launch, split_chunks=None)}
    if own_split:
        plans["one-wave split"] = output_split(index, k, v, gs, launch=launch, split_chunks=None, walk=True)
    if flash_qla:
        out["flash_qla_cp_kernels_ms"] = flash_qla_kernels(B, T, HV, lb)
    for pname, plan in plans.items():
        out["output"][pname] = _time_output(q, k, v, ag, gs, plan, index, launch, timer, rate)
        out["state"][pname] = _time_state(k, v, ag, gs, plan, index, launch, timer, rate)
    return out


def _ranges(k: Any, v: Any, ag: Any, gs: Any, plan: Any, index: Any, launch: Any) -> tuple[Any, Any, int]:
    """(layout, entering states, ranges) of a split (its exact segment states) or of whole sequences (from zero)."""
    from kernels.common.seqsplit import whole_sequences
    from kernels.ops.gdn.fused import exact_segment_states

    if plan is None:
        return whole_sequences(index), None, index.num_seqs
    _, h0 = exact_segment_states(k, v, ag, gs, None, plan=plan, BT=BT, launch=launch)
    return plan.final, h0, plan.num_segments


def _time_output(q: Any, k: Any, v: Any, ag: Any, gs: Any, plan: Any, index: Any, launch: Any, timer: Any,
                 rate: float) -> dict[str, Any]:  # fmt: skip
    """The output pass over the split's ranges from their exact entering states: Triton, then the walk at BV 64, 128."""
    from kernels.ops.gdn.fused import gdn_fused_state_output
    from kernels.ops.gdn.fwd_walk import fwd_walk_tilelang

    B, T, HV = v.shape[:3]
    layout, h0, S = _ranges(k, v, ag, gs, plan, index, launch)
    N = index.num_seqs
    scale = DIM**-0.5
    rows: dict[str, Any] = {"segments": S, "seg_chunks": plan.seg_chunks if plan is not None else 0}
    rows["floor"] = floor_ms(_bytes(B, T, HV, output=True, segments=S), launcher_flops("gdn", "fused", B, T, HV), rate)

    def triton() -> Any:
        return gdn_fused_state_output(q, k, v, ag, gs, layout=layout, BT=BT, scale=scale, h0=h0,
                                      output_final_state=True, num_states=N, launch=launch)  # fmt: skip

    ref = triton()
    torch.cuda.synchronize()
    rows["triton"] = {"ms": timer(triton, warmup=10, rep=100)[0], "diff": 0.0}
    for bv in (64, 128):

        def walk(bv: int = bv) -> Any:
            return fwd_walk_tilelang(q, k, v, ag, gs, layout=layout, scale=scale, h0=h0, num_states=N,
                                     output_final_state=True, BV=bv)  # fmt: skip

        got = walk()
        torch.cuda.synchronize()
        rows[f"walk BV{bv}"] = {"ms": timer(walk, warmup=10, rep=100)[0],
                                "diff": max(_rel(got[0], ref[0]), _rel(got[1], ref[1]))}  # fmt: skip
    NT = index.num_chunks

    def walk_h() -> Any:
        """The step's walk under "ag+states": o and every chunk's entering state (STORE_H) in one walk. Under "ag"
        (the default) the step runs the output walk and, in the backward, the state walk (session 34, an H100: the two
        0.85 ms together at 8x8K, where "ag+states" took the step 0.09 ms less and 0.48 less at 1x128K)."""
        return fwd_walk_tilelang(q, k, v, ag, gs, layout=layout, scale=scale, h0=h0, num_states=N,
                                 output_final_state=True, num_chunks=NT)  # fmt: skip

    got = walk_h()
    torch.cuda.synchronize()
    rows["walk +h (the step's)"] = {"ms": timer(walk_h, warmup=10, rep=100)[0],
                                    "diff": max(_rel(got[0], ref[0]), _rel(got[1], ref[1]))}  # fmt: skip
    return rows


def _time_state(k: Any, v: Any, ag: Any, gs: Any, plan: Any, index: Any, launch: Any, timer: Any,
                rate: float) -> dict[str, Any]:  # fmt: skip
    """The state pass (every chunk's entering state) over the split's ranges: Triton, then the walk at BV 64, 128."""
    from kernels.common.chunk_state import chunk_state_ag_fwd
    from kernels.ops.gdn.fwd_walk import fwd_walk_tilelang

    B, T, HV = v.shape[:3]
    layout, h0, S = _ranges(k, v, ag, gs, plan, index, launch)
    NT = index.num_chunks
    rows: dict[str, Any] = {"segments": S}
    rows["floor"] = floor_ms(_bytes(B, T, HV, output=False, segments=S), 4 * BT * DIM * DIM * NT * HV, rate)

    def triton() -> Any:
        return chunk_state_ag_fwd(k, v, ag, gs, layout=layout, num_chunks=NT, BT=BT, h0=h0, launch=launch)

    ref = triton()
    torch.cuda.synchronize()
    rows["triton"] = {"ms": timer(triton, warmup=10, rep=100)[0], "diff": 0.0}
    for bv in (64, 128):

        def walk(bv: int = bv) -> Any:
            return fwd_walk_tilelang(None, k, v, ag, gs, layout=layout, h0=h0, num_chunks=NT, BV=bv)

        got = walk()
        torch.cuda.synchronize()
        rows[f"walk BV{bv}"] = {"ms": timer(walk, warmup=10, rep=100)[0], "diff": _rel(got[2], ref)}
    return rows


def flash_qla_kernels(B: int, T: int, HV: int, lb: float) -> dict[str, float]:
    """FlashQLA's intra-card CP step in this process (`runners.bench.kernels_peers.FlashQLAColumns`, its column
    "flash_qla_cp"): ms per kernel of one step (torch profiler), the peer figures beside the walk's: its fused forward
    (`tilelang_fused_chunk_gdr_fwd`) and its state pass (`tilelang_prepare_h`)."""
    from runners.bench.kernels_peers import FlashQLAColumns
    from runners.bench.kernels_train import kernel_times, workload

    wl = workload("gdn", B, T, 16, device="cuda", HV=HV, lb=lb)
    assert wl.do is not None
    return kernel_times(FlashQLAColumns().step("flash_qla_cp", wl, wl.do))


def _markdown(state: dict[str, Any]) -> str:
    lines = [
        "# GDN's TileLang forward walk against the Triton passes (`benchmarks/fwd_walk_lab.py`)",
        "",
        f"{state['device']}, torch {state['torch']}, triton {state['triton']}, tilelang {state['tilelang']}, git "
        f"{state['sha']}. Command: `{state['command']}`. Matmul rate measured here: {state['matmul_TFLOPs']:.0f} "
        f"TFLOP/s; bytes at {HBM_TBPS} TB/s. Triton configs: {state['autotune'] or 'the registry defaults'}. diff: max |a - b| / max |b| against the Triton pass's result.",
        "",
    ]
    for shape, res in state["shapes"].items():
        peer = res.get("flash_qla_cp_kernels_ms")
        if peer:
            fwd = sum(v for k, v in peer.items() if "fused_chunk_gdr_fwd" in k)
            ph = sum(v for k, v in peer.items() if "prepare_h" in k)
            lines += [f"{shape}: FlashQLA CP in this process, its fused forward {fwd:.3f} ms, its state pass "
                      f"(prepare_h) {ph:.3f} ms", ""]  # fmt: skip
        for part, plans in res.items():
            if part == "flash_qla_cp_kernels_ms":
                continue
            for pname, rows in plans.items():
                f = rows["floor"]
                lines += [
                    f"## {shape} {part}, {pname} ({rows['segments']} ranges; floor {f['floor_ms']:.3f} ms: bytes "
                    f"{f['bytes_ms']:.3f}, flops {f['flops_ms']:.3f})",
                    "",
                    "| kernel | ms | x floor | diff |",
                    "|---|---:|---:|---:|",
                ]
                for name, r in rows.items():
                    if isinstance(r, dict) and "ms" in r:
                        lines.append(f"| {name} | {r['ms']:.3f} | {r['ms'] / f['floor_ms']:.1f} | {r['diff']:.1e} |")
                lines.append("")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", type=Path, default=Path("/tmp/fwd_walk_lab"))
    ap.add_argument("--shapes", default="1x65536,8x8192,1x32768,1x131072")
    ap.add_argument("--hv", default="16", help="value heads, a comma list (q, k keep 16)")
    ap.add_argument("--lb", type=float, default=-1.0)
    ap.add_argument(
        "--autotune",
        default=str(ROOT / "benchmarks/results/autotune_h200.json"),
        help="the Triton passes' launch configs (an autotune file; '' for the registry defaults)",
    )
    ap.add_argument("--own-split", action="store_true", help="also time the walk on the split for its value block")
    ap.add_argument(
        "--flash-qla",
        action="store_true",
        help="also profile FlashQLA's CP step per shape (its forward "
        "and state kernels beside ours; its first call compiles for minutes on a cold TileLang cache)",
    )
    ap.add_argument("--jobs", type=int, default=8)
    ap.add_argument("--compile-only", action="store_true")
    a = ap.parse_args(argv)
    hvs = [int(x) for x in a.hv.split(",")]
    t0 = time.perf_counter()
    compile_s = compile_all(hvs, a.jobs)
    print(f"compiled in {time.perf_counter() - t0:.0f} s: {compile_s}", flush=True)
    if a.compile_only:
        return
    import tilelang
    import triton

    from runners.bench.kernels_ops import Timer, measure_ceilings

    if a.autotune:
        from kernels.plan import use_autotune

        use_autotune(a.autotune, strict=False)
    timer = Timer(cuda=True)
    state: dict[str, Any] = {
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "tilelang": tilelang.__version__,
        "sha": os.environ.get("CPBENCH_GIT_SHA", "?"),
        "command": " ".join(["python benchmarks/fwd_walk_lab.py", *(argv or sys.argv[1:])]),
        "compile_s": compile_s,
        "autotune": a.autotune or None,
        "matmul_TFLOPs": measure_ceilings(timer, "cuda")["matmul_TFLOPs"],
        "shapes": {},
    }
    a.out.mkdir(parents=True, exist_ok=True)
    for hv in hvs:
        for s in a.shapes.split(","):
            B, T = (int(x) for x in s.split("x"))
            state["shapes"][f"{s} HV={hv} lb={a.lb:g}"] = run_shape(B, T, hv, a.lb, timer, state["matmul_TFLOPs"],
                                                                    a.own_split, a.flash_qla)  # fmt: skip
            (a.out / "fwd_walk_lab.json").write_text(json.dumps(state, indent=1))
            (a.out / "fwd_walk_lab.md").write_text(_markdown(state))
    print(_markdown(state), flush=True)


if __name__ == "__main__":
    main()
