"""Grid expansion (runners.grid): deterministic order, idx and keys; every skip rule stores its reason.

Scenarios: two expansions of the demo are identical and have 24 points with sequential idx; the rows carry every
`Point` column `db.crud.create_sweep` needs; skip reasons (single-device modes at W > 1, W over the devices,
headwise H % W, token counts not splitting for contiguous and zigzag, a mode the kernels lack, a backend not
installed); repetitions share a key; non-default warmup_correct options are part of the key; varlen keys.
"""

from __future__ import annotations

import pytest

from db.crud import POINT_FIELDS
from runners.grid import expand, point_key, skip_reason
from runners.point import PointSpec
from runners.spec import grid_size, load_spec, parse_spec
from tests.runners.engine_fixtures import DEMO_SPEC


def _params(**over: object) -> PointSpec:
    p = {"op": "gdn", "mode": "ring", "backend": "torch", "B": 1, "T": 256, "H": 4, "K": 32, "V": 32, "lb": -1.0,
         "W": 2, "layout": "contiguous", "direction": "fwd", "dtype": "float32", "seed": 0, "rep": 0}
    p.update(over)
    return PointSpec.from_json(p)


def test_expand_demo_deterministic() -> None:
    spec = load_spec(DEMO_SPEC)
    a, b = expand(spec), expand(load_spec(DEMO_SPEC))
    assert a == b
    assert len(a) == grid_size(spec) == 24
    assert [r["idx"] for r in a] == list(range(24))
    assert len({r["key"] for r in a}) == 24
    for r in a:
        assert set(POINT_FIELDS) <= set(r)
        assert r["key"] == point_key(PointSpec.from_json(r["params"]))
    skipped = [(r["op"], r["mode"], r["W"]) for r in a if r["status"] == "skipped"]
    assert sorted(skipped) == sorted((op, m, 2) for op in ("gdn", "kda") for m in ("none", "warmup_correct"))
    # the modes of one shape sit next to each other; W is outside mode
    assert [r["mode"] for r in a[:6]] == ["none", "all_gather", "true_cp", "ring", "headwise", "warmup_correct"]
    assert {r["W"] for r in a[:6]} == {1}


@pytest.mark.parametrize(
    ("over", "kwargs", "expected"),
    [
        pytest.param({"mode": "none", "W": 2}, {}, "mode 'none' runs on one device: needs W == 1, got W=2", id="none-W2"),
        pytest.param({"mode": "warmup_correct", "W": 4}, {}, "needs W == 1, got W=4", id="wc-W4"),
        pytest.param({"W": 4}, {"max_W": 2}, "W=4 is more than the 2 device(s) present", id="devices"),
        pytest.param({"mode": "headwise", "H": 3}, {}, "headwise needs H % W == 0 and HV % W == 0, got H=3, HV=3, W=2", id="headwise"),
        pytest.param({"T": 255}, {}, "needs B*T=255 divisible by 2", id="contiguous"),
        pytest.param({"T": 258, "layout": "zigzag"}, {}, "needs B*T=258 divisible by 4", id="zigzag"),
        pytest.param({"lengths": [100, 55], "T": 155}, {}, "needs lengths sum=155 divisible by 2", id="varlen"),
        pytest.param({"mode": "tail_exchange"}, {"modes": ("none", "ring")}, "mode 'tail_exchange' is not implemented", id="mode"),
        pytest.param({"backend": "fla"}, {"backends": ("torch",)}, "backend 'fla' is not available here", id="backend"),
    ],
)
def test_skip_reason(over: dict, kwargs: dict, expected: str) -> None:
    reason = skip_reason(_params(**over), **kwargs)
    assert reason is not None and expected in reason


def test_skip_reason_runnable() -> None:
    assert skip_reason(_params()) is None
    assert skip_reason(_params(mode="headwise", H=4, layout="zigzag", T=256), max_W=2) is None
    assert skip_reason(_params(mode="none", W=1, T=255)) is None  # one device: any length


def test_expand_repetitions_share_key() -> None:
    spec = parse_spec({"name": "r", "ops": "gdn", "modes": "none", "axes": {"T": 128}, "repetitions": 3, "seeds": [0, 1]})
    rows = expand(spec)
    assert len(rows) == 6
    assert [r["params"]["rep"] for r in rows] == [0, 1, 2, 0, 1, 2]
    assert len({r["key"] for r in rows}) == 2


def test_point_key_options_and_varlen() -> None:
    spec = parse_spec({"name": "o", "ops": "kda", "modes": ["warmup_correct", "true_cp"],
                       "axes": {"lengths": [[100, 156]], "W": 1}, "warmup_correct": {"tol": 0.01}})
    wc, tcp = expand(spec)
    assert wc["key"].endswith(",opts=tol=0.01") and "lengths=100-156" in wc["key"]
    assert wc["params"]["mode_options"]["tol"] == 0.01
    assert "opts" not in tcp["key"] and "mode_options" not in tcp["params"]
    assert wc["T"] == 256 and wc["B"] == 1
    default = expand(parse_spec({"name": "d", "ops": "kda", "modes": "warmup_correct", "axes": {"T": 256}}))[0]
    assert "opts" not in default["key"]


