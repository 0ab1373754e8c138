"""Sweep spec validation (runners.spec): the demo loads; bad specs fail with a `SpecError` naming the field.

Scenarios: the shipped demo; scalar shorthand; varlen lengths; unknown mode / backend / field; negative T;
fwd+bwd; a positive decay bound; a duplicate axis value (a repeated, empty, too long or NaN-holding list among 500
varlen length lists too); W and T over their limits; too many points; malformed
YAML and JSON; a missing file; a top level that is not a mapping.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pydantic_core import PydanticCustomError

from runners.errors import SpecError
from runners.spec import SweepSpec, grid_size, load_spec, parse_spec
from tests.runners.engine_fixtures import DEMO_SPEC


def _spec(**over: object) -> dict:
    base = {"name": "t", "ops": ["gdn"], "modes": ["none"], "axes": {"T": 256}}
    base.update(over)
    return base


def test_load_spec_demo() -> None:
    spec = load_spec(DEMO_SPEC)
    assert isinstance(spec, SweepSpec)
    assert spec.ops == ["gdn", "kda"] and spec.axes.W == [1, 2]
    assert grid_size(spec) == 2 * 6 * 2


def test_parse_spec_scalar_shorthand_and_varlen() -> None:
    spec = parse_spec(_spec(ops="kda", axes={"T": 128, "H": 4, "lengths": [100, 28], "W": 2}))
    assert spec.ops == ["kda"] and spec.axes.T == [128] and spec.axes.H == [4]
    assert spec.axes.lengths == [[100, 28]]
    assert grid_size(spec) == 2  # one dense shape, one varlen batch


@pytest.mark.parametrize(
    ("over", "field", "detail"),
    [
        pytest.param({"modes": ["none", "zigzag_ring"]}, "modes", "unknown mode 'zigzag_ring'", id="unknown-mode"),
        pytest.param({"backends": ["cuda"]}, "backends", "unknown backend 'cuda'", id="unknown-backend"),
        pytest.param({"axes": {"T": -5}}, "axes.T.0", "greater than or equal to 1", id="negative-T"),
        pytest.param({"axes": {"T": 256, "direction": "bwd"}}, "axes.direction", "unknown direction", id="bad-direction"),
        pytest.param({"axes": {"T": 256, "lb": 0.5}}, "axes.lb", "<= 0", id="positive-lb"),
        pytest.param({"axes": {"T": 256, "W": [2, 2]}}, "axes.W", "twice", id="duplicate-W"),
        pytest.param({"axes": {"T": 256, "W": 128}}, "axes.W", "CPBENCH_MAX_W", id="W-limit"),
        pytest.param({"axes": {"T": 1 << 23}}, "axes.T", "CPBENCH_MAX_T", id="T-limit"),
        pytest.param({"axes": {"H": 2}}, "axes", "give T", id="no-T"),
        pytest.param({"axes": {"T": 256, "Q": 1}}, "axes.Q", "Extra inputs", id="unknown-axis"),
        pytest.param({"timing": {"min_samples": 20, "max_samples": 10}}, "timing", "max_samples", id="timing-order"),
        pytest.param({"name": ""}, "name", "at least 1", id="empty-name"),
        # many varlen length lists (their checks run in C while nothing is wrong): each fault is still found
        pytest.param({"axes": {"lengths": [[i + 1, 1] for i in range(500)] + [[3, 1]]}}, "axes.lengths",
                     "lists a value twice: [[3, 1]]", id="duplicate-length-list"),
        pytest.param({"axes": {"lengths": [[i + 1, 1] for i in range(500)] + [[]]}}, "axes.lengths",
                     "must not be empty", id="empty-length-list"),
        pytest.param({"axes": {"lengths": [[i + 1, 1] for i in range(500)] + [[1 << 23, 1]]}}, "axes.lengths",
                     "sums to 8388609 tokens", id="length-list-over-T-limit"),
        pytest.param({"axes": {"lengths": [[i + 1, 1] for i in range(500)] + [[1, float("nan")]]}},
                     "spec.axes.lengths.500.1", "finite", id="nan-in-a-length-list"),
        pytest.param({"axes": {"lengths": [1] * 1000 + [float("inf")]}}, "spec.axes.lengths.1000", "finite",
                     id="inf-in-one-long-length-list"),
        pytest.param({"axes": {"lengths": [[1] * 40 for _ in range(2)]}}, "axes.lengths", "lists a value twice",
                     id="duplicate-long-length-list"),
        pytest.param({"mode_options": {"ring": {"window": 2}}}, "mode_options", "unknown option(s) window for mode 'ring'",
                     id="unknown-mode-option"),
        pytest.param({"mode_options": {"tail_exchange": {"fallback": "exact"}}}, "mode_options", "fallback must be one of",
                     id="bad-tail-exchange-fallback"),
    ],
)
def test_parse_spec_invalid_names_field(over: dict, field: str, detail: str) -> None:
    with pytest.raises(SpecError) as info:
        parse_spec(_spec(**over))
    msg = str(info.value)
    assert f"{field}:" in msg and detail in msg, msg


def test_distinct_lists_whose_hashes_collide_are_not_duplicates() -> None:
    """The duplicate check's fast pass compares hashes; distinct lists with equal hashes go to the exact pass."""
    from runners.spec import _no_duplicates

    assert hash((-1,)) == hash((-2,))
    assert _no_duplicates([[-1], [-2]], "axis lengths") == [[-1], [-2]]
    with pytest.raises(PydanticCustomError, match="twice"):
        _no_duplicates([[-1], [-2], [-1]], "axis lengths")


