"""The shape of the code, for architecture reviews: module sizes, the longest functions, import cycles, string-key
reads of a point's `params`, repeated-code pairs and what `import bench_server.main` loads.

    python benchmarks/code_metrics.py [--top 10] [--no-duplicates]

Reads the tracked Python files of the checkout (outside tests/ and benchmarks/) from their AST; cycles count every
import, including those inside functions. Repeated-code pairs come from the `duplicates` command when it is on the
PATH (the tool library's; skipped otherwise). Prints a Markdown report.
"""

from __future__ import annotations

import argparse
import ast
import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("bench_server", "dashboards", "db", "kernels", "runners")


def sources() -> list[Path]:
    out = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard", "*.py"], cwd=ROOT,
                         capture_output=True, text=True, check=True).stdout.split()
    return [ROOT / f for f in out if f.split("/")[0] in PACKAGES and (ROOT / f).is_file()]


def module_name(path: Path) -> str:
    return str(path.relative_to(ROOT))[: -len(".py")].replace("/", ".").removesuffix(".__init__")


def functions(tree: ast.AST) -> list[tuple[str, int, int]]:
    """(name, lines, parameter count) of every function and method."""
    out = []
    for n in ast.walk(tree):
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)):
            a = n.args
            count = len(a.posonlyargs) + len(a.args) + len(a.kwonlyargs) + (a.vararg is not None) + (a.kwarg is not None)
            if a.args and a.args[0].arg in ("self", "cls"):
                count -= 1
            out.append((n.name, (n.end_lineno or n.lineno) - n.lineno + 1, count))
    return out


def imported(path: Path, tree: ast.AST, known: set[str]) -> set[str]:
    """Project modules imported anywhere in the file (`from a import b` counts a.b when a.b is a module)."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: set[str] = set()
    for n in ast.walk(tree):
        if isinstance(n, ast.Import):
            out.update(a.name for a in n.names)
        elif isinstance(n, ast.ImportFrom):
            base = n.module or ""
            if n.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - n.level + 1] + ([base] if base else []))
            subs = {f"{base}.{a.name}" for a in n.names} & known
            out.update(subs if subs else {base})  # `from pkg import mod` depends on mod, not on pkg's __init__
    return {m for m in out if m in known and m != name}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    sys.setrecursionlimit(10000)

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def _is_params(n: ast.AST) -> bool:
    return isinstance(n, ast.Name) and n.id == "params"


def _is_str(n: ast.AST) -> bool:
    return isinstance(n, ast.Constant) and isinstance(n.value, str)


def params_reads(tree: ast.AST) -> int:
    """`params[...]` subscripts with a string key and `params.get("...")` calls."""
    count = 0
    for n in ast.walk(tree):
        subscript = isinstance(n, ast.Subscript) and _is_params(n.value) and _is_str(n.slice)
        get = (isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "get"
               and _is_params(n.func.value) and bool(n.args) and _is_str(n.args[0]))
        count += subscript or get
    return count


def duplicate_pairs(min_lines: int) -> str:
    if shutil.which("duplicates") is None:
        return "n/a (no `duplicates` on the PATH)"
    out = subprocess.run(["duplicates", "--min-lines", str(min_lines), "--most", "1", "--seconds", "120"], cwd=ROOT,
                         capture_output=True, text=True).stdout
    first = out.splitlines()[0] if out else ""
    m = re.search(r"(\d+) pairs?", first)
    return m.group(1) if m else first


def import_probe() -> str:
    code = ("import sys, time; t = time.perf_counter(); import bench_server.main; dt = time.perf_counter() - t; "
            "print(f'{dt:.2f} s, {len(sys.modules)} modules in sys.modules, torch loaded: {\"torch\" in sys.modules}, '"
            "f'{sum(1 for m in sys.modules if m.split(\".\")[0] in {\"bench_server\",\"dashboards\",\"db\",\"kernels\",\"runners\"})} project modules')")
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    return r.stdout.strip() or r.stderr.strip().splitlines()[-1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--top", type=int, default=10)
    ap.add_argument("--no-duplicates", action="store_true")
    args = ap.parse_args()
    files = sources()
    known = {module_name(p) for p in files}
    sizes, funcs, graph, reads = [], [], {}, {}
    for p in files:
        text = p.read_text()
        tree = ast.parse(text, str(p))
        name = module_name(p)
        sizes.append((len(text.splitlines()), name))
        funcs += [(lines, count, f"{name}.{fn}") for fn, lines, count in functions(tree)]
        graph[name] = imported(p, tree, known)
        if (r := params_reads(tree)):
            reads[name] = r
    print(f"## Code metrics ({len(files)} modules, {sum(s for s, _ in sizes)} lines)\n")
    print("| largest modules | lines |\n|---|---:|")
    for lines, name in sorted(sizes, reverse=True)[: args.top]:
        print(f"| `{name}` | {lines} |")
    print("\n| longest functions | lines | parameters |\n|---|---:|---:|")
    for lines, count, name in sorted(funcs, reverse=True)[: args.top]:
        print(f"| `{name}` | {lines} | {count} |")
    engine = [f for f in funcs if not f[2].endswith("_kernel") and ".migrations." not in f[2]]
    print("\n| longest functions outside Triton kernels and migrations | lines | parameters |\n|---|---:|---:|")
    for lines, count, name in sorted(engine, reverse=True)[: args.top]:
        print(f"| `{name}` | {lines} | {count} |")
    most = sorted(engine, key=lambda f: (f[1], f[0]), reverse=True)[:5]
    print("\nmost parameters: " + ", ".join(f"`{n}` {c}" for _, c, n in most))
    found = cycles(graph)
    print(f"\nimport cycles (module and function level): {len(found)}")
    for c in found:
        print("- " + " <-> ".join(c))
    print(f"\nstring-key reads of `params`: {sum(reads.values())} in {len(reads)} modules")
    if not args.no_duplicates:
        print(f"\nrepeated-code pairs: >= 6 lines {duplicate_pairs(6)}, >= 10 lines {duplicate_pairs(10)}")
    print(f"\n`import bench_server.main`: {import_probe()}")


if __name__ == "__main__":
    main()
