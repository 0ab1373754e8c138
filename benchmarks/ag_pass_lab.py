"""GDN's Ag pass on its two kernels in one process (issue 26, session 27): the Triton pass at the shipped launch
config (`benchmarks/results/autotune_h200.json`) against the TileLang kernel (`kernels.ops.gdn.ag_hopper`), each
alone, with the forward's bound sums (`bnd`: reads v too) and with the backward's reverse sums besides (`rev`: reads
q too), FlashQLA's `kkt_solve` (no gate, no sums) where flash-qla is installed, and the floor of each: the bytes it
must move (k, g, beta, Ag, gcum; v and the bound's 8 B a chunk; q and p, the reverse sums' 8 B a chunk) at 4.2 TB/s.

    python benchmarks/ag_pass_lab.py [--shapes 1x65536,8x8192,1x131072] [--hv 16] [--builds free,b4,q,b4+q] [--out $OUT]

--builds: the TileLang kernel's builds to time (`ag_hopper._build`): "free" (the default build: ptxas free, 161-168
registers, three programs an SM), "bN" (N programs an SM asked of ptxas: 4 caps registers at 128, four an SM where
shared memory allows: without sums), "q" (N^2 and N^3 from their nonzero blocks: half the tf32 work), joined by "+".

bf16, H = 16 key heads, K = V = 128, chunk 64, g = -2 rand (fp32, per token), beta = rand, q, v = randn, k
L2-normalised; do_bench medians (ms). Agreement of the TileLang outputs with Triton's: Ag's relative L2, the gate
cumsum's and the sums' largest |a - b| / (1 + |b|) over finite entries (-inf in the same places).
Writes $OUT/ag_pass_lab.json and $OUT/ag_pass_lab.md.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

COPY_TBS = 4.2  # the H200's measured copy ceiling (kernels/NOTES.md)


def _floor_ms(B: int, T: int, H: int, HV: int, mode: str) -> float:
    """The bytes a pass must move at the copy ceiling (ms)."""
    tok = B * T
    nbytes = tok * (H * 256 + HV * (4 + 2 + 128 + 4))  # k; g fp32, beta bf16, Ag bf16 [64], gcum fp32
    if mode != "ag":
        nbytes += tok * HV * 256 + tok // 64 * HV * 8  # v; (L, W) a chunk
    if mode == "ag+bnd+rev":
        nbytes += tok * H * 256 + tok * HV * 4 + tok // 64 * HV * 8  # q; p; (L + m A, A)
    return nbytes / (COPY_TBS * 1e12) * 1e3


def _diff(a: torch.Tensor, b: torch.Tensor) -> dict[str, Any]:
    fin = torch.isfinite(b)
    return {"max": float(((a - b).abs() / (1 + b.abs()))[fin].max()) if bool(fin.any()) else 0.0,
            "same_infinities": bool(torch.equal(a.isinf(), b.isinf()))}  # fmt: skip


def _build_knobs(name: str) -> tuple[int, bool]:
    """(blocks, quad) of a --builds name ("free", "b4", "q", "b4+q")."""
    parts = name.split("+")
    blocks = [int(p[1:]) for p in parts if p.startswith("b")]
    if any(p not in ("free", "q") and not p.startswith("b") for p in parts):
        raise ValueError(f"--builds: unknown build {name!r} (free, bN, q, joined by +)")
    return (blocks[0] if blocks else 0), "q" in parts


def run_shape(B: int, T: int, HV: int, table: Any, builds: tuple[str, ...] = ("free",)) -> dict[str, Any]:
    from triton.testing import do_bench

    from kernels.common.index import prepare_chunk_index
    from kernels.ops.gdn.ag_hopper import ag_hopper
    from kernels.ops.gdn.wy_ag import wy_gdn_ag
    from kernels.plan import LaunchPlan

    H, K, dev, bf = 16, 128, "cuda", torch.bfloat16
    torch.manual_seed(0)
    q = torch.randn(B, T, H, K, device=dev, dtype=bf)
    k = torch.nn.functional.normalize(torch.randn(B, T, H, K, device=dev), dim=-1).to(bf)
    v = torch.randn(B, T, HV, K, device=dev, dtype=bf)
    g = -2 * torch.rand(B, T, HV, device=dev)
    beta = torch.rand(B, T, HV, device=dev).to(bf)
    ix = prepare_chunk_index(None, batch=B, seq_len=T, chunk_size=64, device=torch.device(dev))
    NT = ix.num_chunks
    row: dict[str, Any] = {"shape": f"{B}x{T}", "HV": HV, "ms": {}, "floor_ms": {}, "agree": {}}
    outs: dict[str, dict[str, list[torch.Tensor]]] = {}
    plan = LaunchPlan(table=table, ag_pass="triton")
    for name in ("triton", *(f"tilelang {b}" for b in builds)):
        outs[name] = {}
        for mode in ("ag", "ag+bnd", "ag+bnd+rev"):
            bnd = torch.empty(NT, HV, 2, device=dev) if mode != "ag" else None
            rev = (torch.empty(B, T, HV, device=dev), torch.empty(NT, HV, 2, device=dev)) if mode.endswith("rev") else None
            knobs = _build_knobs(name.removeprefix("tilelang ")) if name != "triton" else (0, False)

            def call(name: str = name, bnd: Any = bnd, rev: Any = rev, knobs: tuple[int, bool] = knobs) -> Any:
                kw = {"bnd": bnd, "v": v if bnd is not None else None, "rev": rev, "q": q if rev is not None else None}
                if name == "triton":
                    return wy_gdn_ag(k, g, beta, index=ix, launch=plan, **kw)
                return ag_hopper(k, g, beta, index=ix, blocks=knobs[0], quad=knobs[1], **kw)

            ag, gcum = call()
            outs[name][mode] = [ag, gcum, *([bnd] if bnd is not None else []), *(rev or ())]
            row["ms"][f"{name} {mode}"] = do_bench(call)
            row["floor_ms"][mode] = _floor_ms(B, T, H, HV, mode)
    for name in outs:
        for mode, got in outs[name].items():
            ref = outs["triton"][mode]
            err = float((got[0].double() - ref[0].double()).norm() / ref[0].double().norm())
            row["agree"][f"{name} {mode}"] = {"ag_rel_l2": err, "gcum": _diff(got[1], ref[1]),
                                              **{f"sum{i}": _diff(a, b) for i, (a, b) in enumerate(zip(got[2:], ref[2:], strict=True))}}  # fmt: skip
    try:
        from flash_qla.ops.gated_delta_rule.chunk.hopper.kkt_solve import kkt_solve

        row["ms"]["flashqla kkt_solve"] = do_bench(lambda: kkt_solve(k, beta))  # (its grouped heads: k's H)
    except Exception as e:  # noqa: BLE001 (the peer is optional here: its absence is recorded, not fatal)
        row["flashqla"] = repr(e)[:200]
    return row


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shapes", default="1x65536,8x8192,1x131072")
    ap.add_argument("--hv", type=int, default=16)
    ap.add_argument("--builds", default="free,b4,q,b4+q", help="the TileLang builds to time (free, bN, q, joined by +)")
    ap.add_argument("--out", type=Path, default=Path("/tmp/ag_pass_lab"))
    a = ap.parse_args(argv)
    builds = tuple(a.builds.split(","))
    try:
        for b in builds:
            _build_knobs(b)
    except ValueError as err:
        ap.error(str(err))
    from kernels.autotune import load_autotune

    table = load_autotune(ROOT / "benchmarks/results/autotune_h200.json")
    rows = []
    for shape in a.shapes.split(","):
        B, T = (int(x) for x in shape.split("x"))
        rows.append(run_shape(B, T, a.hv, table, builds))
        print(json.dumps(rows[-1]), flush=True)
    out = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "rows": rows}
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "ag_pass_lab.json").write_text(json.dumps(out, indent=1))
    names = [f"tilelang {b}" for b in builds]
    lines = ["| shape | HV | mode | floor ms | Triton ms | " + " | ".join(f"{n} ms | {n}/Triton | {n} Ag rel L2" for n in names)
             + " | kkt_solve ms |", "|---|---:|---|---:|---:|" + "---:|---:|---:|" * len(names) + "---:|"]  # fmt: skip
    for r in rows:
        for mode in ("ag", "ag+bnd", "ag+bnd+rev"):
            tr = r["ms"][f"triton {mode}"]
            cells = " | ".join(f"{r['ms'][f'{n} {mode}']:.3f} | {r['ms'][f'{n} {mode}'] / tr:.2f} | "
                               f"{r['agree'][f'{n} {mode}']['ag_rel_l2']:.1e}" for n in names)  # fmt: skip
            kk = r["ms"].get("flashqla kkt_solve", float("nan")) if mode == "ag" else float("nan")
            lines.append(f"| {r['shape']} | {r['HV']} | {mode} | {r['floor_ms'][mode]:.3f} | {tr:.3f} | {cells} | {kk:.3f} |")
    (a.out / "ag_pass_lab.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
