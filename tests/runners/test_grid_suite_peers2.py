"""runners/suites/peers2-h200.yaml and peers2-inter-x2.yaml (issue 27's show): it expands, wherever it is expanded and without importing any
peer, into the points the issue asks for (GDN and KDA; ours, FLA's Triton path, FLA as dispatched, FlashQLA; `none` and
`warmup_correct`; fwd and fwd+bwd; T 8K and 64K; HV 16 and 32), FlashQLA's queued first, and every point a backend
cannot run stored as skipped with that backend's reason. No point runs here.
"""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

from runners.grid import expand
from runners.spec import load_spec, load_specs

SUITES = Path(__file__).resolve().parents[2] / "runners" / "suites"
SUITE, INTER = SUITES / "peers2-h200.yaml", SUITES / "peers2-inter-x2.yaml"


def test_the_show_expands_into_the_asked_points_with_reasons() -> None:
    rows = expand(load_spec(SUITE))
    assert {(r["op"], r["mode"], r["direction"], r["T"], r["params"].get("HV", r["H"])) for r in rows} == {
        (op, mode, d, T, HV)
        for op in ("gdn", "kda")
        for mode in ("none", "warmup_correct")
        for d in ("fwd", "fwd+bwd")
        for T in (8192, 65536)
        for HV in (16, 32)
    }
    queued = Counter((r["backend"], r["op"]) for r in rows if r["status"] == "queued")
    assert queued == {
        ("flash_qla", "gdn"): 16,
        ("fla_dispatch", "gdn"): 8,
        ("fla_dispatch", "kda"): 8,
        ("triton", "gdn"): 16,
        ("triton", "kda"): 16,
        ("fla", "gdn"): 12,
        ("fla", "kda"): 12,
    }
    assert rows[0]["backend"] == "flash_qla" and all(r["status"] == "queued" for r in rows[:16])
    reasons: dict[tuple[str, ...], str] = {}  # backend, op, mode, direction -> every reason given, joined
    for r in rows:
        if r["status"] == "skipped":
            key = (r["backend"], r["op"], r["mode"], r["direction"])
            reasons[key] = reasons.get(key, "") + " | " + r["reason"]
    assert "FlashQLA implements GDN only" in reasons[("flash_qla", "kda", "none", "fwd")]
    assert "FLA's intra-card CP runs only under torch.inference_mode" in reasons[("fla", "gdn", "warmup_correct", "fwd+bwd")]
    assert "use `backend: flash_qla` for FlashQLA's modes" in reasons[("fla_dispatch", "gdn", "warmup_correct", "fwd")]
    assert "FlashKDA is inference only" in reasons[("flash_kda", "kda", "none", "fwd+bwd")]
    assert "computes the safe gate" in reasons[("flash_kda", "kda", "none", "fwd")]  # HV 16
    assert "does not support grouped value heads (HV=32 != H=16)" in reasons[("flash_kda", "kda", "none", "fwd")]
    assert {r["backend"] for r in rows if r["status"] == "skipped"} == {"flash_qla", "fla_dispatch", "fla", "flash_kda"}
    assert "flash_qla" not in sys.modules and "flash_kda" not in sys.modules


def test_the_inter_card_part_waits_for_two_gpus() -> None:
    """FlashQLA's inter-card CP (and its dual CP) at W=2: skipped with the reason on one GPU, queued where two are."""
    plain, dual = load_specs(INTER)
    for spec, n in ((plain, 24), (dual, 8)):
        one = expand(spec, max_W=1)
        assert len(one) == n and all("W=2 is more than the 1 device(s) present" in r["reason"] for r in one)
        assert all(r["status"] == "queued" for r in expand(spec, max_W=2))
    keys = [r["key"] for r in expand(dual, max_W=2)]
    assert all(k.startswith("gdn/true_cp/flash_qla/") and k.endswith(",opts=flash_qla.dual=True") for k in keys)


