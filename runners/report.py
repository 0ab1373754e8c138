"""Reports of a regression run: Markdown for people, JUnit XML for CI, a rich table for the terminal.

Input is the list of `runners.regress.KeyVerdict` (one per benchmark key) and a `ReportMeta` saying what was
compared with what. JUnit has one testcase per key: SLOW and CHANGED are failures, INCONCLUSIVE is skipped
(reported, never failing), SAME and FAST pass. Pure formatting; `write_reports` is the only function that writes.
"""

from __future__ import annotations

import math
import xml.etree.ElementTree as ET
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING

from runners.regress import KeyVerdict, geomean_ratio

if TYPE_CHECKING:
    from rich.table import Table

__all__ = ["JUNIT_NAME", "MARKDOWN_NAME", "ReportMeta", "console_table", "junit_xml", "markdown_report", "summary_counts", "write_reports"]

MARKDOWN_NAME = "regress.md"
JUNIT_NAME = "regress-junit.xml"
_ORDER = {"CHANGED": 0, "SLOW": 1, "INCONCLUSIVE": 2, "FAST": 3, "SAME": 4}


@dataclass(frozen=True)
class ReportMeta:
    """What a regression run compared: the suite, its run id, the baseline and the sweeps on each side."""

    suite: str
    run_id: str
    baseline_ref: str
    baseline_sweeps: Sequence[int] = ()
    new_sweeps: Sequence[int] = ()
    device: str | None = None
    created_at: datetime = field(default_factory=lambda: datetime.now(timezone.utc))
    no_baseline: Sequence[str] = ()  # keys measured now that the baseline lacks
    notes: Sequence[str] = ()


def _sorted(verdicts: Sequence[KeyVerdict]) -> list[KeyVerdict]:
    return sorted(verdicts, key=lambda v: (_ORDER.get(v.status, 9), v.key))


def _pct(x: float | None) -> str:
    return "" if x is None else f"{math.expm1(x):+.1%}"


def _num(x: float | None, fmt: str = ".3g") -> str:
    return "" if x is None else format(x, fmt)


def _ci(v: KeyVerdict) -> str:
    return "" if v.ci_log is None else f"[{_pct(v.ci_log[0])}, {_pct(v.ci_log[1])}]"


def _md_cell(s: object) -> str:
    return str(s).replace("|", "\\|").replace("\n", " ")


def summary_counts(verdicts: Sequence[KeyVerdict]) -> Counter[str]:
    """Keys per status (CHANGED outranks the timing verdict)."""
    return Counter(v.status for v in verdicts)


def markdown_report(verdicts: Sequence[KeyVerdict], meta: ReportMeta) -> str:
    """The whole report as GitHub-flavoured Markdown: headline, deterministic changes, the timing table, method."""
    counts = summary_counts(verdicts)
    failed = [v for v in verdicts if v.failed]
    lines = [f"# cpbench regression: {meta.suite}", ""]
    lines.append(f"- run `{meta.run_id}` at {meta.created_at.isoformat(timespec='seconds')}"
                 + (f" on {meta.device}" if meta.device else ""))
    lines.append(f"- baseline `{meta.baseline_ref}`" + (f" (sweeps {', '.join(map(str, meta.baseline_sweeps))})"
                                                         if meta.baseline_sweeps else ""))
    if meta.new_sweeps:
        lines.append(f"- new sweeps {', '.join(map(str, meta.new_sweeps))}")
    lines.append("")
    tally = ", ".join(f"{counts.get(s, 0)} {s}" for s in ("CHANGED", "SLOW", "FAST", "SAME", "INCONCLUSIVE"))
    lines.append(f"**Result: {'FAIL' if failed else 'PASS'}**: {len(verdicts)} keys; {tally}.")
    head = geomean_ratio(verdicts)
    if head is not None:
        g, (lo, hi) = head
        lines.append("")
        lines.append(f"Geometric mean of new/baseline over keys: **{g:.3f}** (95% bootstrap CI over keys {lo:.3f} to {hi:.3f}).")
    for note in meta.notes:
        lines += ["", f"> {note}"]
    changed = [v for v in _sorted(verdicts) if v.changes]
    if changed:
        lines += ["", "## Deterministic signals that changed", "", "| key | signal | baseline | new |", "|---|---|---|---|"]
        for v in changed:
            for c in v.changes:
                lines.append(f"| {_md_cell(v.key)} | {_md_cell(c.field)} | {_md_cell(c.base)} | {_md_cell(c.new)} |")
    lines += ["", "## Timing", "",
              "| status | key | baseline ms | new ms | change (HL) | 90% CI | threshold | q (BH) | p Welch | p MW | runs b/n | reason |",
              "|---|---|---:|---:|---:|---|---:|---:|---:|---:|---|---|"]
    for v in _sorted(verdicts):
        lines.append("| " + " | ".join(_md_cell(x) for x in (
            f"**{v.status}**" if v.failed else v.status, v.key, _num(v.base_median_ms, ".4g"), _num(v.new_median_ms, ".4g"),
            _pct(v.effect_log), _ci(v), "" if v.threshold is None else f"±{v.threshold:.1%}", _num(v.q_value, ".2g"),
            _num(v.p_welch, ".2g"), _num(v.p_mannwhitney, ".2g"), f"{v.n_base}/{v.n_new}", v.reason)) + " |")
    if meta.no_baseline:
        lines += ["", "## Keys without a baseline (not judged)", ""] + [f"- {_md_cell(k)}" for k in sorted(meta.no_baseline)]
    lines += ["", "## Method", "",
              "Each run of the suite gives one median per key; verdicts work on the log of these run medians. "
              "Effect: Hodges–Lehmann shift with its Moses 90% interval. Threshold δ = max(1%, 3σ̂) from the baseline's "
              "spread (capped at 10%). SLOW/FAST: Benjamini–Hochberg q below 0.05 on Welch's t, Mann–Whitney agreeing "
              "(p < 0.05) and the shift beyond δ. SAME: the interval inside ±δ. INCONCLUSIVE keys were rerun with fresh "
              "runs (k doubled) and are reported without failing. Collective counts, host syncs and chosen configs are "
              "compared exactly; any difference is CHANGED and fails the run.", ""]
    return "\n".join(lines)


