"""Re-stamp a shipped autotune file after an edit that left every tuned kernel's device code as it was tuned.

A tuned entry is keyed by `kernels.autotune.source_hash(kernel)`: the whole source of the kernel's module and of the
modules of its Triton helpers. Any edit there (a docstring, a launcher's host code) makes the file stale, and the
loader refuses it. This tool decides, per stale kernel, whether the edit can have changed what was tuned: it compares,
against the git sha the file was tuned at, each of those modules' device-side parts by AST (every `@triton.jit`
function with its decorators, `triton.heuristics` and `kernels.common.chunk_program.heuristics` read as one; every
upper-case module constant, which holds the kernel specs and their search spaces). Identical: the entry gets the
current hash. Not identical: the entry stays stale and is listed (re-tune it).

    python benchmarks/autotune_restamp.py --json benchmarks/results/autotune_h200.json --base c065706 [--dry-run]
        [--overlay NEWER.json] [--accept KERNEL="why its tuned launches compile as before"]

Prints one line per kernel (fresh / re-stamped / changed, with the differing names) and rewrites the file in place
unless --dry-run. `--overlay` (session 19) then lays a newer export over the file: an `autotune_h200.py import` of a
later run of some kernels, made at this build (its hashes must be the current ones). Its entries replace the file's
with the same kernel and key; the file's other entries of those kernels stay where they are fresh and are dropped
where they are stale (a changed kernel). A later run of the step's kernels then ships without re-tuning the rest
(`autotune_h200.py import` merges runs only where their shared kernels have one source hash). Sessions 16 and 17 did this by hand before the tool existed (`results/autotune_h200.md`).

Session 20: only what the kernel's module can reach counts (`reachable`: its own `@triton.jit` functions and
constants, and the helpers they call, transitively), not every helper of a shared module (`kernels.common.wy`'s block
solve changed; the fused forward pass, which imports other helpers from it, did not). A changed kernel whose every
entry is its spec's default config is dropped from the file instead of left stale: launches run the same without it.

Session 31: `--accept KERNEL=REASON` re-stamps a changed kernel by decision, for an edit the AST cannot judge but its
author can: a new constexpr flag that equals an old one at every launch the file was tuned on (`chunk_state_bwd`'s
STORE_DV, set wherever STORE_DH was until KDA's "tilelang" gradients). The reason is printed and written into the
file's block (`accepted`), so the file says which entries stand on a decision rather than on the comparison.
"""

from __future__ import annotations

import argparse
import ast
import inspect
import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def _is_jit(dec: ast.expr) -> bool:
    """The decorator is `triton.jit` / `jit` (called or not)."""
    node = dec.func if isinstance(dec, ast.Call) else dec
    return (isinstance(node, ast.Attribute) and node.attr == "jit") or (isinstance(node, ast.Name) and node.id == "jit")


def device_parts(source: str) -> dict[str, str]:
    """name -> normalised AST dump of the module's `@triton.jit` functions (decorators included) and upper-case
    constants (specs, spaces, block sizes): what a tuned config depends on in that module."""
    parts: dict[str, str] = {}
    for node in ast.parse(source).body:
        if isinstance(node, ast.FunctionDef) and any(_is_jit(d) for d in node.decorator_list):
            decs = [ast.unparse(d).replace("triton.heuristics(", "heuristics(") for d in node.decorator_list]
            sig = [node.args, *node.body, *([node.returns] if node.returns else [])]
            parts[f"def {node.name}"] = "\n".join([*decs, *(ast.dump(n, include_attributes=False) for n in sig)])
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for t in targets:
                if isinstance(t, ast.Name) and t.id.isupper() and node.value is not None:
                    parts[t.id] = ast.dump(node.value, include_attributes=False)
    return parts


def changed_parts(old: str, new: str) -> list[str]:
    """The names whose device-side part differs between two sources of one module (added and removed ones too)."""
    a, b = device_parts(old), device_parts(new)
    return sorted(n for n in a.keys() | b.keys() if a.get(n) != b.get(n))


def _jit_refs(source: str) -> dict[str, set[str]]:
    """`def name` -> the names (bare and attribute) its body and decorators mention, per `@triton.jit` function of a
    module's source (constants are leaves)."""
    refs: dict[str, set[str]] = {}
    for node in ast.parse(source).body:
        if isinstance(node, ast.FunctionDef) and any(_is_jit(d) for d in node.decorator_list):
            refs[f"def {node.name}"] = {
                x.id if isinstance(x, ast.Name) else x.attr for x in ast.walk(node) if isinstance(x, ast.Name | ast.Attribute)
            }
    return refs


def reachable(own: list[str], helpers: list[str]) -> set[str]:
    """The device-side part names (`device_parts`' "def f" and constants) a kernel module's launches can reach (session
    20): every `@triton.jit` function of its own module (`own`: its sources, old and new) and what they call or read,
    transitively through the helper modules (`helpers`), and every upper-case constant of its own module (its specs and
    spaces). A helper module's function or constant no reached function mentions cannot change what was tuned."""
    refs: dict[str, set[str]] = {}
    for src in own + helpers:
        for name, mentions in _jit_refs(src).items():
            refs.setdefault(name, set()).update(mentions)
    seen = {n for src in own for n in device_parts(src)}  # the own module's functions and constants
    todo = [n for n in seen if n.startswith("def ")]
    while todo:
        for m in refs.get(todo.pop(), ()):
            for part in (f"def {m}", m):
                if part not in seen and (part in refs or (m.isupper() and part == m)):
                    seen.add(part)
                    if part in refs:
                        todo.append(part)
    return seen


