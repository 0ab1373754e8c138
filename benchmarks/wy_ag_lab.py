"""GDN's WY passes on the GPU: today's `wy_gdn_fwd` (w, u, Aqk, gcum) against the two-kernel forward's `wy_gdn_ag`
(Ag = T diag(beta) and gcum only) at both row tilings (launch config BR 16 and 64) and a few launch configs.

    python3 benchmarks/wy_ag_lab.py --out $OUT [--T 131072] [--H 16] [--HV 16] [--K 128]

(session 20) The configs carry VARIANT bits too (`AG_VARIANTS`: the diagonal blocks' inverse), each is timed with and
without the bound sums (`bnd`, v's rows read: the forward's warm split, the step's form), and Ag is checked from fp32
k as well (Ag stored in fp32: the solve's own error, e.g. a tf32 product's).

bf16 inputs, B=1, dense, 64-token chunks, gates logsigmoid(randn). First each `wy_gdn_ag` config against the fp64
triangular solve (`kernels.common.ag_torch.ag_reference`) at T=8192 (rel_l2 of Ag; bf16 output: ~3e-3 expected),
then each launcher timed alone (`triton.testing.do_bench` median, ms) next to its bytes floor at 4.2 TB/s (every
input read once, every output written once). Prints one line per row; writes $OUT/wy_ag_lab.json.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kernels.common.ag_torch import ag_reference  # noqa: E402
from kernels.common.index import prepare_chunk_index  # noqa: E402
from kernels.common.wy import wy_gdn_fwd  # noqa: E402
from kernels.configs import LaunchConfig  # noqa: E402
from kernels.ops.gdn.wy_ag import AG_VARIANTS, wy_gdn_ag  # noqa: E402
from kernels.plan import LaunchPlan  # noqa: E402
from runners.correctness import rel_l2  # noqa: E402

COPY_TBS = 4.2  # the H200's measured copy rate, TB/s (kernels/NOTES.md)
BT = 64
AG_CONFIGS = (  # (BR, BK, num_warps, VARIANT bits of AG_VARIANTS): the default first
    (16, 32, 1, 0),
    (16, 32, 1, AG_VARIANTS["exact_inverse"]),  # (session 20) the diagonal blocks' inverse by fp32 substitution
    (16, 32, 1, AG_VARIANTS["exp2"]),
)
# Session 20 on the H200 (1x64K, ms without / with the bound sums): the diagonal blocks' inverse as four loops (before)
# 0.357 / 0.480, in one loop (`_inv_diag4`, now `exact_inverse`) 0.315 / 0.436, the tf32 product form (now the
# default) 0.241 / 0.370, the same in tf32x3 0.373 / 0.478 (`results/wy_ag_lab_s20_h200.md`).


def inputs(T: int, H: int, HV: int, K: int, seed: int = 0):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    q = torch.randn(1, T, H, K, device="cuda", generator=gen).bfloat16()
    k = torch.nn.functional.normalize(torch.randn(1, T, H, K, device="cuda", generator=gen), dim=-1).bfloat16()
    v = torch.randn(1, T, HV, K, device="cuda", generator=gen).bfloat16()
    g = torch.nn.functional.logsigmoid(torch.randn(1, T, HV, device="cuda", generator=gen))
    beta = torch.rand(1, T, HV, device="cuda", generator=gen).sigmoid().bfloat16()
    return q, k, v, g, beta


def floor_ms(nbytes: float) -> float:
    return nbytes / (COPY_TBS * 1e12) * 1e3


def main() -> None:
    import triton.testing

    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--T", type=int, default=131072)
    ap.add_argument("--H", type=int, default=16)
    ap.add_argument("--HV", type=int, default=None, help="value heads (default H)")
    ap.add_argument("--K", type=int, default=128)
    args = ap.parse_args()
    T, H, K = args.T, args.H, args.K
    HV = args.HV or H
    plans = {
        cfg: LaunchPlan(configs={"wy_gdn_ag_fwd": LaunchConfig(BK=cfg[1], num_warps=cfg[2], BR=cfg[0], VARIANT=cfg[3])})
        for cfg in AG_CONFIGS
    }
    rows: list[dict[str, object]] = []

    # correctness at 8K: Ag against the fp64 solve, from bf16 k (Ag stored in bf16) and from fp32 k (Ag in fp32: the
    # solve's own error, e.g. a tf32 product's)
    q, k, v, g, beta = inputs(8192, H, HV, K)
    index = prepare_chunk_index(None, batch=1, seq_len=8192, chunk_size=BT, device="cuda")
    for dtype in (torch.bfloat16, torch.float32):
        kd = k.to(dtype)
        ag_ref, g_ref = ag_reference(kd, g, beta, index=index)
        for cfg, plan in plans.items():
            if dtype == torch.float32 and cfg[3] & AG_VARIANTS["exp2"]:
                continue  # (one compile fewer: the fp32 check is for the inverse's variants)
            ag, gcum = wy_gdn_ag(kd, g, beta, index=index, launch=plan)
            row = {
                "check": f"ag_rel_l2_T8192_{str(dtype).removeprefix('torch.')}",
                "config": list(cfg),
                "ag": rel_l2(ag.double(), ag_ref),
                "gcum": rel_l2(gcum.double(), g_ref),
            }
            print(json.dumps(row), flush=True)
            rows.append(row)

    # timing at T
    q, k, v, g, beta = inputs(T, H, HV, K)
    index = prepare_chunk_index(None, batch=1, seq_len=T, chunk_size=BT, device="cuda")
    tok_k, tok_v = T * H, T * HV  # key-head and value-head tokens
    gate_bytes = tok_v * (4 + 2) + tok_v * 4  # g fp32 + beta bf16 read, gcum fp32 written
    # today's pass on value heads (the forward repeats q, k to HV before it): q k v in, w u Aqk out
    qr, kr = q.repeat_interleave(HV // H, 2), k.repeat_interleave(HV // H, 2)
    wy_bytes = 5 * tok_v * K * 2 + tok_v * BT * 2 + gate_bytes
    ms = triton.testing.do_bench(lambda: wy_gdn_fwd(qr, kr, v, g, beta, scale=K**-0.5, index=index))
    rows.append({"kernel": "wy_gdn_fwd", "ms": ms, "floor_ms": floor_ms(wy_bytes), "MB": wy_bytes / 1e6})
    print(json.dumps(rows[-1]), flush=True)
    ag_bytes = tok_k * K * 2 + tok_v * BT * 2 + gate_bytes  # k in, Ag out
    # with the bound sums (the forward's warm split: the step's form), v's rows read too
    nt = triton.cdiv(T, BT)
    bnd = torch.empty(nt, HV, 2, device="cuda")
    for cfg, plan in plans.items():
        for bound in (False, True):
            kw = {"bnd": bnd, "v": v} if bound else {}
            ms = triton.testing.do_bench(lambda plan=plan, kw=kw: wy_gdn_ag(k, g, beta, index=index, launch=plan, **kw))
            nbytes = ag_bytes + (tok_v * K * 2 + nt * HV * 8 if bound else 0)
            rows.append({"kernel": "wy_gdn_ag", "config": list(cfg), "bound": bound, "ms": ms,
                         "floor_ms": floor_ms(nbytes), "MB": nbytes / 1e6})  # fmt: skip
            print(json.dumps(rows[-1]), flush=True)
    meta = {
        "T": T,
        "H": H,
        "HV": HV,
        "K": K,
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "triton": triton.__version__,
    }
    Path(args.out).mkdir(parents=True, exist_ok=True)
    Path(args.out, "wy_ag_lab.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