def test_part_two_is_the_rest_of_the_grid_in_priority_order() -> None:
    """runners/suites/peers2-h200-part2.yaml: with the mini sweep sessions 9-10 ran, every point of the full grid
    (same keys, same status and reason per key), none twice, less only a backend's points on the op it lacks
    (FlashQLA's KDA, FlashKDA's GDN: skipped either way); its four sweeps queue KDA HV=16 first, then GDN HV=32, GDN
    on FLA's Triton path, KDA HV=32, and a worker claims queued points in that order (by point id)."""
    full = {r["key"]: r for r in expand(load_spec(SUITE))}
    mini = expand(load_spec(Path(__file__).resolve().parents[2] / "benchmarks/results/peers2_h200/peers2_mini_h200.yaml"))
    docs = load_specs(SUITES / "peers2-h200-part2.yaml")
    parts = [expand(spec) for spec in docs]
    rows = [r for part in parts for r in part]
    keys = [r["key"] for r in [*mini, *rows]]
    assert len(keys) == len(set(keys)) and set(keys) <= set(full)
    left = [full[k] for k in set(full) - set(keys)]
    assert {(r["backend"], r["op"]) for r in left} == {("flash_qla", "kda"), ("flash_kda", "gdn")}
    assert all(r["status"] == "skipped" for r in left)
    assert all((r["status"], r["reason"]) == (full[r["key"]]["status"], full[r["key"]]["reason"]) for r in rows)
    assert [len(p) for p in parts] == [32, 24, 16, 32]
    queued = [r for r in rows if r["status"] == "queued"]
    assert [sum(r["status"] == "queued" for r in p) for p in parts] == [18, 20, 12, 18] and len(queued) == 68

    def group(r: dict) -> str:
        hv = r["params"].get("HV", r["H"])
        if r["op"] == "kda":
            return f"kda-hv{hv}"
        return "gdn-fla" if r["backend"] == "fla" else f"gdn-hv{hv}"

    order = [group(r) for r in queued]
    assert sorted(set(order), key=order.index) == ["kda-hv16", "gdn-hv32", "gdn-fla", "kda-hv32"]
    assert order == sorted(order, key=["kda-hv16", "gdn-hv32", "gdn-fla", "kda-hv32"].index)  # no group interleaves
    assert {r["backend"] for r in queued if group(r) == "kda-hv16"} == {"triton", "fla_dispatch", "fla"}
    assert {r["backend"] for r in queued if group(r) == "gdn-hv32"} == {"flash_qla", "fla_dispatch", "triton"}


def test_part_three_is_what_part_two_left() -> None:
    """runners/suites/peers2-h200-part3.yaml: the points of part 2 its committed rows (session 12,
    peers2_part2_h200.csv) do not hold as measured, same keys, status and reason, in part 2's priority order; with
    those rows, part 2 point for point."""
    import csv

    results = Path(__file__).resolve().parents[2] / "benchmarks/results/peers2_h200"
    part2 = {r["key"]: r for spec in load_specs(SUITES / "peers2-h200-part2.yaml") for r in expand(spec)}
    part3 = [r for spec in load_specs(SUITES / "peers2-h200-part3.yaml") for r in expand(spec)]
    keys3 = [r["key"] for r in part3]
    assert len(keys3) == len(set(keys3)) and set(keys3) <= set(part2)
    with open(results / "peers2_part2_h200.csv", newline="") as f:
        done = {r["key"] for r in csv.DictReader(f) if r["status"] == "done"}
    assert set(part2) - set(keys3) >= done and len(done) == 10
    left = [part2[k] for k in set(part2) - set(keys3) - done]  # skipped there too, and their reasons kept
    assert left and all(r["status"] == "skipped" for r in left)
    assert all((r["status"], r["reason"]) == (part2[r["key"]]["status"], part2[r["key"]]["reason"]) for r in part3)
    queued = [r for r in part3 if r["status"] == "queued"]
    assert len(queued) == 58 and not done & set(keys3)
    order = ["kda-16", "gdn-32", "gdn-fla", "kda-32"]  # part 2's priorities, in claim order

    def group(r: dict) -> str:
        hv = r["params"].get("HV", r["H"])
        return "gdn-fla" if (r["op"], r["backend"]) == ("gdn", "fla") else f"{r['op']}-{hv}"

    seen = [group(r) for r in queued]
    assert sorted(seen, key=order.index) == seen
