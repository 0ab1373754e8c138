"""KDA's per-key decayed products alone, on their two implementations in one process (issue 26, session 29): the
TileLang lab kernel (`kernels.ops.kda.decay_products_hopper`: 16-row blocks, warpgroup products in bf16 hi/lo parts)
against the Triton tiles the backward's gradient kernels use today (`kernels.common.bwd_tiles._rows_vec` and
`_cols_vec` at the backward's tf32 precision, `kernels.common.chunk_bwd.VECTOR_GATE_DOT`, in a kernel of this lab's
that does nothing else), on the same
inputs: the core of the planned chunk-parallel KDA backward (`kernels/NOTES.md`,
"KDA's backward, the next kernel"), where `chunk_bwd_dqk` and `wy_bwd` spend 11.8 ms of the 1x64K step.

    python benchmarks/decay_products_lab.py [--chunks 1024] [--heads 16] [--bks 32,64] [--no-state] [--no-finish]
        [--finish-labs wg1,no_finish+wg4] [--once]   # --once: one untimed launch per build, for ncu
        [--fp32-io] [--prebuild 16] [--out $OUT]

Inputs: NT chunks x H heads of X `[64, 64]` fp32 (lower with the diagonal), a `[64, 128]` bf16 and G `[64, 128]`
fp32 (the in-chunk cumsum of -0.05 rand: the fast path). Per implementation: the do_bench median (ms) of R and Cc
together, and their relative L2 against the fp64 mirror (`decayed_products_blocks`) on the first 16 chunks; the floor:
the bytes read and written (X, a, G, R, Cc) at 4.2 TB/s, and the products' flops at the matmul rate
(`runners.bench.floors.HBM_TBPS`; 2 x 64 x 64 x 128 per block and side, 8 blocks). Unless --no-state, the kernel's
other half too: the state products (`kernels.ops.kda.state_grads_hopper`, nine 64-row bf16 products per chunk and
head) on random states and kept tensors of the same sizes, beside its bytes floor (h, dh, v, dO, Ag, Aqk, ke, kd read
in bf16; its seven outputs written in fp32); unless --no-finish, the second half (`kernels.ops.kda.bwd_products_hopper`:
dA, the four decayed products, dq, dk, dg, dbeta) beside its bytes floor, in the step's dtypes since session 33 (g,
dqg, dke, dkd read and dq, dk, dg written in bf16; --fp32-io: in fp32, the form sessions 31-33 timed), its builds
(the default and each of --finish-labs) made first in --prebuild processes at once (TileLang builds one in ~35 s in
one thread: session 33's first call spent its lab's time building five one after another). Writes
$OUT/decay_products_lab.json and .md.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import torch
import triton
import triton.language as tl

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.tilelang_builds import build_ahead  # noqa: E402
from kernels.common.bwd_tiles import _cols_vec, _rows_vec  # noqa: E402
from kernels.common.chunk_bwd import VECTOR_GATE_DOT  # noqa: E402
from runners.bench.floors import HBM_TBPS  # noqa: E402

C, K = 64, 128


@triton.jit
def _triton_products(x, a, g, rr, cc, H: tl.constexpr, K: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr,
                     PREC: tl.constexpr):  # fmt: skip
    """R and Cc of one chunk, head and key block by the backward's tiles (`_rows_vec`, `_cols_vec`; nothing else).
    (Session 29's per-block 2-D form of them took 2.85-3.91 ms against these tiles' 1.96 on the H200,
    `results/decay_products_lab_s30_h200.md`: removed in session 30.)"""
    i_k, i_c, i_h = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    o_t = tl.arange(0, BT)
    o_k = i_k * BK + tl.arange(0, BK)
    X = tl.load(x + ((i_c * H + i_h) * BT + o_t[:, None]) * BT + o_t[None, :])
    p = ((i_c * BT + o_t) * H + i_h)[:, None] * K + o_k[None, :]
    b = tl.load(a + p).to(tl.float32)
    G = tl.load(g + p)
    tl.store(rr + p, _rows_vec(X, b, G, BT, BK, tl.bfloat16, PREC))
    tl.store(cc + p, _cols_vec(X, b, G, BT, BK, tl.bfloat16, PREC))


def triton_products(X: torch.Tensor, a: torch.Tensor, G: torch.Tensor, BK: int) -> tuple[torch.Tensor, torch.Tensor]:
    NT, H = X.shape[:2]
    R, Cc = torch.empty_like(G), torch.empty_like(G)
    _triton_products[(K // BK, NT, H)](X, a, G, R, Cc, H=H, K=K, BT=C, BK=BK, PREC=VECTOR_GATE_DOT, num_warps=4)
    return R, Cc


def inputs(NT: int, H: int, device: str = "cuda") -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    gen = torch.Generator(device=device).manual_seed(0)
    X = torch.randn(NT, H, C, C, generator=gen, device=device).tril()
    a = torch.randn(NT * C, H, K, generator=gen, device=device).to(torch.bfloat16)
    g = -0.05 * torch.rand(NT, C, H, K, generator=gen, device=device)
    return X, a, g.cumsum(1).reshape(NT * C, H, K)


def run(NT: int, H: int, bks: list[int]) -> dict[str, Any]:
    from triton.testing import do_bench

    from kernels.ops.kda.decay_products_hopper import decay_products_hopper
    from kernels.ops.kda.reverse_bwd_torch import decayed_products_blocks

    X, a, G = inputs(NT, H)
    n = min(NT, 16)
    ac, Gc = (t[: n * C].view(n, C, H, K).transpose(1, 2).double().cpu() for t in (a, G))
    want = [t.transpose(1, 2).reshape(n * C, H, K) for t in decayed_products_blocks(X[:n].double().cpu(), ac, Gc)]

    def err(got: tuple[torch.Tensor, torch.Tensor]) -> dict[str, float]:
        return {name: float((g[: n * C].double().cpu() - w).norm() / w.norm())
                for name, g, w in zip(("R", "Cc"), got, want, strict=True)}  # fmt: skip

    impls = {"tilelang": lambda: decay_products_hopper(X, a, G)}
    impls.update({f"triton BK {bk}": (lambda bk=bk: triton_products(X, a, G, bk)) for bk in bks})
    nbytes = NT * H * (C * C * 4 + C * K * (2 + 4 + 4 + 4))
    flops = NT * H * 8 * 2 * C * C * K
    row: dict[str, Any] = {"chunks": NT, "heads": H, "bytes_floor_ms": nbytes / (HBM_TBPS * 1e12) * 1e3,
                           "flops_floor_ms_at_688": flops / 688e12 * 1e3, "ms": {}, "rel_l2": {}}  # fmt: skip
    for name, fn in impls.items():
        row["rel_l2"][name] = err(fn())
        row["ms"][name] = do_bench(fn)
    return row


def run_state(NT: int, H: int) -> dict[str, Any]:
    """The state products kernel's time on random bf16 inputs (its values are checked by its GPU test)."""
    from triton.testing import do_bench

    from kernels.ops.kda.state_grads_hopper import state_grads_hopper

    gen = torch.Generator(device="cuda").manual_seed(1)

    def r(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, generator=gen, device="cuda").to(torch.bfloat16)

    args = (r(NT, H, K, K), r(NT, H, K, K), r(NT * C, H, K), r(NT * C, H, K), r(NT * C, H, C), r(NT * C, H, C),
            r(NT * C, H, K), r(NT * C, H, K), -torch.rand(NT, H, K, device="cuda"))  # fmt: skip
    nbytes = NT * H * (2 * K * K * 2 + C * (4 * K + 2 * C) * 2 + C * (4 * K + 2 * C) * 4 + K * 8)
    return {"ms": do_bench(lambda: state_grads_hopper(*args)), "bytes_floor_ms": nbytes / (HBM_TBPS * 1e12) * 1e3}


