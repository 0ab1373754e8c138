"""README.md opens with the two commands, and every CLI verb it documents exists.

Scenarios: the first two blocks are fenced one-liners `./dev up` and `./dev test`, with nothing before them; the
`dev` script implements both; every `cpbench ...` command of the README's CLI table answers `--help` (through
typer's runner, in process); the verbs the service promises are all in that table.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
PROMISED = ["run", "submit", "worker", "status", "results", "db upgrade", "serve", "configs export", "regress", "bench"]


def test_readme_starts_with_the_two_commands() -> None:
    m = re.match(r"```(?:bash|sh)?\n(.*?)\n```\n\s*```(?:bash|sh)?\n(.*?)\n```\n", README)
    assert m is not None, README[:200]
    assert (m.group(1), m.group(2)) == ("./dev up", "./dev test")
    dev = (ROOT / "dev").read_text()
    assert "up) shift; cmd_up" in dev and "test) shift; cmd_test" in dev


def documented_commands() -> list[list[str]]:
    """The leading subcommand words of each `cpbench ...` code span in the CLI table."""
    section = README.split("## The CLI", 1)[1].split("\n## ", 1)[0]
    out = []
    for span in re.findall(r"^\| `cpbench ([^`]*)`", section, re.M):
        words = []
        for w in span.split():
            if not re.fullmatch(r"[a-z][a-z-]*", w):
                break
            words.append(w)
        out.append(words)
    return out


def test_readme_documents_every_verb() -> None:
    documented = {" ".join(w) for w in documented_commands()}
    assert [v for v in PROMISED if v not in documented] == []


@pytest.mark.parametrize("words", documented_commands(), ids=lambda w: " ".join(w))
def test_documented_verb_exists(words: list[str]) -> None:
    from typer.testing import CliRunner

    from bench_server.cli import app

    result = CliRunner().invoke(app, [*words, "--help"])
    assert result.exit_code == 0, result.output
    assert "Usage" in result.output