def test_point_key_names_a_long_length_list_by_its_digest() -> None:
    """A varlen list too long to write out (the key column holds 512 characters: PostgreSQL refused a 340,000-length
    list's 680 kB key) is named by its count, token total and digest: short keys, equal for equal lists, distinct for
    lists that differ anywhere; short lists keep the written-out form."""
    def key(lengths: list[int]) -> str:
        return expand(parse_spec({"name": "v", "ops": "gdn", "modes": "none", "axes": {"lengths": [lengths]}}))[0]["key"]

    long_a, long_b = [1] * 340_000, [1] * 339_999 + [2]
    ka, kb = key(long_a), key(long_b)
    assert len(ka) < 512 and len(kb) < 512, (len(ka), len(kb))
    assert ka == key(list(long_a)) and ka != kb
    assert "lengths=n340000:sum340000:sha256-" in ka and "lengths=n340000:sum340001:sha256-" in kb
    assert ",lengths=37-100-5," in key([37, 100, 5])  # written out, as before


def test_hv_axis_grouped_value_heads() -> None:
    # HV (default H): the key names HV only when it differs from H, so older keys never change; grouped points run
    # in every mode (headwise needs H % W and HV % W), and HV must be a multiple of H
    spec = parse_spec({"name": "hv", "ops": "gdn", "modes": ["none", "ring"],
                       "axes": {"T": 128, "H": [2, 4], "HV": [4, 6], "W": 1}})
    rows = expand(spec)
    assert len(rows) == grid_size(spec) == 8
    by = {(r["params"]["H"], r["params"]["HV"], r["mode"]): r for r in rows}
    assert ",H=2,HV=4,K=" in by[(2, 4, "none")]["key"] and by[(2, 4, "none")]["status"] == "queued"
    assert ",H=4,K=" in by[(4, 4, "none")]["key"] and "HV=" not in by[(4, 4, "none")]["key"]
    assert by[(4, 4, "ring")]["status"] == "queued"
    assert by[(2, 4, "ring")]["status"] == "queued"
    hw = expand(parse_spec({"name": "hw", "ops": "gdn", "modes": "headwise", "axes": {"T": 128, "H": 2, "HV": 4, "W": 4}}))
    assert "headwise needs H % W == 0 and HV % W == 0, got H=2, HV=4, W=4" in hw[0]["reason"]
    assert "HV % H == 0, got H=4, HV=6" in by[(4, 6, "none")]["reason"]
    plain = expand(parse_spec({"name": "p", "ops": "gdn", "modes": "none", "axes": {"T": 128, "H": 4}}))[0]
    assert "HV" not in plain["params"] and plain["key"] == by[(4, 4, "none")]["key"]


def test_gate_axes_real_model_call() -> None:
    # gate (lower_bound crossed for `safe` only) and l2norm_in_kernel (issue 25): the key and params name them only when
    # not their default, so a spec without them expands as before; a peer cannot take them (skipped at expansion)
    spec = parse_spec({"name": "g", "ops": "kda", "modes": "none", "backends": ["torch", "fla"],
                       "axes": {"T": 128, "H": 2, "gate": ["precomputed", "in_kernel", "safe"],
                                "lower_bound": [-5.0, -2.5], "l2norm_in_kernel": [False, True]}})
    rows = expand(spec)
    assert len(rows) == grid_size(spec) == 2 * (1 + 1 + 2) * 2
    torch_rows = [r for r in rows if r["backend"] == "torch"]
    calls = [(r["params"].get("gate"), r["params"].get("lower_bound"), r["params"].get("l2norm_in_kernel")) for r in torch_rows]
    assert calls == [(None, None, None), (None, None, True), ("in_kernel", None, None), ("in_kernel", None, True),
                     ("safe", None, None), ("safe", None, True), ("safe", -2.5, None), ("safe", -2.5, True)]
    assert all(r["status"] == "queued" for r in torch_rows)
    assert torch_rows[6]["key"].endswith(",seed=0,gate=safe,lower_bound=-2.5")
    plain = expand(parse_spec({"name": "p", "ops": "kda", "modes": "none", "axes": {"T": 128, "H": 2}}))[0]
    assert plain["key"] == torch_rows[0]["key"] and plain["params"] == torch_rows[0]["params"]
    fla = [r for r in rows if r["backend"] == "fla"]
    assert all("takes the stored inputs as they are" in r["reason"] for r in fla[1:])
    assert "takes the stored inputs" not in (fla[0]["reason"] or "")
