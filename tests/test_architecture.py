"""The import graph, read from the AST of every tracked module, keeps to DESIGN.md's one-way rule.

Nodes are the top-level packages, with `kernels.cp` and `kernels.vocabulary` apart from the rest of `kernels`
(kernels.cp -> kernels -> kernels.vocabulary; the peer protocol and FLA's peer sit in the engine, `runners.peers`):

    bench_server -> runners -> kernels.cp -> kernels -> kernels.vocabulary;   runners -> db;   bench_server -> db, dashboards;
    dashboards -> db, kernels.vocabulary (the names and counts, no torch);   benchmarks (device-only scripts) -> runners and below

An edge is allowed when the target is listed for the source (listing is transitive by hand: bench_server may use
everything runners may). Inside `kernels`, `common/` is shared by the ops and must not import an op (`kernels.ops`)
or `cp`; `kernels` imports only torch, triton, numpy (the interpreter shim), the standard library and
FLA (the optional `fla` backend), because a training job imports it alone.
Every import counts, including the ones inside functions.

Between modules: no import cycle, even through imports inside functions. Only `db/` queries the store: no
`select(...)` and no `.execute(...)` on a session elsewhere (the rest goes through `db.crud` / `db.queue`).
`kernels/` holds no process state: no `global` statement, no module-level container written at run time (launch
configs, the recompute policy and what launched travel in a `kernels.plan.LaunchPlan`). `kernels.vocabulary` and
the web process (`bench_server.main`) import no torch. Tests of the engine mirror it: each module under
tests/runners/ (tests/benchmarks/) is `test_<module>[_<feature>].py` beside the path of the module it exercises.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from collections.abc import Collection, Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

VOCAB = "kernels.vocabulary"
ALLOWED: dict[str, set[str]] = {
    VOCAB: set(),  # the standard library only: the web process imports it
    "kernels": {VOCAB},
    "kernels.cp": {"kernels", VOCAB},
    "db": set(),
    "runners": {"kernels.cp", "kernels", VOCAB, "db"},
    "dashboards": {"db", VOCAB},  # the mode names, dtype sizes and directions (no torch)
    "bench_server": {"runners", "kernels.cp", "kernels", VOCAB, "db", "dashboards"},
    "benchmarks": {"bench_server", "dashboards", "runners", "kernels.cp", "kernels", VOCAB, "db"},
}
# fla: the "fla" backend; tilelang: GDN's reverse-walk backward (`kernels.ops.gdn.reverse_bwd`, imported inside its
# builder only: importing kernels loads neither, test_importing_the_kernels_loads_no_tilelang)
KERNELS_THIRD_PARTY = {"torch", "triton", "numpy", "fla", "tilelang"}
OPS = ("kernels.ops", "kernels.cp")


def node(module: str) -> str | None:
    """The graph node of a dotted module name (None outside the project's packages)."""
    top = module.split(".")[0]
    for sub in ("kernels.cp", VOCAB):
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
    assert node("kernels.vocabulary") == VOCAB and node("kernels.api") == "kernels"


def test_kernels_common_imports_no_op() -> None:
    bad = [f"{path.relative_to(ROOT)}:{line} {target}" for path in (ROOT / "kernels" / "common").glob("*.py")
           for target, line in imports(path) if target.startswith(OPS)]
    assert bad == []


def test_kernels_imports_only_torch_triton_and_the_standard_library() -> None:
    allowed = KERNELS_THIRD_PARTY | set(sys.stdlib_module_names) | {"kernels"}
    bad = [f"{path.relative_to(ROOT)}:{line} {target}" for path in (ROOT / "kernels").rglob("*.py")
           for target, line in imports(path) if target.split(".")[0] not in allowed]
    assert bad == []


def test_the_vocabulary_imports_only_the_standard_library() -> None:
    path = ROOT / "kernels" / "vocabulary.py"
    bad = [f"{line} {target}" for target, line in imports(path)
           if target.split(".")[0] not in sys.stdlib_module_names and target != "__future__"]
    assert bad == []


def _modules_after_import(module: str) -> set[str]:
    """The names in sys.modules after a fresh interpreter imports `module` (the tree under test first on the path)."""
    code = f"import sys, {module}; print(' '.join(sys.modules))"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    env.pop("CPBENCH_AUTOTUNE", None)
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, check=True)
    return set(out.stdout.split())


