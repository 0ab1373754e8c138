"""`benchmarks/autotune_restamp.py`: which edits of a kernel module leave its tuned configs valid (the AST comparison
of its device-side parts). That the shipped file is fresh in this tree is `tests/kernels/test_autotune_shipped.py`'s."""

from __future__ import annotations

import pytest

from tests.utils.scripts import load_script

changed_parts = load_script("autotune_restamp").changed_parts

BASE = '''
import triton
import triton.language as tl

SPEC = register(KernelSpec(name="k", default=LaunchConfig(BV=32), space={"BV": (16, 32)}))
BLOCK = 64


def launcher(x):
    """host code"""
    return k_kernel[(1,)](x, BV=32)


@triton.heuristics({"USE_X": lambda args: args["x"] is not None})
@triton.jit
def k_kernel(x, BV: tl.constexpr, USE_X: tl.constexpr):
    tl.store(x + tl.arange(0, BV), 1.0)
'''


def test_host_code_docstrings_and_the_heuristics_spelling_do_not_count() -> None:
    edited = BASE.replace('"""host code"""', '"""host code, reworded"""').replace(
        "return k_kernel", "y = 1\n    return k_kernel"
    )
    edited = edited.replace("@triton.heuristics(", "@heuristics(")
    assert changed_parts(BASE, edited) == []


@pytest.mark.parametrize(
    ("old", "new", "name"),
    [
        ("tl.store(x + tl.arange(0, BV), 1.0)", "tl.store(x + tl.arange(0, BV), 2.0)", "def k_kernel"),
        ('"x"] is not None', '"x"] is None', "def k_kernel"),
        ('space={"BV": (16, 32)}', 'space={"BV": (16, 32, 64)}', "SPEC"),
        ("BLOCK = 64", "BLOCK = 128", "BLOCK"),
    ],
)
def test_a_device_side_edit_is_named(old: str, new: str, name: str) -> None:
    assert changed_parts(BASE, BASE.replace(old, new)) == [name]


def test_a_kernel_added_or_removed_is_named() -> None:
    assert changed_parts(BASE, BASE + "\n\n@triton.jit\ndef other(x):\n    pass\n") == ["def other"]
    assert changed_parts(BASE, "") == ["BLOCK", "SPEC", "def k_kernel"]


def _entry(key: dict, bv: int) -> dict:
    return {"config": {"BV": bv}, "key": key, "median_ms": 1.0, "default_ms": 1.0}


def test_overlay_replaces_same_key_entries_keeps_fresh_ones_and_drops_stale_ones() -> None:
    overlay = load_script("autotune_restamp").overlay
    hashes = {"a": "A2", "b": "B1", "c": "C1"}  # this build's source hashes
    k1, k2 = {"H": 16}, {"H": 32}
    data = {
        "device": "H200",
        "schema_version": 1,
        "kernels": {
            "a": {"source_hash": "A1", "entries": [_entry(k1, 16), _entry(k2, 16)]},  # stale: a changed since
            "b": {"source_hash": "B1", "entries": [_entry(k1, 16), _entry(k2, 16)]},  # fresh
        },
    }
    newer = {
        "device": "H200",
        "schema_version": 1,
        "kernels": {k: {"source_hash": hashes[k], "entries": [_entry(k1, 64)]} for k in ("a", "b", "c")},
    }
    assert overlay(data, newer, hashes.__getitem__) == 3
    got = {
        k: (b["source_hash"], [(e["key"]["H"], e["config"]["BV"]) for e in b["entries"]]) for k, b in data["kernels"].items()
    }
    assert got == {"a": ("A2", [(16, 64)]), "b": ("B1", [(32, 16), (16, 64)]), "c": ("C1", [(16, 64)])}
    with pytest.raises(SystemExit, match="other code"):  # an overlay made at another build is refused
        overlay(data, newer, {"a": "A3", "b": "B1", "c": "C1"}.__getitem__)
    with pytest.raises(SystemExit, match="schema"):
        overlay(data, {**newer, "device": "H100"}, hashes.__getitem__)


HELPERS = """
import triton
import triton.language as tl

SCALE = 2.0
OTHER = 3.0


@triton.jit
def _used(x):
    return _inner(x) * SCALE


@triton.jit
def _inner(x):
    return x + 1


@triton.jit
def _unused(x):
    return x * OTHER
"""


def test_only_what_the_kernel_module_reaches_counts() -> None:
    """(session 20) A helper module's function or constant that no function of the kernel's module reaches,
    directly or through other helpers, is not part of what was tuned; the module's own constants always are."""
    reachable = load_script("autotune_restamp").reachable
    own = BASE.replace("tl.store(x + tl.arange(0, BV), 1.0)", "tl.store(x + tl.arange(0, BV), _used(1.0))")
    live = reachable([own], [HELPERS])
    assert {"def k_kernel", "def _used", "def _inner", "SCALE", "SPEC", "BLOCK"} <= live
    assert "def _unused" not in live and "OTHER" not in live
    assert "def _used" not in reachable([BASE], [HELPERS])  # the kernel does not call it


def test_default_entries_are_those_at_the_spec_default() -> None:
    default_entries = load_script("autotune_restamp").default_entries
    block = {"entries": [_entry({"H": 16}, 32), _entry({"H": 32}, 16)]}
    assert default_entries(block, {"BV": 32}) == [block["entries"][0]]


def test_judge_restamps_accepts_drops_or_leaves_stale() -> None:
    """(session 31) A stale block: unchanged device code takes the new hash; a changed one stays stale unless every
    entry is the default (dropped) or `--accept` gave a reason, which the block then keeps beside the new hash."""
    judge = load_script("autotune_restamp").judge

    def block() -> dict:
        return {"source_hash": "old", "entries": [_entry({"H": 16}, 64)]}

    b = block()
    assert judge(b, now="new", diffs=[], base="abc", reason=None, default={"BV": 32})[0] == "restamp"
    assert b["source_hash"] == "new" and "accepted" not in b
    b = block()
    verdict, message = judge(b, now="new", diffs=["m.def k"], base="abc", reason=None, default={"BV": 32})
    assert (verdict, b["source_hash"]) == ("stale", "old") and "re-tune" in message
    assert judge(block(), now="new", diffs=["m.def k"], base="abc", reason=None, default={"BV": 64})[0] == "drop"
    b = block()
    assert judge(b, now="new", diffs=["m.def k"], base="abc", reason="a flag equal at every tuned launch",
                 default={"BV": 32})[0] == "accept"  # fmt: skip
    assert b["source_hash"] == "new" and b["accepted"] == "abc: m.def k changed; a flag equal at every tuned launch"
    b["source_hash"] = "older"  # a later plain re-stamp clears the decision
    assert judge(b, now="newest", diffs=[], base="def", reason=None, default={"BV": 32})[0] == "restamp"
    assert "accepted" not in b
