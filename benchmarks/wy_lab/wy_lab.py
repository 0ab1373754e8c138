"""WY prep on the GPU: the earlier kernel (fp32 scratch round trip, 64-row tiles) vs the current one (16-row
blocks in registers) over launch configs, and FLA's intra-chunk pieces; B=1 T=64K H=16 K=V=128 bf16.

The earlier kernel is taken from git history (the device copy has no .git), under an ignored folder:

    mkdir -p lab && git show 54170ca:kernels/common/wy.py | sed -e 's/^WY_\(GDN\|KDA\)_FWD = register(/WY_\1_FWD_OLD = (/' \
        -e 's/pick_config(WY_\(GDN\|KDA\)_FWD,/pick_config(WY_\1_FWD_OLD,/' > lab/wy_old.py
    # device tool, carry [".whl", "lab"]:
    python3 benchmarks/wy_lab/wy_lab.py

Prints one row per variant: do_bench median ms and the largest relative error of the outputs vs the earlier
kernel's. Results: benchmarks/results/wy_lab_h200.md.
"""
import itertools
import multiprocessing as mp
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "lab"))

GDN_CFGS = [{"BK": bk, "BV": bv, "num_warps": nw, "num_stages": ns} for bk, bv, nw, ns in
            itertools.product((32, 64), (64,), (1, 2, 4), (1, 2))] + [{"BK": 64, "BV": 128, "num_warps": 4, "num_stages": 2},
                                                                     {"BK": 128, "BV": 128, "num_warps": 4, "num_stages": 2}]
KDA_CFGS = [{"BK": bk, "BV": bv, "num_warps": nw, "num_stages": ns} for bk, bv, nw, ns in
            itertools.product((16, 32), (64,), (1, 2, 4), (1, 2))] + [{"BK": 64, "BV": 64, "num_warps": 4, "num_stages": 1}]


def run(op, T, cfg, which):

    import wy_old

    from kernels.bench import make_inputs
    from kernels.common import wy
    from kernels.common.index import prepare_chunk_index
    from kernels.configs import LaunchConfig
    q, k, v, g, beta = make_inputs(op, 1, T, 16, device="cuda")
    index = prepare_chunk_index(None, batch=1, seq_len=T, chunk_size=64, device="cuda")
    mod = wy if which == "new" else wy_old
    fn = getattr(mod, f"wy_{op}_fwd")
    c = LaunchConfig(**cfg) if cfg else None
    return lambda: fn(q, k, v, g, beta, scale=128 ** -0.5, index=index, config=c), (q, k, v, g, beta)


def warm(job):
    op, cfg, which = job
    try:
        f, _ = run(op, 4096, cfg, which)
        f()
        import torch
        torch.cuda.synchronize()
        return None
    except Exception as e:  # noqa: BLE001
        return f"{op} {which} {cfg}: {type(e).__name__}: {str(e)[:200]}"


def main():
    import torch
    import triton.testing
    T = 65536
    jobs = [(op, cfg, "new") for op, cfgs in (("gdn", GDN_CFGS), ("kda", KDA_CFGS)) for cfg in cfgs]
    jobs += [("gdn", None, "old"), ("kda", None, "old")]
    t = time.time()
    with mp.get_context("spawn").Pool(12) as pool:
        for r in pool.map(warm, jobs, chunksize=1):
            if r:
                print("WARM FAIL", r)
    print(f"precompiled {len(jobs)} in {time.time() - t:.0f}s", flush=True)
    rows = []
    for op in ("gdn", "kda"):
        f_old, _ = run(op, T, None, "old")
        ref = [x.float() if x is not None else None for x in f_old()]
        ms_old = triton.testing.do_bench(f_old, warmup=50, rep=300, return_mode="median")
        rows.append((op, "old default", ms_old, 0.0))
        print(rows[-1], flush=True)
        for cfg in (GDN_CFGS if op == "gdn" else KDA_CFGS):
            try:
                f, _ = run(op, T, cfg, "new")
                outs = f()
                n = len(outs)
                errs = []
                for a, b in zip(outs, ref[:n], strict=True):
                    if a is None:
                        continue
                    a = a.float()
                    if b.shape != a.shape:
                        continue
                    if a.shape[-1] == 64 and a.dim() == 4:  # aqk: compare the lower triangle only
                        tri = torch.tril(torch.ones(64, 64, device=a.device, dtype=torch.bool))
                        rr = torch.arange(a.shape[1], device=a.device) % 64
                        m = tri[rr][None, :, None, :]
                        a, b = a * m, b * m
                    errs.append(((a - b).norm() / b.norm().clamp_min(1e-30)).item())
                ms = triton.testing.do_bench(f, warmup=50, rep=300, return_mode="median")
                rows.append((op, str(cfg), ms, max(errs)))
            except Exception as e:  # noqa: BLE001
                rows.append((op, str(cfg), float("nan"), float("nan")))
                print("FAIL", op, cfg, type(e).__name__, str(e)[:300])
            print(rows[-1], flush=True)
    # FLA's pieces
    try:
        from fla.ops.gated_delta_rule.chunk_fwd import chunk_gated_delta_rule_fwd_intra
        from fla.ops.kda.chunk_intra import chunk_kda_fwd_intra
        from fla.ops.utils import chunk_local_cumsum
        from fla.ops.utils.constant import RCP_LN2

        from kernels.bench import make_inputs
        for op in ("gdn", "kda"):
            q, k, v, g, beta = make_inputs(op, 1, T, 16, device="cuda")
            if op == "gdn":
                def f(k=k, v=v, g=g, beta=beta):
                    gc = chunk_local_cumsum(g, chunk_size=64, scale=RCP_LN2)
                    return chunk_gated_delta_rule_fwd_intra(k=k, v=v, g=gc, beta=beta)
            else:
                def f(q=q, k=k, v=v, g=g, beta=beta):
                    gc = chunk_local_cumsum(g, chunk_size=64, scale=RCP_LN2)
                    return chunk_kda_fwd_intra(q=q, k=k, v=v, gk=gc, beta=beta, scale=128 ** -0.5)
            f()
            ms = triton.testing.do_bench(f, warmup=50, rep=300, return_mode="median")
            rows.append((op, "FLA cumsum+intra", ms, float("nan")))
            print(rows[-1], flush=True)
    except Exception as e:  # noqa: BLE001
        print("FLA FAIL", type(e).__name__, str(e)[:300])
    print("\n| op | variant | ms | max rel err vs old |\n|---|---|---|---|")
    for r in rows:
        print(f"| {r[0]} | {r[1]} | {r[2]:.3f} | {r[3]:.2e} |")


if __name__ == "__main__":
    main()