def test_the_web_process_imports_no_torch() -> None:
    """`import bench_server.main` (the FastAPI app, its routes, the dashboards, the spec) loads no torch."""
    loaded = _modules_after_import("bench_server.main")
    assert "fastapi" in loaded and "torch" not in loaded


def test_importing_the_kernels_loads_no_tilelang() -> None:
    """The TileLang kernel's module imports tilelang only when a kernel is built: a training job without tilelang
    imports every op."""
    loaded = _modules_after_import("kernels.ops.gdn.reverse_bwd")
    assert "kernels.ops.gdn.reverse_bwd" in loaded and "torch" in loaded and "tilelang" not in loaded


def test_the_vocabulary_imports_no_torch() -> None:
    """`import kernels.vocabulary` runs `kernels/__init__.py`, whose public names load on first use."""
    loaded = _modules_after_import("kernels.vocabulary")
    assert "kernels.vocabulary" in loaded and "torch" not in loaded and "kernels.api" not in loaded


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


def mirrored_source(test: Path, tests_root: Path, source_root: Path) -> Path | None:
    """The source module a test module covers: `tests/runners/tuner/test_tune_direction.py` covers
    `runners/tuner/tune.py` (the longest `<module>` with `test_<module>[_<feature>].py`); `test_<package>.py` covers a
    package's `__init__.py`. None when no module of the mirrored folder matches."""
    folder = source_root / test.parent.relative_to(tests_root)
    words = test.stem.removeprefix("test_").split("_")
    for n in range(len(words), 0, -1):
        stem = "_".join(words[:n])
        for candidate in (folder / f"{stem}.py", folder / stem / "__init__.py"):
            if candidate.is_file():
                return candidate
    return None


def test_tests_of_the_engine_mirror_its_modules() -> None:
    """Every test module under tests/runners/ names the runners module it exercises, in the same folder, and every
    test module under tests/benchmarks/ the script it runs: "where is runners/tuner/trials.py tested?" has one answer."""
    pairs = [(ROOT / "tests" / "runners", ROOT / "runners"), (ROOT / "tests" / "benchmarks", ROOT / "benchmarks")]
    bad = [str(test.relative_to(ROOT)) for tests_root, source_root in pairs for test in sorted(tests_root.rglob("test_*.py"))
           if mirrored_source(test, tests_root, source_root) is None]
    assert bad == []
    runners_tests = ROOT / "tests" / "runners"
    probe = runners_tests / "tuner" / "test_tune_direction.py"
    assert mirrored_source(probe, runners_tests, ROOT / "runners") == ROOT / "runners" / "tuner" / "tune.py"
    assert mirrored_source(runners_tests / "test_nosuch_feature.py", runners_tests, ROOT / "runners") is None


def test_tests_of_the_kernels_mirror_their_modules() -> None:
    """tests/kernels/ mirrors kernels/ (FLA's per-op layout: tests/kernels/ops/gdn/test_naive.py covers
    kernels/ops/gdn/naive.py); a test of a test helper (tests/kernels/poison.py, tests/kernels/cp/cases.py) sits beside it."""
    tests_root = ROOT / "tests" / "kernels"
    bad = [str(test.relative_to(ROOT)) for test in sorted(tests_root.rglob("test_*.py"))
           if mirrored_source(test, tests_root, ROOT / "kernels") is None
           and mirrored_source(test, test.parent, test.parent) is None]
    assert bad == []
