"""The real models' calls on the GPU (issue 25's show): the Gated DeltaNet layers of Qwen3-Next / Qwen3.5 and the KDA
layer of Kimi Linear (shapes from runners/suites/models.yaml), called as the models call FLA:
`use_gate_in_kernel=True` with `A_log` and `dt_bias`, `use_qk_l2norm_in_kernel=True`.

1. error: our triton call's output and every gradient (dq, dk, dv, dg_raw, dbeta, dA_log, ddt_bias) against the
   fp32 per-token reference (the gate written out in fp32, as FLA's formula), with the in-kernel gate and with the
   same gate precomputed; FLA's same call beside ours;
2. speed: our forward against FLA's same call in one process (FLA_DISABLE_BACKEND_DISPATCH=1, FLA's Triton path),
   `triton.testing.do_bench` medians, with the bytes floor at the measured copy ceiling; our training step too.
FLA runs forward only: its backward's first call autotunes for minutes per shape (its KDA backward outran 292 s in
session 7), and it refuses its GDN backward on Hopper with Triton < 3.7.1 (FLA #640).

    python benchmarks/real_model_calls.py --out DIR [--T 8192 32768] [--ref-T 1024] [--no-fla] [--dry-run]

Needs torch, triton and pyyaml (FLA for its columns); the shapes are read from the suite's YAML documents as they
are (no pydantic on the device). `--dry-run`: tiny fp32 shapes on the CPU under the Triton interpreter (plumbing only: its bf16 dot is
wrong, ../shared/anchors/cpu-feasibility.md).
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
import torch.nn.functional as F
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from runners.correctness import rel_l2  # noqa: E402
from runners.workload import make_inputs  # noqa: E402

SUITE = ROOT / "runners" / "suites" / "models.yaml"
COPY_TBPS = 4.2  # the H200's measured copy ceiling (kernels/NOTES.md)
GRADS = ("dq", "dk", "dv", "dg_raw", "dbeta", "dA_log", "ddt_bias")


def models() -> list[dict[str, Any]]:
    """(name, op, H, HV, K, V) of each sweep of the suite, read from its YAML documents."""
    out = []
    for doc in yaml.safe_load_all(SUITE.read_text()):
        a = doc["axes"]
        out.append(
            {"model": doc["tags"][2], "op": doc["ops"][0], "H": a["H"], "HV": a.get("HV", a["H"]), "K": a["K"], "V": a["V"]}
        )
    return out


def gate_fp32(op: str, g_raw: torch.Tensor, A_log: torch.Tensor, dt_bias: torch.Tensor) -> torch.Tensor:
    """FLA's in-kernel gate written out: g = -exp(A_log) * softplus(g_raw + dt_bias), fp32."""
    HV = g_raw.shape[2]
    a = A_log.float().exp().view(HV) if op == "gdn" else A_log.float().exp().view(HV, 1)
    return -a * F.softplus(g_raw.float() + dt_bias.float().view(g_raw.shape[2:]))


def inputs(m: dict[str, Any], T: int, device: str, dtype: str) -> dict[str, Any]:
    w = make_inputs(
        m["op"],
        B=1,
        T=T,
        H=m["H"],
        HV=m["HV"],
        K=m["K"],
        V=m["V"],
        lb=-1.0,
        dtype=dtype,
        seed=0,
        device=device,
        gate="in_kernel",
        grad_out=True,
    )
    A_log, dt_bias = w.params
    return {
        "q": w.q,
        "k": w.k,
        "v": w.v,
        "g_raw": w.g.to(w.q.dtype),
        "beta": w.beta,
        "A_log": A_log,
        "dt_bias": dt_bias,
        "do": w.do,
    }


