"""The Markdown table of a kernel benchmark result (`runners.bench.kernels`): ours vs FLA vs FlashQLA (its two
columns, or the one line saying why it did not run) vs the floor, each library's first call, each launcher against
its own floor, CUDA graphs, accuracy, the explored variants and the rows the deadline cut."""

from __future__ import annotations

from typing import Any

from kernels.builds import first_call_note
from runners.bench.floors import HBM_TBPS


def _fmt(x: Any, nd: int = 3) -> str:
    if x is None or (isinstance(x, float) and x != x):
        return "—"
    if isinstance(x, float):
        return f"{x:.{nd}f}"
    return str(x)


def _sci(x: Any) -> str:
    return f"{x:.2e}" if isinstance(x, float) and x == x else _fmt(x)


def _ratio(r: dict[str, Any], key: str) -> str:
    return _fmt(r.get(key), 2)


def _gate(lb: Any) -> str:
    return "logsigmoid" if lb is None else f"{lb:g}"


def to_markdown(res: dict[str, Any]) -> str:
    env = res["env"]
    c = res["ceilings"]
    lines = [
        f"# Kernel benchmark: ours (Triton) vs FLA vs FlashQLA, forward — {env.get('device')}",
        "",
        f"- device: {env.get('device')} ({env.get('sms')} SMs), driver {env.get('driver')}, CUDA {env.get('cuda')}",
        f"- torch {env.get('torch')}, triton {env.get('triton')}, fla-core {env.get('fla')}, flash-qla "
        f"{env.get('flash_qla')}, tilelang {env.get('tilelang')}, python {env.get('python')}",
        f"- git sha: {env.get('git_sha')}{' (' + env['git_note'] + ')' if env.get('git_note') else ''}; date {env.get('date')}",
        f"- command: `{env.get('command')}`",
        f"- ceilings: bytes at {HBM_TBPS} TB/s (measured copy in this run: {_fmt(c['copy_GBps'], 0)} GB/s); "
        f"bf16 matmul {_fmt(c['matmul_TFLOPs'], 0)} TFLOP/s (8192^3 torch.matmul, measured in this run)",
        f"- H={res['H']} query/key heads, K=V={res['K']}, bf16, forward only; do_bench medians (ms), all in this "
        f"process; peers: {', '.join(res.get('peers', [])) or 'none'}",
        "- FlashQLA: `flash_qla` = `auto_cp=False`; `flash_qla CP` = its intra-card CP, what its default `auto_cp=True` "
        "runs (its cost model may decide not to split); both on the batch flattened to varlen (`cu_seqlens`)",
        "",
        "| op | B | T | HV | lb | ours ms | FLA ms | ours/FLA | FlashQLA ms | FlashQLA CP ms | ours/FlashQLA | "
        "ours/FlashQLA CP | floor ms (bytes / flops) | ours / floor | rel_l2 vs FLA |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in res["rows"]:
        lines.append(
            f"| {r['op']} | {r['B']} | {r['T']} | {r.get('HV', r['H'])} | {_gate(r.get('lb'))} | {_fmt(r.get('ms'))} | "
            f"{_fmt(r.get('fla_ms'))} | {_ratio(r, 'ratio')} | {_fmt(r.get('flash_qla_ms'))} | "
            f"{_fmt(r.get('flash_qla_cp_ms'))} | {_ratio(r, 'ratio_flash_qla')} | {_ratio(r, 'ratio_flash_qla_cp')} | "
            f"{_fmt(r['floor_ms'])} ({_fmt(r['floor_bytes_ms'])} / {_fmt(r['floor_flops_ms'])}) | {_fmt(r.get('x_floor'), 1)} | "
            f"{_sci(r.get('rel_l2_vs_fla'))} |")
    lines += _peer_notes(res)
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
    lines += _launcher_table(res) + _kernel_times(res) + _accuracy(res)
    if res.get("cut"):
        lines += ["", f"## Not run: {len(res['cut'])} row(s) cut by --deadline", ""]
        lines += [f"- {x['op']} {x['case']}: {x['why']}" for x in res["cut"]]
    return "\n".join(lines) + "\n"


def _peer_notes(res: dict[str, Any]) -> list[str]:
    """Why a peer did not run (one line per reason), FlashQLA's split, its errors, and each library's first call."""
    out: list[str] = []
    reasons = dict.fromkeys(f"FlashQLA not run ({r['op']}): {r['flash_qla_reason']}" for r in res["rows"]
                            if r.get("flash_qla_reason"))
    reasons.update(dict.fromkeys(f"FLA not run ({r['op']}): {r['fla_error']}" for r in res["rows"] if r.get("fla_error")))
    for col in ("flash_qla", "flash_qla_cp"):
        reasons.update(dict.fromkeys(f"{col} failed ({r['op']} {r['B']}x{r['T']}): {r[col + '_error']}"
                                     for r in res["rows"] if r.get(col + "_error")))
    out += [""] + [f"- {x}" for x in reasons] if reasons else []
    splits = [r for r in res["rows"] if r.get("flash_qla_cp_split")]
    if splits:
        out += ["", "FlashQLA's intra-card CP, the split it chose (its `build_cp_context` decision):", ""]
        out += [f"- {r['op']} {r['B']}x{r['T']} HV={r.get('HV')} lb={_gate(r.get('lb'))}: {r['flash_qla_cp_split']}"
                for r in splits]
    out += first_calls(res)
    return out


def first_calls(res: dict[str, Any]) -> list[str]:
    """Each library's first call in this run (its compile / autotune on the cache it found), the longest of its rows
    and of the accuracy check: on a fresh cache that is its cold first call."""
    seen: dict[str, float] = {}
    keys = {"ours": "first_call_s", "FLA": "fla_first_call_s", "FlashQLA": "flash_qla_first_call_s",
            "FlashQLA CP": "flash_qla_cp_first_call_s"}
    for r in res["rows"]:
        for who, key in keys.items():
            if isinstance(r.get(key), (int, float)):
                seen[who] = max(seen.get(who, 0.0), float(r[key]))
    names = {"ours": "ours", "fla": "FLA", "flash_qla": "FlashQLA", "flash_qla_cp": "FlashQLA CP"}
    for a in res.get("accuracy", []):
        if isinstance(a.get("first_call_s"), (int, float)):
            who = names.get(a["who"], a["who"])
            seen[who] = max(seen.get(who, 0.0), float(a["first_call_s"]))
    if not seen:
        return []
    mode = res.get("env", {}).get("tilelang_build")
    held = f"; {first_call_note(mode)}" if mode else ""
    return ["", f"First call of each library in this run (s; compile / autotune on the cache it found{held}): "
            + ", ".join(f"{who} {s:.1f}" for who, s in seen.items())]


def _launcher_table(res: dict[str, Any]) -> list[str]:
    """--profile: each launcher against its own floor (`runners.bench.floors`)."""
    rows = [r for r in res["rows"] if r.get("launchers")]
    if not rows:
        return []
    out = ["", f"## Per launcher against its floor (bytes at {HBM_TBPS} TB/s, flops at the measured "
           f"{_fmt(res['ceilings']['matmul_TFLOPs'], 0)} TFLOP/s; `runners.bench.floors`)", "",
           "| op | B | T | HV | launcher | ms | MB | GFLOP | bytes floor ms | flops floor ms | ms / floor |",
           "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        for x in r["launchers"]:
            out.append(f"| {r['op']} | {r['B']} | {r['T']} | {r.get('HV', r['H'])} | {x['launcher']} | {_fmt(x['ms'])} | "
                       f"{x['bytes'] / 1e6:.1f} | {x['flops'] / 1e9:.1f} | {_fmt(x['bytes_ms'])} | {_fmt(x['flops_ms'])} | "
                       f"{_fmt(x.get('x_floor'), 1)} |")
    return out


def _kernel_times(res: dict[str, Any]) -> list[str]:
    """--profile (session 31): ours' headline forward by kernel (CUDA ms in one call, torch profiler)."""
    rows = [r for r in res["rows"] if r.get("ours_kernels_ms")]
    if not rows:
        return []
    out = ["", "## Per-kernel times of our forward (one call, ms, torch profiler)", ""]
    for r in rows:
        ks = r["ours_kernels_ms"]
        body = ks["error"] if "error" in ks else ", ".join(f"{name} {ms:.3f}" for name, ms in ks.items())
        out.append(f"- {r['op']} B={r['B']} T={r['T']} HV={r.get('HV', r['H'])} (forward {_fmt(r.get('ms'))}): {body}")
    return out


def _accuracy(res: dict[str, Any]) -> list[str]:
    """o of ours and each peer vs the fp32 per-token reference, one reduced shape."""
    if not res.get("accuracy"):
        return []
    out = ["", "## Accuracy of each library vs the fp32 per-token reference (B=1, lb=-1, bf16 inputs)", "",
           "| op | who | T | o rel_l2 |", "|---|---|---|---|"]
    for a in res["accuracy"]:
        val = _sci(a.get("o_rel_l2")) if "error" not in a else f"not run: {a['error']}"
        out.append(f"| {a['op']} | {a['who']} | {a['T']} | {val} |")
    return out
