"""The import graph, read from the AST of every tracked module, keeps to DESIGN.md's one-way rule.

Nodes are the top-level packages, with `kernels.cp` and `kernels.peers` apart from the rest of `kernels` (peers -> kernels.cp -> kernels):

    bench_server -> runners -> kernels.cp -> kernels;   runners -> db;   bench_server -> db, dashboards;
    dashboards -> db, kernels.cp (the mode vocabulary);   benchmarks (device-only scripts) -> runners and below

An edge is allowed when the target is listed for the source (listing is transitive by hand: bench_server may use
everything runners may). Inside `kernels`, `common/` is shared by the ops and must not import an op (`gdn`,
`kda`) or `cp`; `kernels` imports only torch, triton, numpy (the interpreter shim), the standard library and
FLA (the optional `fla` backend), because a training job imports it alone.
Every import counts, including the ones inside functions.

Between modules: no import cycle, even through imports inside functions. Only `db/` queries the store: no
`select(...)` and no `.execute(...)` on a session elsewhere (the rest goes through `db.crud` / `db.queue`).
"""

from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import Collection, Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

ALLOWED: dict[str, set[str]] = {
    "kernels": set(),
    "kernels.cp": {"kernels"},
    "kernels.peers": {"kernels.cp", "kernels"},  # peers' implementations of the CP modes sit beside ours
    "db": set(),
    "runners": {"kernels.peers", "kernels.cp", "kernels", "db"},
    "dashboards": {"db", "kernels.cp"},  # kernels.cp: the mode vocabulary and expected collectives (cost model)
    "bench_server": {"runners", "kernels.peers", "kernels.cp", "kernels", "db", "dashboards"},
    "benchmarks": {"bench_server", "dashboards", "runners", "kernels.peers", "kernels.cp", "kernels", "db"},
}
KERNELS_THIRD_PARTY = {"torch", "triton", "numpy", "fla"}
OPS = ("kernels.gdn", "kernels.kda", "kernels.cp")


def node(module: str) -> str | None:
    """The graph node of a dotted module name (None outside the project's packages)."""
    top = module.split(".")[0]
    for sub in ("kernels.cp", "kernels.peers"):
        if module == sub or module.startswith(sub + "."):
            return sub
    return top if top in ALLOWED or top == "tests" else None


def module_name(path: str) -> str:
    return path[: -len(".py")].replace("/", ".").removesuffix(".__init__")


def imports(path: Path, name: str | None = None, known: Collection[str] = ()) -> Iterator[tuple[str, int]]:
    """(absolute module name, line) of every import statement in a file; relative imports are resolved.

    `name` is the file's dotted module name (default: from its path under the repository root). `known`: module
    names; `from a import b` then stands for a.b when a.b is one of them (b is a module, not a name of a).
    """
    name = name or module_name(str(path.relative_to(ROOT)))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    for n in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(n, ast.Import):
            for a in n.names:
                yield a.name, n.lineno
        elif isinstance(n, ast.ImportFrom):
            base = n.module or ""
            if n.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - n.level + 1] + ([base] if base else []))
            subs = [f"{base}.{a.name}" for a in n.names if f"{base}.{a.name}" in known]
            for target in subs or [base]:
                yield target, n.lineno


def tracked_modules() -> list[Path]:
    out = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard", "*.py"], cwd=ROOT,
                         capture_output=True, text=True, check=True).stdout.split()
    return [ROOT / f for f in out if (ROOT / f).is_file()]


def graph() -> dict[tuple[str, str], list[str]]:
    """{(source node, target node): ["file:line", ...]} over every tracked module outside tests/."""
    edges: dict[tuple[str, str], list[str]] = {}
    for path in tracked_modules():
        rel = str(path.relative_to(ROOT))
        src = node(module_name(rel))
        if src is None or src == "tests":
            continue
        for target, line in imports(path):
            dst = node(target)
            if dst is not None and dst != src:
                edges.setdefault((src, dst), []).append(f"{rel}:{line}")
    return edges


def test_the_graph_between_packages_is_one_way() -> None:
    bad = {f"{a} -> {b}": where for (a, b), where in graph().items() if b not in ALLOWED[a]}
    assert bad == {}


