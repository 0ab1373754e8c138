"""The typed point (runners.point): the JSON the store keeps, the defaults filled in once, older rows.

Scenarios: a point with every optional field and one without round-trip through `to_json` / `from_json` (and
pickle, as through the gang); the JSON of a point holds its optional fields only when set, as `expand` always
wrote them; a stored row of an older store (no direction, rep, HV or backend options) loads with the defaults,
which every reader then shares; keys the type does not know are ignored; a peer written against the former params
dict still reads `point["B"]`.
"""

from __future__ import annotations

import pickle
from dataclasses import replace

import pytest

from runners.collective_check import step_directions
from runners.grid import point_key
from runners.point import PointJob, PointSpec
from runners.training import is_training

FULL = {"op": "kda", "mode": "warmup_correct", "backend": "torchpeer", "B": 1, "T": 96, "lengths": [50, 30, 16], "H": 2,
        "K": 16, "V": 8, "lb": -0.5, "W": 1, "layout": "zigzag", "direction": "fwd+bwd", "dtype": "bfloat16", "seed": 3,
        "rep": 1, "HV": 4, "mode_options": {"tol": 0.01}, "backend_ref": "tests.plugins.torch_peer:PEER",
        "backend_options": {"x": 1}}
PLAIN = {"op": "gdn", "mode": "ring", "backend": "torch", "B": 2, "T": 128, "H": 4, "K": 32, "V": 32, "lb": -1.0, "W": 2,
         "layout": "contiguous", "direction": "fwd", "dtype": "float32", "seed": 0, "rep": 0}


@pytest.mark.parametrize("data", [FULL, PLAIN], ids=["every-field", "plain"])
def test_json_round_trip(data: dict) -> None:
    point = PointSpec.from_json(data)
    assert point.to_json() == data and list(point.to_json()) == list(data)  # the same JSON, in the same order
    assert PointSpec.from_json(point.to_json()) == point
    assert pickle.loads(pickle.dumps(point)) == point
    job = PointJob(point, {"profile": False}, trace_path=None)
    assert pickle.loads(pickle.dumps(job)) == job


def test_typed_fields() -> None:
    point = PointSpec.from_json({**FULL, "lb": -1, "T": "96"})
    assert point.lengths == (50, 30, 16) and point.lb == -1.0 and isinstance(point.lb, float) and point.T == 96
    assert point.tokens == 96 and point.value_heads == 4
    plain = PointSpec.from_json(PLAIN)
    assert plain.lengths is None and plain.HV is None and plain.value_heads == 4 and plain.tokens == 256
    assert plain.mode_options == {} and plain.backend_options == {} and plain.backend_ref is None
    assert "HV" not in plain.to_json() and "lengths" not in plain.to_json()
    assert replace(plain, HV=8).to_json()["HV"] == 8


def test_an_older_stored_row_loads_with_the_defaults() -> None:
    old = {k: v for k, v in PLAIN.items() if k not in ("direction", "rep")}  # a row from before those fields
    old["retired_field"] = "kept out"  # a key the type does not know
    point = PointSpec.from_json(old)
    assert (point.direction, point.rep, point.HV, point.backend_options) == ("fwd", 0, None, {})
    assert point.to_json() == PLAIN  # what `expand` writes today
    # every reader takes the default from the point: the direction a step runs, the training flag, the key
    assert step_directions(point.direction) == ("fwd",) and not is_training(point)
    assert point_key(point) == point_key(PointSpec.from_json(PLAIN))


def test_name_reads_for_peers_written_against_params() -> None:
    point = PointSpec.from_json(PLAIN)
    assert point["B"] * point["T"] == 256 and point.get("HV") is None and point.get("direction", "bwd") == "fwd"
    assert point.get("nope", 3) == 3
    with pytest.raises(KeyError):
        point["nope"]


def test_real_model_call_fields_only_when_not_default() -> None:
    """gate / lower_bound / l2norm_in_kernel (issue 25): an older point keeps its params JSON and key byte for byte; a
    point that sets them carries each that differs from its default, in the JSON and the key, and round-trips."""
    old = PointSpec.from_json(PLAIN)
    assert (old.gate, old.lower_bound, old.l2norm_in_kernel) == ("precomputed", -5.0, False)
    assert old.to_json() == PLAIN and list(old.to_json()) == list(PLAIN)
    assert point_key(old) == point_key(replace(old, lower_bound=-5.0))
    assert "gate" not in point_key(old) and "l2norm" not in point_key(old)
    safe = replace(old, gate="safe", lower_bound=-3.0, l2norm_in_kernel=True)
    assert safe.to_json() == {**PLAIN, "gate": "safe", "lower_bound": -3.0, "l2norm_in_kernel": True}
    assert PointSpec.from_json(safe.to_json()) == safe
    assert point_key(safe) == point_key(old) + ",gate=safe,lower_bound=-3,l2norm_in_kernel=True"
    in_kernel = replace(old, gate="in_kernel")
    assert in_kernel.to_json() == {**PLAIN, "gate": "in_kernel"}
    assert point_key(in_kernel) == point_key(old) + ",gate=in_kernel"
