"""The pre-commit hooks and `./dev test`'s lint step are the same checks.

Scenarios: every hook of .pre-commit-config.yaml is local (CI has no network to fetch hook repositories); the hook
ids equal the `# hook: <id>` tags of the `lint` function in `dev`, and each local command hook's command is the
command on its tagged line; the pygrep hook's pattern catches block pointers and no Python file of the tree has
one (what `./dev lint` checks, here without the venv).
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
BLOCK_PTR, ADVANCE = "make_" + "block_ptr", "tl." + "advance"  # in two halves: this file passes its own hook


def hooks() -> dict[str, dict[str, Any]]:
    config = yaml.safe_load((ROOT / ".pre-commit-config.yaml").read_text())
    assert [r["repo"] for r in config["repos"]] == ["local"] * len(config["repos"])
    return {h["id"]: h for r in config["repos"] for h in r["hooks"]}


def dev_lint_lines() -> dict[str, str]:
    """{hook id: the command line of `dev`'s lint function tagged with it}."""
    body = (ROOT / "dev").read_text().split("\nlint() {", 1)[1].split("\n}\n", 1)[0]
    tagged = [re.match(r"\s*(.*?)\s*# hook: (\S+)\s*$", line) for line in body.splitlines()]
    return {m.group(2): m.group(1) for m in tagged if m}


def command_words(line: str) -> list[str]:
    """The words of a shell line without environment assignments, the venv's bin/ prefix and `|| rc=1`."""
    words = shlex.split(line.split("||")[0])
    words = [w for w in words if not re.fullmatch(r"[A-Z_]+=.*", w)]
    return [w.rsplit("/", 1)[-1] for w in words]


def test_hooks_and_dev_lint_are_the_same_set() -> None:
    assert set(hooks()) == set(dev_lint_lines()) == {"ruff-check", "ruff-format", "no-make-block-ptr", "mypy"}


def test_each_system_hook_runs_the_command_of_dev() -> None:
    lines = dev_lint_lines()
    for hook_id, hook in hooks().items():
        if hook["language"] != "system":
            continue
        entry = [w for w in shlex.split(hook["entry"]) if not w.startswith("-")]
        dev = command_words(lines[hook_id])
        assert dev[: len(entry)] == entry, (hook_id, hook["entry"], lines[hook_id])


def test_pygrep_hook_is_read_by_dev() -> None:
    hook = hooks()["no-make-block-ptr"]
    assert hook["language"] == "pygrep" and hook["types"] == ["python"]
    assert command_words(dev_lint_lines()["no-make-block-ptr"]) == ["forbidden_patterns", "no-make-block-ptr"]


def test_pygrep_pattern_catches_block_pointers_and_the_tree_has_none() -> None:
    pattern = re.compile(hooks()["no-make-block-ptr"]["entry"])
    assert pattern.search(f"p = tl.{BLOCK_PTR}(x, (T,), (1,), (0,), (BT,), (0,))")
    assert pattern.search(f"p = {ADVANCE}(p, (BT,))")
    assert not pattern.search("p = tl.advanced_load(x)") and not pattern.search("o_t = i_t * BT + tl.arange(0, BT)")
    skip = {".git", ".venv", ".whl", ".gl", "build", "dist"}
    offenders = [
        f"{path.relative_to(ROOT)}:{i}"
        for path in ROOT.rglob("*.py")
        if not skip & set(path.relative_to(ROOT).parts)
        for i, line in enumerate(path.read_text(errors="replace").splitlines(), 1)
        if pattern.search(line)
    ]
    assert offenders == []
