"""Does a short training step still wait on the host inside a CUDA graph? Per shape: each library's forward + backward
timed eagerly and as one captured CUDA graph replayed (`torch.cuda.CUDAGraph`, the whole step: its launches, ATen
ops and autograd), with the replay's outputs checked against an eager step on the same inputs and again after new
values are copied into the graph's static inputs (a step that decided anything on the host from device values would
replay the old decision).

Why (issue 26, session 21): on the H200 GDN's 1x8K step takes 1.7-2.1 ms for 1.1 ms of kernels
(`results/host_bound_lab_h200.md`): the GPU idles while the host issues launches. A training loop at short
sequences captures its step in a graph (`torch.cuda.graph`, `torch.compile(mode="reduce-overhead")`), which
replays the launches without the host. Our ops never read a device value on the host, so they should capture; this
measures what the step costs then, beside FlashQLA's and FLA's, each of which may or may not capture (a capture
failure is a row with its one-line reason).

    python3 benchmarks/cuda_graph_step.py --out $OUT [--shapes 1x8192,1x16384] [--hv 16] [--peers fla,flash_qla]
    python3 benchmarks/cuda_graph_step.py --out /tmp/g --dry-run     # the CPU: eager rows only (plumbing)

Steps: ours = the public op `kernels.chunk_gdn` (backend triton) on fresh leaves, `o.backward(do)`; `ours direct`
= `chunk_gdn_fwd` + `chunk_gdn_bwd` (no autograd node); FLA = `chunk_gated_delta_rule` (its Triton path: the
script sets `FLA_DISABLE_BACKEND_DISPATCH=1`); FlashQLA CP = its default `auto_cp=True` on the batch as varlen.
bf16, H=16, K=V=128, lb -1. Writes $OUT/cuda_graph_step.{json,md}.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

PEERS = ("fla", "flash_qla")


def capture(step: Callable[[], Any]) -> tuple[Any, Any]:
    """(graph, its static outputs) of `step` after three warm-up calls on a side stream (PyTorch's recipe)."""
    import torch

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = step()
    return graph, out


def max_rel(a: list[Any], b: list[Any]) -> float:
    from runners.correctness import rel_l2

    return max(rel_l2(x.float(), y.float()) for x, y in zip(a, b, strict=True))


def steps(who: str, wl: Any, wl2: Any) -> tuple[Callable[[], Any], list[Any], list[Any]]:
    """(the step of `who`: () -> (o, grads), the static tensors it reads, the same tensors from `wl2`: the new values
    to copy into them)."""
    import torch

    from runners.bench.kernels_train import ours_api_step, ours_step

    def plain(w: Any) -> list[Any]:
        return [w.q, w.k, w.v, w.g, w.beta, w.do]

    q, k, v, g, beta, do = plain(wl)
    if who == "ours":
        fn = ours_api_step("gdn")
        return (lambda: fn(q, k, v, g, beta, do)), plain(wl), plain(wl2)
    if who == "ours direct":
        fn = ours_step("gdn")

        def direct() -> Any:
            with torch.no_grad():
                return fn(q, k, v, g, beta, do)

        return direct, plain(wl), plain(wl2)
    if who == "fla":
        from runners.bench.kernels_train import fla_step

        fn, _ = fla_step("gdn")
        return (lambda: fn(q, k, v, g, beta, do)), plain(wl), plain(wl2)
    if who == "flash_qla CP":
        from runners.bench.kernels_peers import FlashQLAColumns

        # FlashQLA on the batch as varlen with the gate in fp32 (FlashQLAColumns' recipe), its leaves made in the step
        cols = FlashQLAColumns()
        fwd, xs = cols.forward("flash_qla_cp", wl)
        shapes = [t.shape for t in wl.tensors]

        def qla() -> Any:
            leaves = [x.detach().requires_grad_() for x in xs]
            o = fwd(*leaves)
            o.backward(do)
            return o, [x.grad.reshape(s) for x, s in zip(leaves, shapes, strict=True)]

        return qla, [*xs, do], [*cols.forward("flash_qla_cp", wl2)[1], wl2.do]
    raise ValueError(f"unknown step {who!r}")


def run_shape(B: int, T: int, HV: int, who: list[str], *, cuda: bool) -> list[dict[str, Any]]:
    import torch

    from benchmarks.host_bound_lab import flat  # a step's (o, grads) -> [o, dq, dk, dv, dg, dbeta]
    from runners.bench.kernels_ops import fla_inputs
    from runners.bench.kernels_train import timed

    H, K = (16, 128) if cuda else (1, 32)
    kw = {"device": "cuda" if cuda else "cpu", "dtype": "bfloat16" if cuda else "float32", "grad_out": True, "lb": -1.0,
          "K": K, "V": K, "HV": HV if cuda else None}  # fmt: skip
    wl, wl2 = fla_inputs("gdn", B, T, H, **kw), fla_inputs("gdn", B, T, H, seed=1, **kw)
    rows = []
    for name in who:
        row: dict[str, Any] = {"B": B, "T": T, "HV": HV if cuda else 1, "who": name}
        try:
            step, statics, news = steps(name, wl, wl2)
            eager = flat(step())
            if cuda:
                row["eager_ms"] = timed(step)
                graph, out = capture(step)
                graph.replay()
                row["replay_rel_l2"] = max_rel(flat(out), eager)
                for x, y in zip(statics, news, strict=True):
                    x.copy_(y)  # new values in the static inputs: the replay must follow them
                graph.replay()
                torch.cuda.synchronize()
                replayed = [t.clone() for t in flat(out)]
                row["new_inputs_rel_l2"] = max_rel(replayed, flat(step()))
                row["graph_ms"] = timed(graph.replay)
                row["eager_over_graph"] = row["eager_ms"] / row["graph_ms"]
            else:
                row["eager_outputs"] = len(eager)
        except Exception as err:  # a library that cannot capture is a result, not a crash of the benchmark
            row["error"] = f"{type(err).__name__}: {str(err).splitlines()[0][:200] if str(err) else ''}"
        print(json.dumps(row), flush=True)
        rows.append(row)
    return rows


def table(rows: list[dict[str, Any]]) -> str:
    lines = [
        "| shape | HV | step | eager ms | graph ms | eager / graph | replay vs eager (rel_l2) | new inputs (rel_l2) | failure |",
        "|---|---:|---|---:|---:|---:|---:|---:|---|",
    ]

    def f(r: dict[str, Any], key: str, fmt: str) -> str:
        return format(r[key], fmt) if key in r else ""

    for r in rows:
        lines.append(
            f"| {r['B']}x{r['T']} | {r['HV']} | {r['who']} | {f(r, 'eager_ms', '.3f')} | {f(r, 'graph_ms', '.3f')} | "
            f"{f(r, 'eager_over_graph', '.2f')} | {f(r, 'replay_rel_l2', '.1e')} | {f(r, 'new_inputs_rel_l2', '.1e')} | "
            f"{r.get('error', '')} |"
        )
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--shapes", default="1x8192", help="BxT,...")
    ap.add_argument("--hv", type=int, default=16, help="value heads, a multiple of H=16")
    ap.add_argument("--peers", default="fla,flash_qla", help=f"comma list of {', '.join(PEERS)} (or none)")
    ap.add_argument("--dry-run", action="store_true", help="the CPU, tiny shapes, our steps eagerly: plumbing only")
    a = ap.parse_args()
    peers = [] if a.peers in ("", "none") else a.peers.split(",")
    if bad := [p for p in peers if p not in PEERS]:
        ap.error(f"--peers: unknown {bad}; known: {', '.join(PEERS)} (or none)")
    if a.hv < 16 or a.hv % 16:
        ap.error(f"--hv must be a multiple of H=16, got {a.hv}")
    try:
        shapes = [(1, 128)] if a.dry_run else [tuple(int(x) for x in s.split("x")) for s in a.shapes.split(",")]
    except ValueError:
        ap.error(f"--shapes: BxT,... (e.g. 1x8192), got {a.shapes!r}")
    os.environ.setdefault("FLA_DISABLE_BACKEND_DISPATCH", "1")  # FLA's own Triton path, not FlashQLA through it
    import torch
    import triton

    from runners.versions import git_sha

    who = ["ours", "ours direct"]
    if not a.dry_run:
        who += [{"fla": "fla", "flash_qla": "flash_qla CP"}[p] for p in peers]
    meta = {
        "command": " ".join(sys.argv),
        "device": "cpu (interpreter)" if a.dry_run else torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "sha": git_sha() or os.environ.get("CPBENCH_GIT_SHA", "unknown"),
    }
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    rows: list[dict[str, Any]] = []
    for B, T in shapes:
        rows += run_shape(B, T, a.hv, who, cuda=not a.dry_run)
        (out / "cuda_graph_step.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
        head = "# A training step eager and as a CUDA graph\n\n" + "".join(f"- {k}: `{v}`\n" for k, v in meta.items())
        (out / "cuda_graph_step.md").write_text(head + "\n" + table(rows) + "\n")


if __name__ == "__main__":
    main()