def test_the_checker_sees_nested_and_relative_imports(tmp_path: Path) -> None:
    probe = tmp_path / "probe.py"
    probe.write_text("def f():\n    from bench_server.main import create_app\n    from . import spec\n    from .cli import common\n")
    found = set(imports(probe, "runners.probe"))
    assert found == {("bench_server.main", 2), ("runners", 3), ("runners.cli", 4)}
    assert node("bench_server.main") == "bench_server" and node("kernels.cp.modes") == "kernels.cp" and node("os") is None


def test_kernels_common_imports_no_op() -> None:
    bad = [f"{path.relative_to(ROOT)}:{line} {target}" for path in (ROOT / "kernels" / "common").glob("*.py")
           for target, line in imports(path) if target.startswith(OPS)]
    assert bad == []


def test_kernels_imports_only_torch_triton_and_the_standard_library() -> None:
    allowed = KERNELS_THIRD_PARTY | set(sys.stdlib_module_names) | {"kernels"}
    bad = [f"{path.relative_to(ROOT)}:{line} {target}" for path in (ROOT / "kernels").rglob("*.py")
           for target, line in imports(path) if target.split(".")[0] not in allowed]
    assert bad == []


def project_modules() -> dict[str, Path]:
    """{dotted name: path} of every tracked module outside tests/."""
    out = {}
    for path in tracked_modules():
        name = module_name(str(path.relative_to(ROOT)))
        if node(name) not in (None, "tests"):
            out[name] = path
    return out


def find_cycle(graph: dict[str, set[str]]) -> list[str]:
    """One import cycle of `graph` as a path [a, b, ..., a] (depth-first, back edge), or [] when there is none."""
    done: set[str] = set()
    stack: list[str] = []

    def visit(v: str) -> list[str]:
        stack.append(v)
        for w in sorted(graph.get(v, ())):
            if w in stack:
                return [*stack[stack.index(w):], w]
            if w not in done and (found := visit(w)):
                return found
        done.add(stack.pop())
        return []

    for v in sorted(graph):
        if v not in done and (found := visit(v)):
            return found
    return []


def test_no_import_cycle_between_modules(tmp_path: Path) -> None:
    mods = project_modules()
    graph = {m: {t for t, _ in imports(p, m, known=mods) if t in mods and t != m} for m, p in mods.items()}
    assert find_cycle(graph) == []
    # the checker: a cycle is found wherever it closes; `from a import b` stands for a.b when b is a module
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"b", "d"}, "d": set()}) == ["b", "c", "b"]
    probe = tmp_path / "probe.py"
    probe.write_text("def f():\n    from runners.tuner import export, TuneSpec\n    from . import spec\n")
    assert set(imports(probe, "runners.probe", known={"runners.tuner.export"})) == {("runners.tuner.export", 2),
                                                                                   ("runners", 3)}


def _store_queries(tree: ast.AST) -> Iterator[tuple[int, str]]:
    """(line, call) of every `select(...)` (SQLAlchemy's) and every `.execute(...)` (a session's) in a module."""
    for n in ast.walk(tree):
        if not isinstance(n, ast.Call):
            continue
        f = n.func
        if isinstance(f, ast.Name) and f.id == "select" or isinstance(f, ast.Attribute) and f.attr == "select" and (
                isinstance(f.value, ast.Name) and f.value.id in ("sqlalchemy", "sa")):
            yield n.lineno, "select("
        elif isinstance(f, ast.Attribute) and f.attr == "execute":
            yield n.lineno, f"{ast.unparse(f.value)}.execute("


def test_only_db_queries_the_store() -> None:
    bad = [f"{path.relative_to(ROOT)}:{line} {call}" for name, path in project_modules().items() if node(name) != "db"
           for line, call in _store_queries(ast.parse(path.read_text()))]
    assert bad == []
    probe = "def f(s):\n    s.execute(select(A))\n    t.index_select(0, i)\n    self.session.execute(sa.select(B))\n"
    assert sorted(_store_queries(ast.parse(probe))) == [(2, "s.execute("), (2, "select("), (4, "select("),
                                                        (4, "self.session.execute(")]
