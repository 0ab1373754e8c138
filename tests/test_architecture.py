"""The import graph, read from the AST of every tracked module, keeps to DESIGN.md's one-way rule.

Nodes are the top-level packages, with `kernels.cp` and `kernels.peers` apart from the rest of `kernels` (peers -> kernels.cp -> kernels):

    bench_server -> runners -> kernels.cp -> kernels;   runners -> db;   bench_server -> db, dashboards;
    dashboards -> db, kernels.cp (the mode vocabulary);   benchmarks (device-only scripts) -> runners and below

An edge is allowed when the target is listed for the source (listing is transitive by hand: bench_server may use
everything runners may). Inside `kernels`, `common/` is shared by the ops and must not import an op (`gdn`,
`kda`) or `cp`; `kernels` imports only torch, triton, numpy (the interpreter shim), the standard library and
FLA (the optional `fla` backend), because a training job imports it alone.
Every import counts, including the ones inside functions.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import Iterator
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


def imports(path: Path, name: str | None = None) -> Iterator[tuple[str, int]]:
    """(absolute module name, line) of every import statement in a file; relative imports are resolved.

    `name` is the file's dotted module name (default: from its path under the repository root).
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
            yield base, n.lineno


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


def _kernels_trees() -> Iterator[tuple[str, ast.Module]]:
    for path in sorted((ROOT / "kernels").rglob("*.py")):
        yield str(path.relative_to(ROOT)), ast.parse(path.read_text(), str(path))


def test_kernels_has_no_global_statement() -> None:
    """Launch configs, the recompute policy and what launched travel in a `kernels.plan.LaunchPlan` passed as an
    argument: no function of `kernels/` rebinds a module variable."""
    bad = [f"{rel}:{n.lineno} global {', '.join(n.names)}" for rel, tree in _kernels_trees() for n in ast.walk(tree)
           if isinstance(n, ast.Global)]
    assert bad == []


_MUTATORS = {"clear", "pop", "popitem", "update", "setdefault", "append", "extend", "remove", "insert", "add",
             "discard", "move_to_end"}


def _mutated_module_names(tree: ast.Module) -> Iterator[tuple[str, str, int]]:
    """(function, module-level name, line) of every in-place change of a module-level container inside a function:
    a mutating method call or an item store / delete."""
    top = {t.id for n in tree.body if isinstance(n, (ast.Assign, ast.AnnAssign))
           for t in (n.targets if isinstance(n, ast.Assign) else [n.target]) if isinstance(t, ast.Name)}
    for fn in ast.walk(tree):
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for n in ast.walk(fn):
            targets: list[ast.expr] = []
            if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr in _MUTATORS:
                targets = [n.func.value]
            elif isinstance(n, (ast.Assign, ast.Delete)):
                targets = [t.value for t in n.targets if isinstance(t, ast.Subscript)]
            elif isinstance(n, ast.AugAssign) and isinstance(n.target, ast.Subscript):
                targets = [n.target.value]
            for t in targets:
                if isinstance(t, ast.Name) and t.id in top:
                    yield fn.name, t.id, n.lineno


def test_kernels_mutates_no_module_state_at_run_time() -> None:
    """No module-level container of `kernels/` is written by a function, except the kernel registry filled by
    `register` at import (`kernels.configs.KERNELS`) and memo caches (`*_CACHE`, keyed by what they cache)."""
    bad = [f"{rel}:{line} {fn}() changes {name}" for rel, tree in _kernels_trees()
           for fn, name, line in _mutated_module_names(tree)
           if not (name.endswith("_CACHE") or (name, fn) == ("KERNELS", "register"))]
    assert bad == []


def test_the_module_state_checker_sees_item_stores_and_mutating_calls() -> None:
    probe = ast.parse("SEEN = {}\nKEEP = []\ndef f(x):\n    SEEN[x] = 1\n    KEEP.clear()\n    y = {}\n    y[x] = 2\n")
    assert sorted(_mutated_module_names(probe)) == [("f", "KEEP", 5), ("f", "SEEN", 4)]