def default_entries(block: dict, default: dict) -> list[dict]:
    """The entries of a kernel's block whose config is its spec's default (`default`: the LaunchConfig's set
    fields): a launch without them runs the same config, so dropping them from a stale kernel loses nothing."""
    return [e for e in block["entries"] if e["config"] == default]


def judge(block: dict, *, now: str, diffs: list[str], base: str, reason: str | None, default: dict) -> tuple[str, str]:
    """(verdict, message) for one stale kernel's block, whose device-side parts `diffs` changed since `base`: "restamp"
    (none changed: the block takes the current hash `now`), "accept" (changed, re-stamped for `reason`, which the
    block keeps as `accepted`), "drop" (changed, every entry the spec's `default` config) or "stale" (changed: re-tune
    it). Sets the block's hash where it stands."""
    if diffs and reason is not None:
        block["source_hash"], block["accepted"] = now, f"{base}: {', '.join(diffs)} changed; {reason}"
        return "accept", f"re-stamped by decision ({block['accepted']})"
    if diffs:
        same = default_entries(block, default)
        if len(same) == len(block["entries"]):  # every entry is the default: the launches run the same without
            return "drop", (f"CHANGED against {base} ({', '.join(diffs)}); its {len(same)} entries were the default "
                            "config: dropped (a launch runs the default without them)")  # fmt: skip
        return "stale", f"CHANGED against {base} ({', '.join(diffs)}): stays stale, re-tune it"
    block["source_hash"] = now
    block.pop("accepted", None)  # the comparison stands on its own again
    return "restamp", f"re-stamped (the device code its launches reach is identical to {base})"


def base_source(sha: str, module: object) -> str:
    """The module's source at git `sha` ('' when it did not exist there)."""
    rel = Path(inspect.getsourcefile(module) or "").resolve().relative_to(ROOT)  # type: ignore[arg-type]
    out = subprocess.run(["git", "show", f"{sha}:{rel.as_posix()}"], cwd=ROOT, capture_output=True, text=True)
    return out.stdout if out.returncode == 0 else ""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", required=True, help="the autotune file (kernels.autotune's schema)")
    ap.add_argument("--base", required=True, help="the git sha its entries were tuned at")
    ap.add_argument("--dry-run", action="store_true", help="report only; do not rewrite the file")
    ap.add_argument("--overlay", default=None, help="a newer export of this build whose entries replace the file's")
    ap.add_argument(
        "--accept",
        action="append",
        default=[],
        metavar="KERNEL=REASON",
        help="re-stamp this changed kernel anyway, for the reason given (module docstring); repeatable",
    )
    a = ap.parse_args()
    accept = dict(x.split("=", 1) for x in a.accept if "=" in x)
    if len(accept) != len(a.accept) or not all(accept.values()):
        raise SystemExit("--accept takes KERNEL=REASON, the reason not empty")
    import dataclasses

    from kernels.autotune import source_hash, source_modules
    from kernels.configs import get_spec

    path = Path(a.json)
    data = json.loads(path.read_text())
    restamped = 0
    for kernel, block in sorted(data["kernels"].items()):
        now = source_hash(kernel)
        if block["source_hash"] == now:
            print(f"{kernel}: fresh")
            continue
        mods = source_modules(kernel)
        pairs = [(base_source(a.base, m), inspect.getsource(m)) for m in mods]  # type: ignore[arg-type]
        live = reachable(list(pairs[0]), [src for pair in pairs[1:] for src in pair])
        diffs = [f"{m.__name__}.{n}" for m, (old, new) in zip(mods, pairs, strict=True) for n in changed_parts(old, new)
                 if n in live]  # fmt: skip
        default = {k: v for k, v in dataclasses.asdict(get_spec(kernel).default).items() if v is not None}
        verdict, message = judge(block, now=now, diffs=diffs, base=a.base, reason=accept.pop(kernel, None), default=default)
        if verdict == "drop":
            del data["kernels"][kernel]
        restamped += verdict != "stale"
        print(f"{kernel}: {message}")
    if accept:
        raise SystemExit(f"--accept named kernels that are not changed stale entries of the file: {', '.join(accept)}")
    overlaid = overlay(data, json.loads(Path(a.overlay).read_text()), source_hash) if a.overlay else 0
    if not a.dry_run and (restamped or overlaid):
        path.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
        print(f"wrote {path} ({restamped} re-stamped, {overlaid} overlaid)")


def overlay(data: dict, newer: dict, source_hash: Callable[[str], str]) -> int:
    """Lay `newer`'s entries over `data` in place (module docstring); returns how many entries it laid."""
    if newer.get("device") != data.get("device") or newer.get("schema_version") != data.get("schema_version"):
        raise SystemExit(
            f"the overlay is for {newer.get('device')} schema {newer.get('schema_version')}, the file for "
            f"{data.get('device')} schema {data.get('schema_version')}"
        )
    laid = 0
    for kernel, nb in sorted(newer["kernels"].items()):
        if nb["source_hash"] != source_hash(kernel):
            raise SystemExit(f"{kernel}: the overlay was tuned at other code than this build's (re-export it here)")
        block = data["kernels"].setdefault(kernel, {"entries": [], "source_hash": nb["source_hash"]})
        keys = {json.dumps(e["key"], sort_keys=True) for e in nb["entries"]}
        kept = [e for e in block["entries"] if json.dumps(e["key"], sort_keys=True) not in keys]
        if block["source_hash"] != nb["source_hash"] and kept:
            print(f"{kernel}: dropped {len(kept)} stale entries the overlay does not replace")
            kept = []
        block["entries"], block["source_hash"] = kept + nb["entries"], nb["source_hash"]
        laid += len(nb["entries"])
        print(f"{kernel}: overlaid {len(nb['entries'])} entries ({len(kept)} of the file's kept)")
    return laid


if __name__ == "__main__":
    main()
