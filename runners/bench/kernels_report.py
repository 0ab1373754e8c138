"""The Markdown table of a kernel benchmark result (`runners.bench.kernels`): ours vs FLA vs the floor, per
launcher, CUDA graphs, correctness and the explored variants."""

from __future__ import annotations

from typing import Any


def _fmt(x: Any, nd: int = 3) -> str:
    if x is None or (isinstance(x, float) and x != x):
        return "—"
    if isinstance(x, float):
        return f"{x:.{nd}f}"
    return str(x)


def _sci(x: Any) -> str:
    return f"{x:.2e}" if isinstance(x, float) and x == x else _fmt(x)


def to_markdown(res: dict[str, Any]) -> str:
    env = res["env"]
    lines = [
        f"# Kernel benchmark: ours (Triton) vs FLA forward — {env.get('device')}",
        "",
        f"- device: {env.get('device')} ({env.get('sms')} SMs), driver {env.get('driver')}, CUDA {env.get('cuda')}",
        f"- torch {env.get('torch')}, triton {env.get('triton')}, fla-core {env.get('fla')}, python {env.get('python')}",
        f"- git sha: {env.get('git_sha')}{' (' + env['git_note'] + ')' if env.get('git_note') else ''}; date {env.get('date')}",
        f"- command: `{env.get('command')}`",
        f"- ceilings (measured in this run): copy {_fmt(res['ceilings']['copy_GBps'], 0)} GB/s, "
        f"bf16 matmul {_fmt(res['ceilings']['matmul_TFLOPs'], 0)} TFLOP/s",
        f"- H={res['H']}, K=V={res['K']}, bf16, forward only; do_bench medians (ms); ratio = ours / FLA (same run)",
        f"- gates: {'lb * sigmoid(randn), lb = ' + str(res['lb']) if res.get('lb') is not None else 'logsigmoid(randn)'}",
        "",
        "| op | B | T | ours ms | FLA ms | ratio | floor ms (bytes / flops) | ours / floor | rel_l2 vs FLA |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for r in res["rows"]:
        lines.append(
            f"| {r['op']} | {r['B']} | {r['T']} | {_fmt(r.get('ms'))} | {_fmt(r.get('fla_ms'))} | {_fmt(r.get('ratio'), 2)} | "
            f"{_fmt(r['floor_ms'])} ({_fmt(r['floor_bytes_ms'])} / {_fmt(r['floor_flops_ms'])}) | {_fmt(r.get('x_floor'), 1)} | "
            f"{_sci(r.get('rel_l2_vs_fla'))} |")
    prof = [r for r in res["rows"] if isinstance(r.get("profile"), dict) and "wy_ms" in r["profile"]]
    if prof:
        lines += ["", "Per launcher (each timed alone, ms; GB/s from the unique bytes it must move):", "",
                  "| op | B | T | wy (GB/s) | transition | chain | state+output split (GB/s) | state+output plain (GB/s) | segments x chunks |",
                  "|---|---|---|---|---|---|---|---|---|"]
        for r in prof:
            p = r["profile"]
            lines.append(f"| {r['op']} | {r['B']} | {r['T']} | {_fmt(p.get('wy_ms'))} ({_fmt(p.get('wy_GBps'), 0)}) | "
                         f"{_fmt(p.get('transition_ms'))} | {_fmt(p.get('chain_ms'))} | {_fmt(p.get('state_split_ms'))} "
                         f"({_fmt(p.get('state_split_GBps'), 0)}) | {_fmt(p.get('state_plain_ms'))} ({_fmt(p.get('state_plain_GBps'), 0)}) | "
                         f"{p.get('segments', '—')} x {p.get('seg_chunks', '—')} |")
    warm = [r for r in prof if "warm_transitions_ms" in r["profile"]]
    if warm:
        lines += ["", "Gate-certified warmup of the split (`kernels.common.warm_split`), each stage timed alone, ms; the "
                  "exact transition pass above is what it replaces:", "",
                  "| op | B | T | window chunks | wy with chunk bound (wy above: without) | windows' pass | certification "
                  "| masked transition | all (warm_transitions) | exact transition | chain (drop) | certified pairs |",
                  "|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for r in warm:
            p = r["profile"]
            lines.append(f"| {r['op']} | {r['B']} | {r['T']} | {p['warm']} | {_fmt(p.get('wy_bound_ms'))} | "
                         f"{_fmt(p.get('warm_window_ms'))} | "
                         f"{_fmt(p.get('warm_certify_ms'))} | {_fmt(p.get('warm_masked_transition_ms'))} | "
                         f"{_fmt(p.get('warm_transitions_ms'))} | {_fmt(p.get('transition_ms'))} | {_fmt(p.get('warm_chain_ms'))} | "
                         f"{p.get('warm_certified')} |")
    graph = [r for r in res["rows"] if "graph_ms" in r]
    if graph:
        lines += ["", "CUDA-graph replay (launch overhead removed), B=1 T=8192:", ""]
        for r in graph:
            lines.append(f"- {r['op']}: ours {_fmt(r.get('graph_ms'))} ms, FLA {_fmt(r.get('fla_graph_ms'))} ms")
    if res.get("correctness"):
        lines += ["", "## Correctness vs the fp32 per-token reference (reduced shapes)", "",
                  "| op | case | B×T, H, K=V | dtype | o rel_l2 | final state rel_l2 | transition rel_l2 | bf16 rounding of the reference's o |",
                  "|---|---|---|---|---|---|---|---|"]
        for c in res["correctness"]:
            if "error" in c:
                lines.append(f"| {c['op']} | {c['case']} | | | ERROR: {c['error']} | | | |")
                continue
            lines.append(f"| {c['op']} | {c['case']} | {c['B']}×{c['T']}, {c['H']}, {c['K']} | {c['dtype']} | "
                         f"{_sci(c['o_rel_l2'])} | {_sci(c['ht_rel_l2'])} | {_sci(c['transition_rel_l2'])} | "
                         f"{_sci(c['ref_bf16_rounding'])} |")
    if res.get("explore"):
        lines += ["", "## Variants (explore; warm*: the split's gate-certified warmup, certified = fraction of (transition, "
                  "head) pairs that skipped M)", "", "| op | B | T | variant | ms | rel_l2 vs FLA | certified |",
                  "|---|---|---|---|---|---|---|"]
        for r in res["explore"]:
            lines.append(f"| {r['op']} | {r['B']} | {r['T']} | {r['variant']} | {_fmt(r.get('ms'))} | "
                         f"{_sci(r.get('rel_l2_vs_fla')) if 'error' not in r else 'ERROR: ' + r['error'][:80]} | "
                         f"{r.get('certified', '')} |")
    return "\n".join(lines) + "\n"
