"""GDN's Ag pass on its two kernels in one process (issue 26, session 27): the Triton pass at the shipped launch
config (`benchmarks/results/autotune_h200.json`) against the TileLang kernel (`kernels.ops.gdn.ag_hopper`), each
alone, with the forward's bound sums (`bnd`: reads v too) and with the backward's reverse sums besides (`rev`: reads
q too), FlashQLA's `kkt_solve` (no gate, no sums) where flash-qla is installed, and the floor of each: the bytes it
must move (k, g, beta, Ag, gcum; v and the bound's 8 B a chunk; q and p, the reverse sums' 8 B a chunk) at 4.2 TB/s.

    python benchmarks/ag_pass_lab.py [--shapes 1x65536,8x8192,1x131072] [--hv 16] [--builds free,b4,q,b4+q]
        [--modes ag,ag+bnd,ag+bnd+rev] [--kda-builds free,no_keys,...] [--jobs 8] [--out $OUT]

--builds: the TileLang kernel's builds to time (`ag_hopper._build`): "free" (the default build: ptxas free, 161-168
registers, three programs an SM), "bN" (N programs an SM asked of ptxas: 4 caps registers at 128, four an SM where
shared memory allows: without sums), "q" (N^2 and N^3 from their nonzero blocks: half the tf32 work), and the lab
switches (`ag_hopper.AG_LAB_SWITCHES`: each leaves one part of a program out, for timing only), joined by "+".
--kda-builds (session 29): KDA's TileLang Ag pass (`kernels.ops.kda.ag_hopper`, the gated form; "bound" (session 31):
with the forward's bound sums, as a split forward runs it, beside the Triton pass's with them) beside the
Triton pass's gated variant (alone, and storing T as under keep "ag") on KDA inputs at the same shapes: "free" and the switches of `KDA_AG_LAB_SWITCHES`,
joined by "+". Every TileLang build is compiled first, `--jobs` processes side by side (TileLang's disk cache then
serves the timing process). A switched build's time against "free" is what the part it leaves out costs.

bf16, H = 16 key heads, K = V = 128, chunk 64, g = -2 rand (fp32, per token; KDA: per key, -rand), beta = rand,
q, v = randn, k L2-normalised (KDA: q too); do_bench medians (ms). Agreement of the TileLang outputs with Triton's: Ag's relative L2, the gate
cumsum's and the sums' largest |a - b| / (1 + |b|) over finite entries (-inf in the same places).
Writes $OUT/ag_pass_lab.json and $OUT/ag_pass_lab.md.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.tilelang_builds import build_ahead  # noqa: E402

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


MODES = ("ag", "ag+bnd", "ag+bnd+rev")
H, K = 16, 128  # key heads, head dim


def _build_knobs(name: str) -> tuple[int, bool, frozenset[str]]:
    """(blocks, quad, lab switches) of a --builds name ("free", "b4", "q", switches, joined by "+")."""
    from kernels.ops.gdn.ag_hopper import AG_LAB_SWITCHES

    parts = name.split("+")
    blocks = [int(p[1:]) for p in parts if p.startswith("b") and p[1:].isdigit()]
    lab = frozenset(p for p in parts if p in AG_LAB_SWITCHES)
    if any(p not in ("free", "q") and p not in lab and not (p.startswith("b") and p[1:].isdigit()) for p in parts):
        raise ValueError(f"--builds: unknown build {name!r} (free, bN, q, {', '.join(AG_LAB_SWITCHES)}, joined by +)")
    return (blocks[0] if blocks else 0), "q" in parts, lab


def _kda_lab(name: str) -> frozenset[str]:
    """The lab switches of a --kda-builds name ("free", "bound", switches, joined by "+"; "bound" is not a switch: the
    build with the forward's bound sums, `_kda_bound`)."""
    from kernels.ops.kda.ag_hopper import KDA_AG_LAB_SWITCHES

    if name == "bound":
        return frozenset()
    parts = frozenset(name.split("+")) - {"free"}
    if parts - set(KDA_AG_LAB_SWITCHES):
        raise ValueError(f"--kda-builds: unknown build {name!r} (free, bound, {', '.join(KDA_AG_LAB_SWITCHES)}, joined by +)")
    return parts


def compile_all(hvs: list[int], builds: tuple[str, ...], modes: tuple[str, ...], kda_builds: tuple[str, ...],
                jobs: int) -> dict[str, float]:  # fmt: skip
    """Every build the timing will ask for, `jobs` side by side (`benchmarks.tilelang_builds.build_ahead`): seconds by
    "op args"; the keys are the launchers' (`ag_hopper.ag_hopper`'s, `kda_ag_hopper`'s) for this lab's dtypes."""
    from kernels.ops.gdn.ag_hopper import AG_HOPPER_SUMS

    sums = {"ag": 0, "ag+bnd": AG_HOPPER_SUMS["bnd"], "ag+bnd+rev": AG_HOPPER_SUMS["bnd"] | AG_HOPPER_SUMS["rev"]}
    todo: list[tuple[str, tuple[Any, ...]]] = []
    for hv in sorted(set(hvs)):
        todo += [("gdn", (hv, H, "bfloat16", "float32", "bfloat16", sums[m], *_build_knobs(b))) for b in builds for m in modes]
        todo += [("kda", (hv, H, float(K**-0.5), "float32", "bfloat16", b == "bound", False, _kda_lab(b)))
                 for b in kda_builds]  # fmt: skip
    modules = {"gdn": "kernels.ops.gdn.ag_hopper", "kda": "kernels.ops.kda.ag_hopper"}
    secs = build_ahead([(modules[op], args) for op, args in todo], jobs)
    return {f"{op} {args}": t for (op, args), t in zip(todo, secs, strict=True)}


def run_shape(B: int, T: int, HV: int, table: Any, builds: tuple[str, ...] = ("free",),
              modes: tuple[str, ...] = MODES) -> dict[str, Any]:  # fmt: skip
    from triton.testing import do_bench

    from kernels.common.index import prepare_chunk_index
    from kernels.ops.gdn.ag_hopper import ag_hopper
    from kernels.ops.gdn.wy_ag import wy_gdn_ag
    from kernels.plan import LaunchPlan

    dev, bf = "cuda", torch.bfloat16
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
        for mode in modes:
            bnd = torch.empty(NT, HV, 2, device=dev) if mode != "ag" else None
            rev = (torch.empty(B, T, HV, device=dev), torch.empty(NT, HV, 2, device=dev)) if mode.endswith("rev") else None
            knobs = _build_knobs(name.removeprefix("tilelang ")) if name != "triton" else (0, False, frozenset())

            def call(name: str = name, bnd: Any = bnd, rev: Any = rev, knobs: tuple[Any, ...] = knobs) -> Any:
                kw = {"bnd": bnd, "v": v if bnd is not None else None, "rev": rev, "q": q if rev is not None else None}
                if name == "triton":
                    return wy_gdn_ag(k, g, beta, index=ix, launch=plan, **kw)
                return ag_hopper(k, g, beta, index=ix, blocks=knobs[0], quad=knobs[1], lab=knobs[2], **kw)

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


def run_kda_shape(B: int, T: int, HV: int, builds: tuple[str, ...]) -> dict[str, Any]:
    """KDA's Ag pass in its gated form: the Triton pass (its `gated` variant at its default config, as
    `kda_fused_lab.py`'s gated forms) and the TileLang builds; ms and Ag's, Aqk's relative L2 against Triton's."""
    from triton.testing import do_bench

    from kernels.common.index import prepare_chunk_index
    from kernels.ops.kda.ag_hopper import kda_ag_hopper
    from kernels.ops.kda.wy_ag import gated_ag_plan, wy_kda_ag
    from kernels.plan import LaunchPlan

    dev, bf = "cuda", torch.bfloat16
    torch.manual_seed(0)
    q, k = (torch.nn.functional.normalize(torch.randn(B, T, H, K, device=dev), dim=-1).to(bf) for _ in range(2))
    g = -torch.rand(B, T, HV, K, device=dev)
    beta = torch.rand(B, T, HV, device=dev).to(bf)
    ix = prepare_chunk_index(None, batch=B, seq_len=T, chunk_size=64, device=torch.device(dev))
    scale = K**-0.5
    plan = gated_ag_plan(LaunchPlan(ag_pass="triton"))
    row: dict[str, Any] = {"shape": f"{B}x{T}", "HV": HV, "ms": {}, "agree": {}}
    ref = wy_kda_ag(q, k, g, beta, scale=scale, index=ix, launch=plan)
    row["ms"]["triton"] = do_bench(lambda: wy_kda_ag(q, k, g, beta, scale=scale, index=ix, launch=plan))
    # with T stored too (what the forward runs under keep "ag": the backward then runs no `wy_inverse`)
    row["ms"]["triton store_t"] = do_bench(lambda: wy_kda_ag(q, k, g, beta, scale=scale, index=ix, launch=plan,
                                                             store_t=True))  # fmt: skip
    # (session 31) with the forward's bound sums too, as a split forward runs it (`bound` below): reads v
    v = torch.randn(B, T, HV, K, device=dev).to(bf)
    bnd_ref, bnd = (torch.empty(ix.num_chunks, HV, 2, device=dev) for _ in range(2))
    if "bound" in builds:
        row["ms"]["triton bnd"] = do_bench(lambda: wy_kda_ag(q, k, g, beta, scale=scale, index=ix, launch=plan, v=v,
                                                             bnd=bnd_ref))  # fmt: skip
    # the Triton pass writes Aqk on and below the diagonal only (the rest of its `torch.empty` is whatever memory held:
    # NaN at 1x128K in session 30's call 1), so both are compared there
    low = (torch.arange(64, device=dev)[None, :] <= (torch.arange(T, device=dev) % 64)[:, None])[None, :, None, :]
    ref = (ref[0], ref[1].masked_fill(~low, 0))
    for b in builds:
        lab = _kda_lab(b)
        kw: dict[str, Any] = {"bnd": bnd, "v": v} if b == "bound" else {}
        got = kda_ag_hopper(q, k, g, beta, scale=scale, index=ix, lab=lab, **kw)
        got = (got[0], got[1].masked_fill(~low, 0))
        row["ms"][b] = do_bench(lambda lab=lab, kw=kw: kda_ag_hopper(q, k, g, beta, scale=scale, index=ix, lab=lab, **kw))
        if not lab:
            row["agree"][b] = {n: float((a.double() - r.double()).norm() / r.double().norm())
                               for n, a, r in (("ag", got[0], ref[0]), ("aqk", got[1], ref[1]))}  # fmt: skip
        if b == "bound":  # the sums against the Triton pass's (largest |a - b| / (1 + |b|) where finite)
            fin = torch.isfinite(bnd_ref) & torch.isfinite(bnd)
            row["agree"][b]["bnd"] = float(((bnd - bnd_ref).abs() / (1 + bnd_ref.abs()))[fin].max())
            row["agree"][b]["bnd_inf_same"] = bool(torch.equal(torch.isinf(bnd), torch.isinf(bnd_ref)))
    return row


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shapes", default="1x65536,8x8192,1x131072")
    ap.add_argument("--hv", type=int, default=16)
    ap.add_argument("--builds", default="free,b4,q,b4+q",
                    help="the TileLang builds to time (free, bN, q, lab switches, joined by +)")  # fmt: skip
    ap.add_argument("--modes", default=",".join(MODES), help=f"the pass's modes to time ({', '.join(MODES)})")
    ap.add_argument("--kda-builds", default="", help="KDA's TileLang Ag builds to time (free, lab switches, joined by +)")
    ap.add_argument("--jobs", type=int, default=8, help="TileLang builds compiled side by side first")
    ap.add_argument("--out", type=Path, default=Path("/tmp/ag_pass_lab"))
    a = ap.parse_args(argv)
    builds = tuple(a.builds.split(",")) if a.builds else ()
    modes = tuple(a.modes.split(","))
    kda_builds = tuple(a.kda_builds.split(",")) if a.kda_builds else ()
    try:
        for b in builds:
            _build_knobs(b)
        for b in kda_builds:
            _kda_lab(b)
        if set(modes) - set(MODES):
            raise ValueError(f"--modes: unknown {sorted(set(modes) - set(MODES))} (known: {', '.join(MODES)})")
    except ValueError as err:
        ap.error(str(err))
    t0 = time.perf_counter()
    compile_s = compile_all([a.hv], builds, modes, kda_builds, a.jobs)
    print(f"compiled {len(compile_s)} builds in {time.perf_counter() - t0:.0f} s", flush=True)
    from kernels.autotune import load_autotune

    # (on another card the file is ignored with a warning and the kernels take their defaults: session 34's H100 call
    # failed here while strict)
    table = load_autotune(ROOT / "benchmarks/results/autotune_h200.json", strict=False)
    rows = []
    for shape in a.shapes.split(","):
        B, T = (int(x) for x in shape.split("x"))
        rows.append(run_shape(B, T, a.hv, table, builds, modes))
        print(json.dumps(rows[-1]), flush=True)
    kda_rows = []
    for shape in a.shapes.split(",") if kda_builds else ():
        B, T = (int(x) for x in shape.split("x"))
        kda_rows.append(run_kda_shape(B, T, a.hv, kda_builds))
        print(json.dumps(kda_rows[-1]), flush=True)
    out = {"device": torch.cuda.get_device_name(), "torch": torch.__version__, "argv": sys.argv[1:],
           "compile_s": compile_s, "rows": rows, "kda_rows": kda_rows}  # fmt: skip
    a.out.mkdir(parents=True, exist_ok=True)
    (a.out / "ag_pass_lab.json").write_text(json.dumps(out, indent=1))
    names = [f"tilelang {b}" for b in builds]
    lines = ["| shape | HV | mode | floor ms | Triton ms | " + " | ".join(f"{n} ms | {n}/Triton | {n} Ag rel L2" for n in names)
             + " | kkt_solve ms |", "|---|---:|---|---:|---:|" + "---:|---:|---:|" * len(names) + "---:|"]  # fmt: skip
    for r in rows:
        for mode in modes:
            tr = r["ms"][f"triton {mode}"]
            cells = " | ".join(f"{r['ms'][f'{n} {mode}']:.3f} | {r['ms'][f'{n} {mode}'] / tr:.2f} | "
                               f"{r['agree'][f'{n} {mode}']['ag_rel_l2']:.1e}" for n in names)  # fmt: skip
            kk = r["ms"].get("flashqla kkt_solve", float("nan")) if mode == "ag" else float("nan")
            lines.append(f"| {r['shape']} | {r['HV']} | {mode} | {r['floor_ms'][mode]:.3f} | {tr:.3f} | {cells} | {kk:.3f} |")
    if kda_rows:
        lines += ["", "KDA's Ag pass, gated form (ms; each build against free: what the part it leaves out costs):", "",
                  "| shape | HV | Triton gated | with T | " + " | ".join(f"{b} | {b} - free" for b in kda_builds) + " |",
                  "|---|---:|---:|---:|" + "---:|---:|" * len(kda_builds)]  # fmt: skip
        for r in kda_rows:
            free = r["ms"].get("free", float("nan"))
            cells = " | ".join(f"{r['ms'][b]:.3f} | {r['ms'][b] - free:+.3f}" for b in kda_builds)
            lines.append(f"| {r['shape']} | {r['HV']} | {r['ms']['triton']:.3f} | {r['ms']['triton store_t']:.3f} | {cells} |")
        lines += [f"- {r['shape']}: with the bound sums, TileLang {r['ms']['bound']:.3f} ms vs Triton {r['ms']['triton bnd']:.3f}"
                  f" (sums within {r['agree']['bound']['bnd']:.1e}, infinities alike: {r['agree']['bound']['bnd_inf_same']})"
                  for r in kda_rows if "bound" in r["ms"]]  # fmt: skip
    (a.out / "ag_pass_lab.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