def test_parse_spec_too_many_points() -> None:
    with pytest.raises(SpecError, match=r"grid has 24000 points, more than the limit 20000"):
        parse_spec(_spec(axes={"T": list(range(64, 64 * 1201, 64)), "W": list(range(1, 21))}))


def test_parse_spec_points_limit_from_env(monkeypatch: pytest.MonkeyPatch) -> None:
    from runners.settings import get_worker_settings

    monkeypatch.setenv("CPBENCH_MAX_POINTS_PER_SWEEP", "3")
    get_worker_settings.cache_clear()
    try:
        with pytest.raises(SpecError, match="CPBENCH_MAX_POINTS_PER_SWEEP"):
            parse_spec(_spec(axes={"T": [64, 128, 192, 256]}))
    finally:
        monkeypatch.delenv("CPBENCH_MAX_POINTS_PER_SWEEP")
        get_worker_settings.cache_clear()


def test_load_spec_malformed_yaml(tmp_path: Path) -> None:
    p = tmp_path / "bad.yaml"
    p.write_text("name: x\nops: [gdn\nmodes: [none]\n")
    with pytest.raises(SpecError, match=r"malformed YAML in .*bad\.yaml: line \d+ column \d+"):
        load_spec(p)


def test_load_spec_malformed_json(tmp_path: Path) -> None:
    p = tmp_path / "bad.json"
    p.write_text('{"name": "x", "ops": ["gdn"],}')
    with pytest.raises(SpecError, match=r"malformed JSON in .*bad\.json: line 1 column"):
        load_spec(p)


def test_load_spec_json(tmp_path: Path) -> None:
    p = tmp_path / "ok.json"
    p.write_text(json.dumps(_spec(modes=["ring"], axes={"T": 128, "W": 2})))
    assert load_spec(p).modes == ["ring"]


def test_load_spec_missing_file(tmp_path: Path) -> None:
    with pytest.raises(SpecError, match="not found"):
        load_spec(tmp_path / "nope.yaml")


def test_load_spec_not_a_mapping(tmp_path: Path) -> None:
    p = tmp_path / "list.yaml"
    p.write_text("- a\n- b\n")
    with pytest.raises(SpecError, match="top level must be a mapping, got list"):
        load_spec(p)


@pytest.mark.parametrize(("axes", "detail"), [
    ({"lower_bound": -6.0}, "lower_bound must be in [-5, 0)"),
    ({"lower_bound": 0.0}, "lower_bound must be in [-5, 0)"),
    ({"gate": "softplus"}, "axes.gate.0"),
    ({"l2norm_in_kernel": "yes"}, "axes.l2norm_in_kernel.0"),
    ({"l2norm_in_kernel": 1}, "axes.l2norm_in_kernel.0"),
])
def test_gate_axes_are_checked(axes: dict, detail: str) -> None:
    with pytest.raises(SpecError, match=detail.replace("[", r"\[").replace("(", r"\(").replace(")", r"\)")):
        parse_spec({"name": "g", "ops": "kda", "modes": "none", "axes": {"T": 64, **axes}})


def test_load_specs_one_sweep_per_document(tmp_path: Path) -> None:
    path = tmp_path / "two.yaml"
    path.write_text("name: a\nops: gdn\nmodes: none\naxes: {T: 64}\n---\nname: b\nops: kda\nmodes: none\naxes: {T: 32}\n")
    from runners.spec import load_specs

    assert [s.name for s in load_specs(path)] == ["a", "b"]
    with pytest.raises(SpecError, match="holds 2 sweeps"):
        load_spec(path)
    assert [s.name for s in load_specs(DEMO_SPEC)] == [load_spec(DEMO_SPEC).name]
