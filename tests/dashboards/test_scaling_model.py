"""The scaling model (`dashboards.scaling_model`, its links `dashboards.links`) against hand-computed cases and the stored CPU measurements.

Scenarios: the link load of each collective splits its bytes between the links by the share of peers on other
hosts (hand-computed for 2 hosts x 4 ranks); every scheme's predicted time at W=4 on 2 hosts x 2 ranks equals the
sum worked out by hand (compute on the critical path + each collective on its link); the training step doubles the
chain's hand-offs; the collective bytes the model counts equal, kind by kind and to the byte, those the profiler
stored for every W=1/4/8 CPU measurement of benchmarks/results/cp_w48_cpu.csv; kernel rates are the line through
the W=1 `none` points; a `cpbench bench comm` JSON that measured one
link class keeps the assumed other; a bad file falls back with its reason; the best scheme of each (T, W, hosts)
cell is the fastest prediction, cells respect the hosts and ranks-per-host limits, and headwise is left out where
H % W != 0. (The W=2/4 runs of a real gloo sweep: tests/bench_server/test_scaling_e2e.py.)
"""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

import pytest

from dashboards.cost_model import comm_cost
from dashboards.links import DEFAULT_PARAMS, CommParams, Link, link_load, load_params
from dashboards.scaling_model import KernelRate, best_schemes, fit_rates, held_against, predict
from db.topology import Topology

ROOT = Path(__file__).resolve().parents[2]
RATE = KernelRate(fixed_s=1e-4, per_token_head_s=1e-8)
PARAMS = CommParams(intra=Link(1e-5, 1e-9), inter=Link(1e-4, 1e-8), source="test")
SHAPE: dict[str, Any] = {"B": 1, "T": 4096, "H": 2, "K": 16, "V": 16, "dtype_bytes": 4, "rate": RATE, "params": PARAMS}


def stored_rows(name: str) -> list[dict[str, Any]]:
    """The rows of a `cpbench results --format csv` file in benchmarks/results, typed as the API gives them."""
    out = []
    with open(ROOT / "benchmarks" / "results" / name) as f:
        for r in csv.DictReader(f):
            row: dict[str, Any] = dict(r)
            for k in ("point_id", "B", "T", "H", "K", "V", "W"):
                row[k] = int(r[k])
            row["id"] = row["point_id"]
            row["median_ms"] = float(r["median_ms"]) if r["median_ms"] else None
            for k in ("params", "collectives", "collective_bytes"):
                row[k] = json.loads(r[k]) if r[k] else None
            out.append(row)
    return out


def test_link_load_splits_bytes_by_the_peers_on_other_hosts() -> None:
    topo = Topology(hosts=2, ranks_per_host=4)  # W = 8: a rank has 3 peers on its host, 4 on the other
    ag = link_load("all_gather", 1000, topo)
    assert ag.messages == {"inter": 7.0}  # 7 ring steps, each as slow as the host-crossing link
    assert ag.nbytes == pytest.approx({"intra": 3000, "inter": 4000})  # 7 blocks received: 3 from its host
    a2a = link_load("all_to_all", 8000, topo, calls=2)
    assert a2a.messages == {"intra": 2.0, "inter": 2.0}
    assert a2a.nbytes == pytest.approx({"intra": 3000, "inter": 4000})  # 7/8 of the buffer leaves the rank
    assert link_load("reduce_scatter", 8000, topo).nbytes == pytest.approx({"intra": 3000, "inter": 4000})
    one_host = link_load("all_gather", 1000, Topology(1, 8))
    assert one_host.messages == {"intra": 7.0} and one_host.nbytes == pytest.approx({"intra": 7000, "inter": 0})
    assert link_load("all_gather", 1000, Topology(1, 1)).time(PARAMS) == 0
    assert ag.time(PARAMS) == pytest.approx(7 * 1e-4 + 3000 * 1e-9 + 4000 * 1e-8)
    with pytest.raises(ValueError, match="kind="):
        link_load("broadcast", 1, topo)