def ours(op: str, backend: str = "triton") -> Any:
    import kernels

    fn = kernels.chunk_gdn if op == "gdn" else kernels.chunk_kda

    def call(x: dict[str, Any], in_kernel: bool) -> torch.Tensor:
        kw = {"use_gate_in_kernel": True, "A_log": x["A_log"], "dt_bias": x["dt_bias"]} if in_kernel else {}
        g = x["g_raw"] if in_kernel else gate_fp32(op, x["g_raw"], x["A_log"], x["dt_bias"])
        return fn(x["q"], x["k"], x["v"], g, x["beta"], use_qk_l2norm_in_kernel=True, backend=backend, **kw)[0]

    return call


def fla(op: str) -> Any:
    if op == "gdn":
        from fla.ops.gated_delta_rule import chunk_gated_delta_rule as fn
    else:
        from fla.ops.kda import chunk_kda as fn

    def call(x: dict[str, Any], in_kernel: bool) -> torch.Tensor:
        kw = {"use_gate_in_kernel": True, "A_log": x["A_log"], "dt_bias": x["dt_bias"]} if in_kernel else {}
        g = x["g_raw"] if in_kernel else gate_fp32(op, x["g_raw"], x["A_log"], x["dt_bias"])
        return fn(x["q"], x["k"], x["v"], g, x["beta"], use_qk_l2norm_in_kernel=True, **kw)[0]

    return call


def reference(op: str, x: dict[str, Any]) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """The fp32 per-token recurrence on fp32 leaves, the gate and the l2norm written out: (o, input gradients)."""
    import kernels

    leaves = {n: x[n].detach().float().requires_grad_() for n in ("q", "k", "v", "g_raw", "beta", "A_log", "dt_bias")}
    q, k = (F.normalize(leaves[n], p=2, dim=-1, eps=1e-6) for n in ("q", "k"))
    g = gate_fp32(op, leaves["g_raw"], leaves["A_log"], leaves["dt_bias"])
    o = kernels.reference(op, q, k, leaves["v"], g, leaves["beta"])[0]
    o.backward(x["do"].float())
    return o.detach(), [leaves[n].grad for n in ("q", "k", "v", "g_raw", "beta", "A_log", "dt_bias")]


def errors(
    op: str, call: Any, x: dict[str, Any], ref: tuple[torch.Tensor, list[torch.Tensor]], in_kernel: bool, grads: bool
) -> dict[str, float]:
    """rel_l2 of the output and (in-kernel gate, `grads`) of every gradient against the reference."""
    leaves = {n: x[n].detach().clone().requires_grad_() for n in ("q", "k", "v", "g_raw", "beta", "A_log", "dt_bias")}
    o = call(leaves, in_kernel)
    out = {"o": rel_l2(o.float(), ref[0])}
    if in_kernel and grads:
        o.backward(x["do"])
        for name, leaf, want in zip(GRADS, leaves.values(), ref[1], strict=True):
            out[name] = rel_l2(leaf.grad.float(), want) if leaf.grad is not None else float("nan")
    return out


def timed(fn: Any, device: str) -> float:
    if device != "cuda":
        t0 = time.perf_counter()
        fn()
        return (time.perf_counter() - t0) * 1e3
    from triton.testing import do_bench

    import kernels

    fn()
    kernels.wait_for_builds()  # the TileLang kernels a first call left building: never time a mix
    return float(do_bench(fn, warmup=10, rep=100))


def speed(m: dict[str, Any], T: int, call: Any, device: str, dtype: str, train: bool) -> dict[str, float]:
    x = inputs(m, T, device, dtype)
    with torch.no_grad():
        fwd = timed(lambda: call(x, True), device)
    if not train:
        return {"fwd_ms": fwd}
    leaves = {n: (t.detach().requires_grad_() if n != "do" else t) for n, t in x.items()}

    def step() -> None:
        for t in leaves.values():
            t.grad = None
        call(leaves, True).backward(leaves["do"])

    return {"fwd_ms": fwd, "fwd_bwd_ms": timed(step, device)}