def run_finish(NT: int, H: int, labs: tuple[str, ...] = (), once: bool = False, fp32_io: bool = False,
               workers: int = 0) -> dict[str, Any]:  # fmt: skip
    """The products+finish kernel's time (`kernels.ops.kda.bwd_products_hopper`, the backward's second half: dA, four
    decayed products, dq, dk, dg, dbeta) on random inputs of the step's sizes, the fast path (its values are checked by
    its GPU test); its bytes floor: q, k, T, qg, ke, kd read in bf16, beta, dAqk, dAg in fp32, and g, dqg, dke, dkd read
    and dq, dk, dg written in bf16 as the step has them (fp32_io: in fp32), dbeta in fp32. workers: `prebuild`'s."""
    from triton.testing import do_bench

    from kernels.ops.kda.bwd_products_hopper import build_key, bwd_products_hopper

    gen = torch.Generator(device="cuda").manual_seed(2)
    N = NT * C

    def r(*shape: int, s: float = 1.0) -> torch.Tensor:
        return s * torch.randn(*shape, generator=gen, device="cuda")

    io = torch.float32 if fp32_io else torch.bfloat16  # g's, dqg's, dke's, dkd's, dq's, dk's, dg's
    q, k = (r(N, H, K).to(torch.bfloat16) for _ in range(2))
    g = (-0.05 * torch.rand(N, H, K, generator=gen, device="cuda")).to(io)
    kept = {n: r(N, H, K).to(torch.bfloat16) for n in ("qg", "ke", "kd")}
    grads = {"dAqk": r(N, H, C), "dAg": r(N, H, C), **{n: r(N, H, K).to(io) for n in ("dqg", "dke", "dkd")},
             "dGC": r(NT, H, K)}  # fmt: skip
    args = (q, k, g, torch.rand(N, H, device="cuda"), r(N, H, C, s=0.1).to(torch.bfloat16), kept, grads)
    nio = 2 if io == torch.bfloat16 else 4  # bytes of g, dqg, dke, dkd, dq, dk, dg
    nbytes = NT * H * C * ((5 * K + C) * 2 + (1 + 2 * C) * 4 + 7 * K * nio + 4)
    variants = [frozenset(x for x in lab.split("+") if x) for lab in ("", *labs)]
    if workers > 0:  # (the launcher's own keys, built side by side: `benchmarks.tilelang_builds`)
        keys = [build_key(k, g, grads, scale=K**-0.5, varlen=False, lab=sw, out_dtype=io) for sw in variants]
        secs = build_ahead([("kernels.ops.kda.bwd_products_hopper", key) for key in keys], workers)
        built = (f"{'+'.join(sorted(sw)) or 'default'} {t:.0f} s" for sw, t in zip(variants, secs, strict=True))
        print("built", ", ".join(built), flush=True)
    if once:  # (session 32) one launch per build, untimed: for a profiler (`ncu -k regex:bwd_products`) to read
        for sw in variants:
            bwd_products_hopper(*args, scale=K**-0.5, lab=sw, out_dtype=io)
        torch.cuda.synchronize()
        return {}
    out = {"ms": do_bench(lambda: bwd_products_hopper(*args, scale=K**-0.5, out_dtype=io)),
           "bytes_floor_ms": nbytes / (HBM_TBPS * 1e12) * 1e3, "io": str(io).removeprefix("torch.")}  # fmt: skip
    for lab, sw in zip(labs, variants[1:], strict=True):  # (session 31) the kernel with parts left out or swapped
        out[f"ms {lab}"] = do_bench(lambda sw=sw: bwd_products_hopper(*args, scale=K**-0.5, lab=sw, out_dtype=io))
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--chunks", type=int, default=1024)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--bks", default="32,64", help="the Triton tiles' key blocks")
    ap.add_argument("--no-state", action="store_true", help="leave the state products kernel out")
    ap.add_argument("--no-finish", action="store_true", help="leave the products+finish kernel out")
    ap.add_argument("--finish-labs", default="", help="the products+finish kernel's lab builds to time too "
                    "(`bwd_products_hopper.PRODUCTS_LAB_SWITCHES`, joined by +; comma list)")  # fmt: skip
    ap.add_argument("--fp32-io", action="store_true", help="the products+finish kernel's g, dqg, dke, dkd, dq, dk, dg "
                    "in fp32 (the form sessions 31-33 timed; default bf16, the step's)")  # fmt: skip
    ap.add_argument("--prebuild", type=int, default=16, help="processes building the products+finish kernel's builds "
                    "at once before timing (0: each builds at its first launch)")  # fmt: skip
    ap.add_argument("--out", type=Path, default=Path("/tmp/decay_products_lab"))
    ap.add_argument("--once", action="store_true", help="only the products+finish kernel, one launch per build "
                    "(the default, then each of --finish-labs), untimed: for `ncu -k regex:bwd_products`")  # fmt: skip
    a = ap.parse_args(argv)
    if a.once:
        run_finish(a.chunks, a.heads, tuple(x for x in a.finish_labs.split(",") if x), once=True, fp32_io=a.fp32_io,
                   workers=a.prebuild)  # fmt: skip
        return
    row = run(a.chunks, a.heads, [int(b) for b in a.bks.split(",")])
    if not a.no_state:
        row["state_products"] = run_state(a.chunks, a.heads)
    if not a.no_finish:
        row["products_finish"] = run_finish(a.chunks, a.heads, tuple(x for x in a.finish_labs.split(",") if x),
                                            fp32_io=a.fp32_io, workers=a.prebuild)  # fmt: skip
    row |= {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "triton": triton.__version__,
            "argv": sys.argv[1:]}  # fmt: skip
    print(json.dumps(row), flush=True)
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "decay_products_lab.json").write_text(json.dumps(row, indent=1))
    lines = [f"# KDA's decayed products alone ({row['chunks']} chunks x {row['heads']} heads; {row['device']})", "",
             f"floor: bytes {row['bytes_floor_ms']:.3f} ms, products {row['flops_floor_ms_at_688']:.3f} ms", "",
             "| implementation | ms | R rel L2 | Cc rel L2 |", "|---|---:|---:|---:|"]  # fmt: skip
    for name, ms in row["ms"].items():
        e = row["rel_l2"][name]
        lines.append(f"| {name} | {ms:.3f} | {e['R']:.1e} | {e['Cc']:.1e} |")
    if "state_products" in row:
        sp = row["state_products"]
        lines += ["", f"State products (TileLang): {sp['ms']:.3f} ms, bytes floor {sp['bytes_floor_ms']:.3f} ms"]
    if "products_finish" in row:
        pf = row["products_finish"]
        lines += ["", f"Products + finish (TileLang, {pf['io']} io): {pf['ms']:.3f} ms, bytes floor "
                  f"{pf['bytes_floor_ms']:.3f} ms"]  # fmt: skip
        lines += [f"- {name[3:]}: {ms:.3f} ms ({ms - pf['ms']:+.3f})" for name, ms in pf.items() if name.startswith("ms ")]
    (a.out / "decay_products_lab.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
