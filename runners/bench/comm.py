"""`cpbench bench comm`: the links of a cluster, measured once for the scaling model (`dashboards.scaling_model`).

Times, on the current gang, the collectives the CP schemes issue at the sizes they use for one shape (`--op`,
`--T`, `--H`, `--K`, `--V`, `--dtype`; `scheme_sizes`, the payloads `dashboards.cost_model.comm_cost` counts):
send/recv (ring's state, tail_exchange's window), all_gather (true_cp's summaries and gradient terms, all_gather's
input blocks), all_to_all (headwise's buffers) and reduce_scatter (all_gather's backward). No scheme issues an
all-reduce, so none is timed. Two small messages (1 KiB, 16 KiB) anchor the latency.

The gang: under torchrun (`WORLD_SIZE`, `RANK`, `LOCAL_WORLD_SIZE` set; `torchrun ... -m runners.bench.comm`)
every process is one rank, `init_process_group` from the environment (c10d rendezvous), hosts = WORLD_SIZE /
LOCAL_WORLD_SIZE; otherwise this process spawns `--world` ranks on this host (`runners.gang.Gang`), and
`--ranks-per-host R` splits them into W/R pretend hosts (rank r on host r // R; a CPU test of the inter-host path
over loopback, where both link classes are the same wire). NCCL on GPUs, gloo with `--cpu`.

Timing: per sample a barrier, then the call and (on CUDA) a device sync, on every rank; the sample is the max over
ranks of the wall time; the median of `--iters` samples after `--warmup`. send/recv is a ping-pong between rank 0
and one peer on its host (intra) and one on another host (inter): half the round trip. Progress: one line per
timed size on stderr.

The fit: per link class, the least-squares line time = alpha + beta bytes through its send/recv medians (alpha and
beta kept >= 0). The group collectives are stored beside them, so the model can be held against them
(`dashboards.links.comm_check`).

Output: `--out` (default benchmarks/results/comm_<device>.json): {"links": {class: {alpha_s, beta_s_per_byte}},
"measured": [fitted classes], "source", "topology" (hosts, ranks_per_host, interconnect as a measurement records
them, `db.topology`, and W), "shape", "samples", "environment"}: the JSON
`dashboards.links.CommParams.from_json` reads (the server reads it from CPBENCH_COMM_PARAMS).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from db.topology import Topology
from kernels.vocabulary import DTYPE_BYTES, TAIL_EXCHANGE_WINDOW_CHUNKS
from runners.bench.common import environment, result_stem
from runners.gang import Gang, RankContext
from runners.topology import RankPlace, inter_host_link, intra_host_link, topology_of

__all__ = ["fit_link", "main", "scheme_sizes"]

LATENCY_SIZES = (1024, 16384)  # small messages that pin the latency
CHUNK = 64


def scheme_sizes(
    *, op: str, T: int, H: int, K: int, V: int, W: int, dtype_bytes: int, window: int = TAIL_EXCHANGE_WINDOW_CHUNKS
) -> dict[str, list[int]]:
    """Per collective kind, the payloads (the profiler's bytes of one call, sorted, distinct) the schemes issue at one
    sequence of T tokens over W ranks, contiguous: the sizes of `dashboards.cost_model.comm_cost` (tests compare)."""
    gate = 1 if op == "gdn" else K
    tok_in = H * ((2 * K + V + 1) * dtype_bytes + gate * 4)
    tok_out = H * V * dtype_bytes
    local = T // W
    sizes = {
        "send": [H * K * V * 4, min(window * CHUNK, local) * H * ((K + V + 1) * dtype_bytes + gate * 4)],
        "all_gather": [H * K * (K + V) * 4, H * K * V * 4, local * tok_in],
        "all_to_all": [local * tok_in, local * tok_out],
        "reduce_scatter": [T * H * ((2 * K + V + 1) * 4 + gate * 4)],
    }
    return {k: sorted(set(v)) for k, v in sizes.items()}


def fit_link(samples: list[tuple[int, float]]) -> dict[str, float] | None:
    """{alpha_s, beta_s_per_byte} of the line through (bytes, seconds) samples, both >= 0; None with < 2 sizes."""
    if len({b for b, _ in samples}) < 2:
        return None
    beta, alpha = statistics.linear_regression([float(b) for b, _ in samples], [s for _, s in samples])
    if alpha < 0 or beta < 0:  # a negative latency (or slope) from noise: the line through the origin (or flat)
        beta = max(0.0, sum(b * s for b, s in samples) / sum(b * b for b, _ in samples))
        alpha = max(0.0, statistics.median(s - beta * b for b, s in samples))
    return {"alpha_s": alpha, "beta_s_per_byte": beta}


# --------------------------------------------------------------------------------------------------------- on ranks
def _sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def _median_s(step: Any, dev: torch.device, iters: int, warmup: int) -> float:
    """The median over `iters` samples of the max over ranks of one call's wall time."""
    out = []
    for i in range(warmup + iters):
        dist.barrier()
        t0 = time.perf_counter()
        step()
        _sync(dev)
        dt = torch.tensor([time.perf_counter() - t0], dtype=torch.float64, device=dev)
        dist.all_reduce(dt, op=dist.ReduceOp.MAX)
        if i >= warmup:
            out.append(float(dt.cpu()[0]))
    return statistics.median(out)


def _pingpong(nbytes: int, peer: int, rank: int, dev: torch.device) -> Any:
    buf = torch.zeros(max(1, nbytes), dtype=torch.uint8, device=dev)

    def step() -> None:
        if rank == 0:
            dist.send(buf, peer)
            dist.recv(buf, peer)
        elif rank == peer:
            dist.recv(buf, 0)
            dist.send(buf, 0)

    return step


def _collective(kind: str, nbytes: int, W: int, dev: torch.device) -> Any:
    if kind == "all_gather":
        x = torch.zeros(max(1, nbytes), dtype=torch.uint8, device=dev)
        out = torch.empty(W * x.numel(), dtype=torch.uint8, device=dev)
        gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
        return lambda: gather(out, x)
    n = max(W, nbytes // 4 // W * W)  # fp32 elements, a multiple of W
    x = torch.zeros(n, dtype=torch.float32, device=dev)
    y = torch.empty(n if kind == "all_to_all" else n // W, dtype=torch.float32, device=dev)
    if kind == "all_to_all":
        return lambda: dist.all_to_all_single(y, x)
    rs = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    return lambda: rs(y, x)


def plan(args: dict[str, Any], W: int, rph: int) -> list[dict[str, Any]]:
    """What to time: (kind, bytes, peer, link) in order; the sizes capped at `max_bytes`."""
    sizes = scheme_sizes(
        op=args["op"], T=args["T"], H=args["H"], K=args["K"], V=args["V"], W=W, dtype_bytes=DTYPE_BYTES[args["dtype"]]
    )
    cap = args["max_bytes"]
    items = []
    peers = [("intra", 1)] if rph > 1 else []
    peers += [("inter", rph)] if rph < W else []
    for link, peer in peers:
        for b in sorted({*LATENCY_SIZES, *sizes["send"]}):
            items.append({"kind": "send", "bytes": min(b, cap), "peer": peer, "link": link})
    if W > 1:
        for kind in ("all_gather", "all_to_all", "reduce_scatter"):
            items += [{"kind": kind, "bytes": min(b, cap), "peer": None, "link": None} for b in sizes[kind]]
    return items


def rank_job(ctx: RankContext, args: dict[str, Any]) -> list[dict[str, Any]]:
    """Time every item of `plan` on this rank (all ranks take part in each); rank 0 returns the samples."""
    W, dev, rph = ctx.world_size, ctx.device, args["ranks_per_host"]
    items = plan(args, W, rph)
    out = []
    for i, item in enumerate(items, start=1):
        if item["kind"] == "send":
            step = _pingpong(item["bytes"], item["peer"], ctx.rank, dev)
            seconds = _median_s(step, dev, args["iters"], args["warmup"]) / 2
        else:
            seconds = _median_s(_collective(item["kind"], item["bytes"], W, dev), dev, args["iters"], args["warmup"])
        out.append({**item, "seconds": seconds})
        if ctx.rank == 0:
            where = f" to rank {item['peer']} ({item['link']})" if item["peer"] is not None else f" over {W} ranks"
            print(
                f"[{i}/{len(items)}] {item['kind']} {item['bytes']:,} B{where}: {seconds * 1e3:.4g} ms",
                file=sys.stderr,
                flush=True,
            )
    return out


def run_topology(W: int, rph: int, cpu: bool) -> Topology:
    """The topology a run timed, as a measurement records it (`runners.topology.topology_of`): W ranks, host-major,
    `rph` per host (pretend hosts without torchrun), the links as the process groups see them."""
    kind, backend = ("cpu", "gloo") if cpu else ("cuda", "nccl")
    places = [RankPlace(r // rph, f"host{r // rph}", r % rph, intra_host_link(kind)) for r in range(W)]
    return topology_of(places, inter_host_link(backend))


# ------------------------------------------------------------------------------------------------------------ main
def result(samples: list[dict[str, Any]], args: argparse.Namespace, W: int, rph: int, env: dict[str, Any]) -> dict[str, Any]:
    """The JSON document: fitted links, their provenance, the topology, the shape and every sample."""
    links = {}
    for link in ("intra", "inter"):
        fit = fit_link([(s["bytes"], s["seconds"]) for s in samples if s["kind"] == "send" and s["link"] == link])
        if fit is not None:
            links[link] = fit
    topo = run_topology(W, rph, args.cpu)
    return {
        "links": links,
        "measured": sorted(links),
        "source": f"cpbench bench comm, {env['date']}, {env.get('device')}, W={W} = {topo.label}",
        "topology": {**topo.columns(), "W": topo.W},
        "shape": {k: getattr(args, k) for k in ("op", "T", "H", "K", "V", "dtype")},
        "samples": samples,
        "environment": env,
    }


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="cpbench bench comm", description=__doc__.split("\n")[0])
    p.add_argument("--world", type=int, default=2, help="ranks to spawn on this host (ignored under torchrun)")
    p.add_argument(
        "--ranks-per-host",
        type=int,
        default=None,
        help="ranks per host (default: LOCAL_WORLD_SIZE under torchrun, else --world: one host)",
    )
    p.add_argument("--cpu", action="store_true", help="gloo on the CPU (default: NCCL, one GPU per rank)")
    p.add_argument("--op", choices=("gdn", "kda"), default="gdn")
    p.add_argument("--T", type=int, default=1048576, help="tokens of the one sequence whose sizes are timed")
    p.add_argument("--H", type=int, default=16)
    p.add_argument("--K", type=int, default=128)
    p.add_argument("--V", type=int, default=128)
    p.add_argument("--dtype", choices=tuple(DTYPE_BYTES), default="bfloat16")
    p.add_argument("--max-bytes", type=int, default=None, help="largest payload timed (default 256 MiB, 16 MiB on --cpu)")
    p.add_argument("--iters", type=int, default=10)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--out", default=None, help="the JSON file (default benchmarks/results/comm_<device>.json)")
    args = p.parse_args(argv)
    for name in ("world", "T", "H", "K", "V", "iters"):
        if getattr(args, name) < 1:
            p.error(f"--{name} must be >= 1, got {getattr(args, name)}")
    if args.max_bytes is None:
        args.max_bytes = (16 if args.cpu else 256) * 2**20
    return args


def _under_torchrun() -> bool:
    return all(k in os.environ for k in ("WORLD_SIZE", "RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR"))


def _torchrun_samples(job: dict[str, Any], cpu: bool) -> tuple[list[dict[str, Any]] | None, int]:
    """This process as one rank of a torchrun gang: (rank 0's samples or None, world size)."""
    rank, local = int(os.environ["RANK"]), int(os.environ.get("LOCAL_RANK", "0"))
    if cpu:
        dev, backend = torch.device("cpu"), "gloo"
    else:
        torch.cuda.set_device(local)
        dev, backend = torch.device("cuda", local), "nccl"
    dist.init_process_group(backend, timeout=timedelta(seconds=600))
    try:
        W = dist.get_world_size()
        ctx = RankContext(rank=rank, world_size=W, device=dev, backend=backend, group=dist.group.WORLD)
        samples = rank_job(ctx, job)
        return (samples if rank == 0 else None), W
    finally:
        dist.destroy_process_group()


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if args.cpu:
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    torchrun = _under_torchrun()
    W = int(os.environ["WORLD_SIZE"]) if torchrun else args.world
    rph = args.ranks_per_host or (int(os.environ["LOCAL_WORLD_SIZE"]) if torchrun else W)
    if W % rph:
        raise SystemExit(f"error: --ranks-per-host {rph} does not divide the {W} ranks")
    if not args.cpu and not torchrun and torch.cuda.device_count() < W:
        raise SystemExit(f"error: --world {W} needs {W} GPUs, found {torch.cuda.device_count()} (or pass --cpu)")
    job = {
        **{k: getattr(args, k) for k in ("op", "T", "H", "K", "V", "dtype", "max_bytes", "iters", "warmup")},
        "ranks_per_host": rph,
    }
    print(
        f"cpbench bench comm: W={W} = {run_topology(W, rph, args.cpu).label}, {'gloo' if args.cpu else 'nccl'}, "
        f"{len(plan(job, W, rph))} sizes",
        file=sys.stderr,
        flush=True,
    )
    if torchrun:
        samples, W = _torchrun_samples(job, args.cpu)
        if samples is None:
            return 0
    else:
        gang = Gang(W, device_kind="cpu" if args.cpu else "cuda", pg_timeout_s=600.0)
        try:
            samples = gang.run(rank_job, job, timeout_s=3600.0)[0]
        finally:
            gang.close()
    dev = torch.device("cpu") if args.cpu else torch.device("cuda", 0)
    env = environment(
        dev,
        command="cpbench bench comm " + " ".join(argv if argv is not None else sys.argv[1:]),
        cpu_label="cpu (gloo)",
        env_vars=("NCCL_IB_HCA", "NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME"),
    )
    doc = result(samples, args, W, rph, env)
    out = args.out or os.path.join("benchmarks", "results", result_stem("comm", None, env.get("device")) + ".json")
    os.makedirs(os.path.dirname(out) or ".", exist_ok=True)
    with open(out, "w") as f:
        json.dump(doc, f, indent=1, default=str)
    for link, fit in doc["links"].items():
        print(
            f"{link}: alpha {fit['alpha_s'] * 1e6:.1f} us, {1e-9 / fit['beta_s_per_byte'] if fit['beta_s_per_byte'] else float('inf'):.2f} GB/s"
        )
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
