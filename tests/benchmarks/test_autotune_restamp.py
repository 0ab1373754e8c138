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
