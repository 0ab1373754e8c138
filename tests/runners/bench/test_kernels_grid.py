"""The rows of `cpbench bench kernels` / `bench train` (`runners.bench.kernels_grid`): issue 26's preset expands into
its grid with the most important rows first, bad lists give one-line errors, and the deadline lets the first row run
and cuts the rows that would not fit."""

from __future__ import annotations

import itertools

import pytest

from runners.bench.kernels_grid import Case, Deadline, expand_cases, parse_floats, parse_shapes


def test_issue26_preset_is_the_issues_grid_most_important_first() -> None:
    cases = expand_cases(preset="issue26")
    shapes = [(1, 8192), (1, 32768), (1, 65536), (1, 131072), (8, 8192)]
    assert sorted(cases, key=repr) == sorted(
        (Case(B, T, hv, lb) for (B, T), hv, lb in itertools.product(shapes, (16, 32), (-5.0, -1.0))), key=repr
    )
    assert len(cases) == 20 and len(set(cases)) == 20
    # the rows a deadline must not cut come first: 1x128K and 1x32K at HV=16, lb=-1
    assert cases[:2] == [Case(1, 131072, 16, -1.0), Case(1, 32768, 16, -1.0)]
    assert all(c.HV == 16 and c.lb == -1.0 for c in cases[:5])
    assert cases[-1].HV == 32 and cases[-1].lb == -5.0


def test_lists_beside_a_preset_replace_its_lists() -> None:
    cases = expand_cases(preset="issue26", shapes=parse_shapes("8x8192,1x8192"), hv=(32,))
    assert cases == [Case(8, 8192, 32, -1.0), Case(1, 8192, 32, -1.0), Case(8, 8192, 32, -5.0), Case(1, 8192, 32, -5.0)]
    assert expand_cases() == [Case(B, T, 16, None) for B, T in [(1, 131072), (1, 32768), (1, 65536), (8, 8192), (1, 8192)]]
    assert expand_cases(shapes=[(2, 4096)], lb=parse_floats("-5,-1", "--lb"))[0].label == "2x4096 HV=16 lb=-5"


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: expand_cases(preset="issue99"), "--preset: unknown preset 'issue99'; one of issue26"),
        (lambda: parse_shapes("1x8k"), "--shapes: '1x8k' is not BxT (e.g. 1x8192)"),
        (lambda: parse_shapes("0x8192"), "--shapes: '0x8192' needs B >= 1 and T >= 1"),
        (lambda: parse_floats("-5,x", "--lb"), "--lb: '-5,x' is not a comma list of numbers"),
        (lambda: expand_cases(hv=(24,)), "--hv: value heads must be a multiple of the 16 query/key heads, got 24"),
    ],
)
def test_bad_lists_are_one_line_errors(call, message: str) -> None:
    with pytest.raises(ValueError) as err:
        call()
    assert str(err.value) == message


def test_deadline_runs_the_first_row_and_cuts_what_would_not_fit() -> None:
    now = [0.0]
    d = Deadline(200, clock=lambda: now[0])
    now[0] = 10.0
    assert d.allows()  # the first row always runs
    now[0] = 80.0
    assert d.done(first_calls_s=30.0) == 70.0  # 30 s of it compiled: the rows after it are estimated at 40 s
    assert d.longest == 40.0 and d.allows()  # 80 + 40 <= 200
    now[0] = 100.0
    assert d.done() == 20.0 and d.longest == 40.0
    now[0] = 170.0
    assert not d.allows()  # 170 + 40 > 200
    assert d.why() == "cut by the deadline: 170 s elapsed + 40 s (the longest row) > 200 s"
    unlimited = Deadline(0, clock=lambda: now[0])
    unlimited.longest = 1e9
    assert unlimited.allows()