# hand-computed: gdn, B=1, T=4096, H=2, K=V=16, fp32, W=4 = 2 hosts x 2 ranks; rate 100 us per call + 10 ns per
# token-head; intra 10 us + 1 ns/B, inter 100 us + 10 ns/B
HAND = {
    # the chain runs every token serially over 4 calls; 3 states of 2*16*16*4 = 2048 B: hops 0->1, 2->3 intra, 1->2 inter
    "ring": (4 * 1e-4 + 1e-8 * 4096 * 2, 2 * (1e-5 + 2048e-9) + (1e-4 + 2048e-8)),
    # a transition (0.5 of a forward) plus the forward on a quarter, 2 calls; one ring all-gather of the
    # 2*16*32*4 = 4096 B summary: 3 steps at the inter latency, 1 block from the host, 2 from the other
    "true_cp": (2 * 1e-4 + 1e-8 * 1024 * 2 * 1.5, 3 * 1e-4 + 4096e-9 + 2 * 4096e-8),
    # a quarter of the heads over the whole sequence; 2 all-to-alls of 1024 tokens x (400 in + 128 out) B: 3/4 leaves,
    # a third of that to the host's other rank
    "headwise": (1e-4 + 1e-8 * 4096 * 2 / 4, 2 * 1e-5 + 2 * 1e-4 + 135168e-9 + 270336e-8),
    # the whole sequence on every rank; all-gather of the 1024 x 400 B local inputs
    "all_gather": (1e-4 + 1e-8 * 4096 * 2, 3 * 1e-4 + 409600e-9 + 2 * 409600e-8),
    # a quarter plus a 128-token warmup at 0.5; one 128-token window of k, v, beta, g (2*136 B a token) on the
    # critical path, on the slowest hop (inter)
    "tail_exchange": (2 * 1e-4 + 1e-8 * 2 * (1024 + 0.5 * 128), 1e-4 + 128 * 2 * 136 * 1e-8),
}


@pytest.mark.parametrize("mode", list(HAND))
def test_predict_matches_hand_computed_times(mode: str) -> None:
    p = predict(mode, topo=Topology(2, 2), **SHAPE)
    assert p is not None
    compute, comm = HAND[mode]
    assert (p.compute_s, p.comm_s, p.total_s) == pytest.approx((compute, comm, compute + comm), rel=1e-12)


def test_predict_training_step_and_what_is_not_modelled() -> None:
    fwd = predict("ring", topo=Topology(2, 2), **SHAPE)
    both = predict("ring", topo=Topology(2, 2), direction="fwd+bwd", **SHAPE)
    assert fwd is not None and both is not None
    assert both.comm_s == pytest.approx(2 * fwd.comm_s)  # the backward hands the gradients back along the chain
    one = predict("none", topo=Topology(1, 1), **SHAPE)
    assert one is not None and one.comm_s == 0 and one.compute_s == pytest.approx(1e-4 + 1e-8 * 4096 * 2)
    assert predict("warmup_correct", topo=Topology(1, 1), **SHAPE) is None
    assert predict("none", topo=Topology(1, 2), **SHAPE) is None
    # ranks sharing 2 devices (CPU cores) on a host of 4: compute twice as long
    shared = predict("true_cp", topo=Topology(1, 4), devices_per_host=2, **SHAPE)
    alone = predict("true_cp", topo=Topology(1, 4), **SHAPE)
    assert shared is not None and alone is not None and shared.compute_s == pytest.approx(2 * alone.compute_s)
    chain = predict("ring", topo=Topology(1, 4), devices_per_host=2, **SHAPE)  # one rank of the chain busy at a time
    assert chain == predict("ring", topo=Topology(1, 4), **SHAPE)


def test_model_bytes_equal_the_stored_cpu_measurements_exactly() -> None:
    rows = [r for r in stored_rows("cp_w48_cpu.csv") if r["status"] == "done"]
    assert {r["W"] for r in rows} == {1, 4, 8} and len(rows) == 104
    for r in rows:
        cost = comm_cost(
            r["mode"],
            B=r["B"],
            T=r["T"],
            H=r["H"],
            K=r["K"],
            V=r["V"],
            W=r["W"],
            dtype_bytes=4,
            op=r["op"],
            layout=r["layout"],
        )
        assert cost is not None
        assert cost.payload_bytes == r["collective_bytes"], (r["id"], r["mode"], r["W"], r["layout"])
        assert cost.collectives == r["collectives"], (r["id"], r["mode"], r["W"], r["layout"])