def floor_ms(m: dict[str, Any], T: int) -> float:
    """The forward's bytes (q, k, v, raw gate, beta read once, o written once; bf16) at the copy ceiling."""
    gk = 1 if m["op"] == "gdn" else m["K"]
    per_token = m["H"] * 2 * m["K"] + m["HV"] * (2 * m["V"] + gk + 1)
    return T * per_token * 2 / (COPY_TBPS * 1e12) * 1e3


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--T", type=int, nargs="+", default=[8192, 32768])
    ap.add_argument("--ref-T", type=int, default=1024, help="tokens of the error check (the reference is per token)")
    ap.add_argument("--no-fla", action="store_true")
    ap.add_argument("--dry-run", action="store_true")
    ap.add_argument("--models", nargs="+", help="only these models (models.yaml names, e.g. Kimi-Linear-48B-A3B)")
    args = ap.parse_args()
    os.environ.setdefault("FLA_DISABLE_BACKEND_DISPATCH", "1")
    device, dtype = ("cpu", "float32") if args.dry_run else ("cuda", "bfloat16")
    shapes = [m for m in models() if not args.models or m["model"] in args.models]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.dry_run:
        shapes = [{**m, "H": 2, "HV": 2 * m["HV"] // m["H"], "K": 16, "V": 16} for m in shapes]
        args.T, args.ref_T = [64], 64
    rows: list[dict[str, Any]] = []
    for m in shapes:
        op = m["op"]
        x = inputs(m, args.ref_T, device, dtype)
        ref = reference(op, x)
        row: dict[str, Any] = {**m, "ref_T": args.ref_T}
        for who, call in (("ours", ours(op)), *(() if args.no_fla else (("fla", fla(op)),))):
            for in_kernel in (True, False):
                try:
                    row[f"{who}_err_{'in_kernel' if in_kernel else 'precomputed'}"] = errors(
                        op, call, x, ref, in_kernel, grads=who == "ours"
                    )
                except Exception as err:  # FLA failing is a result, not a crash of this script
                    row[f"{who}_err_{'in_kernel' if in_kernel else 'precomputed'}"] = {"error": repr(err)[:200]}
            for T in args.T:
                try:
                    row[f"{who}_T{T}"] = speed(m, T, call, device, dtype, train=who == "ours")
                except Exception as err:
                    row[f"{who}_T{T}"] = {"error": repr(err)[:200]}
                row[f"floor_T{T}_ms"] = floor_ms(m, T)
        rows.append(row)
        print("ROW", json.dumps(row), flush=True)
        (out / "real_model_calls.json").write_text(json.dumps(rows, indent=1))  # each model kept as it finishes
    print(report(rows, args.T))


def report(rows: list[dict[str, Any]], Ts: list[int]) -> str:
    lines = [
        "| model | op | H/HV/K/V | who | T | fwd ms | fwd+bwd ms | fwd floor ms |",
        "|---|---|---|---|---:|---:|---:|---:|",
    ]
    for r in rows:
        for who in ("ours", "fla"):
            for T in Ts:
                s = r.get(f"{who}_T{T}")
                if s is None:
                    continue
                f, b = (f"{s[k]:.3f}" if k in s else s.get("error", "")[:40] for k in ("fwd_ms", "fwd_bwd_ms"))
                lines.append(
                    f"| {r['model']} | {r['op']} | {r['H']}/{r['HV']}/{r['K']}/{r['V']} | {who} | {T} | {f} | {b} "
                    f"| {r[f'floor_T{T}_ms']:.3f} |"
                )
    lines += ["", "errors (rel_l2 vs the fp32 per-token reference):"]
    for r in rows:
        for key in [k for k in r if "_err_" in k]:
            e = r[key]
            text = ", ".join(f"{n} {v:.1e}" for n, v in e.items()) if "error" not in e else e["error"]
            lines.append(f"- {r['model']} {key}: {text}")
    return "\n".join(lines)


if __name__ == "__main__":
    main()