def junit_xml(verdicts: Sequence[KeyVerdict], meta: ReportMeta) -> str:
    """JUnit XML: one testsuite, one testcase per key; SLOW and CHANGED fail, INCONCLUSIVE is skipped."""
    suite_name = f"cpbench.regress.{meta.suite}"
    failures = sum(1 for v in verdicts if v.failed)
    skipped = sum(1 for v in verdicts if not v.failed and v.verdict == "INCONCLUSIVE")
    root = ET.Element("testsuites", name="cpbench regress", tests=str(len(verdicts)), failures=str(failures),
                      errors="0", skipped=str(skipped))
    ts = ET.SubElement(root, "testsuite", name=suite_name, tests=str(len(verdicts)), failures=str(failures),
                       errors="0", skipped=str(skipped), timestamp=meta.created_at.isoformat(timespec="seconds"))
    props = ET.SubElement(ts, "properties")
    for name, value in (("run_id", meta.run_id), ("baseline_ref", meta.baseline_ref),
                        ("baseline_sweeps", ",".join(map(str, meta.baseline_sweeps))),
                        ("new_sweeps", ",".join(map(str, meta.new_sweeps))), ("device", meta.device or "")):
        ET.SubElement(props, "property", name=name, value=value)
    for v in _sorted(verdicts):
        tc = ET.SubElement(ts, "testcase", classname=suite_name, name=v.key, time="0")
        body = (f"timing {v.verdict}: {v.reason}; change {_pct(v.effect_log) or 'n/a'}, CI {_ci(v) or 'n/a'}, "
                f"threshold {'' if v.threshold is None else f'{v.threshold:.1%}'}, q {_num(v.q_value, '.2g') or 'n/a'}, "
                f"runs {v.n_base}/{v.n_new}")
        if v.failed:
            kinds = [k for k, on in (("SLOW", v.verdict == "SLOW"), ("CHANGED", bool(v.changes))) if on]
            msg = "; ".join([f"SLOW {_pct(v.effect_log)}"] * (v.verdict == "SLOW")
                            + [f"{c.field}: {c.base!r} -> {c.new!r}" for c in v.changes])
            fail = ET.SubElement(tc, "failure", message=msg, type="+".join(kinds))
            fail.text = body
        elif v.verdict == "INCONCLUSIVE":
            ET.SubElement(tc, "skipped", message=f"INCONCLUSIVE: {v.reason}")
        ET.SubElement(tc, "system-out").text = body
    ET.indent(root)
    return ET.tostring(root, encoding="unicode", xml_declaration=True) + "\n"


def write_reports(verdicts: Sequence[KeyVerdict], meta: ReportMeta, out_dir: str | Path) -> tuple[Path, Path]:
    """Write regress.md and regress-junit.xml into out_dir (created); returns both paths."""
    d = Path(out_dir)
    d.mkdir(parents=True, exist_ok=True)
    md, xml = d / MARKDOWN_NAME, d / JUNIT_NAME
    md.write_text(markdown_report(verdicts, meta), encoding="utf-8")
    xml.write_text(junit_xml(verdicts, meta), encoding="utf-8")
    return md, xml


def console_table(verdicts: Sequence[KeyVerdict], *, title: str | None = None) -> Table:
    """A rich table of the verdicts for the terminal, failures first."""
    from rich.markup import escape
    from rich.table import Table

    style = {"CHANGED": "bold red", "SLOW": "bold red", "FAST": "green", "SAME": "dim", "INCONCLUSIVE": "yellow"}
    t = Table(title=title)
    for col, just in (("status", "left"), ("key", "left"), ("base ms", "right"), ("new ms", "right"),
                      ("change", "right"), ("90% CI", "left"), ("q", "right"), ("reason", "left")):
        t.add_column(col, justify=just)  # type: ignore[arg-type]
    for v in _sorted(verdicts):
        t.add_row(f"[{style.get(v.status, '')}]{v.status}[/]", escape(v.key), _num(v.base_median_ms, ".4g"),
                  _num(v.new_median_ms, ".4g"), _pct(v.effect_log), _ci(v), _num(v.q_value, ".2g"),
                  escape("; ".join([f"{c.field}: {c.base} -> {c.new}" for c in v.changes] + [v.reason])))
    return t