def test_held_against_predicts_every_stored_cpu_point() -> None:
    rows = stored_rows("cp_w48_cpu.csv")
    table = held_against(rows)
    done = [r for r in rows if r["status"] == "done"]
    assert len(table) == len(done) and all(t["predicted_ms"] is not None for t in table)
    for t in table:
        assert t["error"] == pytest.approx(t["predicted_ms"] / t["median_ms"] - 1)
        assert t["predicted_ms"] == pytest.approx(t["compute_ms"] + t["comm_ms"])
        assert (t["hosts"], t["ranks_per_host"]) == (1, t["W"])


def test_fit_rates_is_the_line_through_the_w1_none_points() -> None:
    base = {
        "mode": "none",
        "op": "gdn",
        "backend": "torch",
        "dtype": "float32",
        "H": 4,
        "K": 16,
        "V": 16,
        "B": 1,
        "W": 1,
        "direction": "fwd",
        "status": "done",
    }
    rows = [
        {**base, "T": 1000, "median_ms": 3.0},
        {**base, "T": 3000, "median_ms": 7.0},
        {**base, "T": 3000, "mode": "ring", "median_ms": 99.0},
        {**base, "T": 3000, "W": 2, "median_ms": 99.0},
    ]
    ((fam, rate),) = fit_rates(rows).items()
    assert fam == ("gdn", "torch", "float32", 4, 16, 16, "fwd")
    assert rate.fixed_s == pytest.approx(1e-3) and rate.per_token_head_s == pytest.approx(2e-3 / 1000 / 4)
    ((_, single),) = fit_rates(rows[1:2]).items()  # one length: through the origin
    assert (single.fixed_s, single.per_token_head_s) == (0.0, pytest.approx(7e-3 / 12000))


def test_comm_params_json_and_its_fallbacks(tmp_path: Path) -> None:
    doc = {"links": {"intra": {"alpha_s": 2e-6, "beta_s_per_byte": 1e-10}}, "measured": ["intra"], "source": "run 1"}
    params = CommParams.from_json(doc)
    assert params.intra == Link(2e-6, 1e-10) and params.inter == DEFAULT_PARAMS.inter and params.measured == ("intra",)
    assert [d["from"] for d in params.describe()] == ["run 1", "assumed (DEFAULT_PARAMS)"]
    good = tmp_path / "comm.json"
    good.write_text(json.dumps(doc))
    assert load_params(str(good))[0] == params
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    fallback, _, why = load_params(str(bad))
    assert fallback == DEFAULT_PARAMS and why is not None and "bad.json unusable (JSONDecodeError" in why
    assert load_params(str(tmp_path / "missing.json"))[2] is not None


def test_best_schemes_pick_the_fastest_prediction_per_cell() -> None:
    cells = best_schemes(
        Ts=[4096, 1 << 20],
        Ws=[1, 2, 4, 8, 16],
        hosts=[1, 2, 4],
        rate=RATE,
        params=PARAMS,
        H=4,
        K=16,
        V=16,
        dtype_bytes=4,
        max_ranks_per_host=4,
    )
    got = {(c["T"], c["W"], c["hosts"]) for c in cells}
    # W a multiple of hosts, at most 4 ranks on a host
    assert got == {
        (T, W, h)
        for T in (4096, 1 << 20)
        for W, h in ((1, 1), (2, 1), (4, 1), (2, 2), (4, 2), (8, 2), (4, 4), (8, 4), (16, 4))
    }
    for c in cells:
        assert c["best"] == min(c["ms"], key=c["ms"].get) and c["best_ms"] == min(c["ms"].values())
        assert ("headwise" in c["ms"]) == (4 % c["W"] == 0)
        topo = Topology(c["hosts"], c["ranks_per_host"])
        p = predict("true_cp", B=1, T=c["T"], H=4, K=16, V=16, topo=topo, rate=RATE, params=PARAMS, dtype_bytes=4)
        assert p is not None and c["ms"]["true_cp"] == pytest.approx(p.total_ms)
    assert {c["best"] for c in cells if c["W"] == 1} == {"none"}
