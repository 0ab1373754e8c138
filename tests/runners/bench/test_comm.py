"""`cpbench bench comm`: the links measured on a real gloo gang, in the JSON the scaling model reads.

Scenarios: the sizes it times are the payloads `dashboards.cost_model.comm_cost` counts for every scheme (W=4, gdn
and kda, bf16 and fp32); the line fit recovers alpha and beta of exact samples and keeps both >= 0 on noise; a real
run of 4 gloo ranks as 2 pretend hosts of 2 (`--ranks-per-host 2`, loopback) times send/recv to a rank on its host
and to one on the other, every group collective, prints one progress line per size, fits both link classes, and
writes a JSON that `CommParams.from_json` reads as measured, with the group collectives held against the model
(`comm_check`); under torchrun (two "hosts" of 2 ranks, c10d rendezvous on loopback) the topology comes from
torchrun's environment; bad arguments give a one-line error.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from dashboards.cost_model import comm_cost
from dashboards.links import CommParams, comm_check
from runners.bench import comm

SCHEMES = ("headwise", "all_gather", "ring", "true_cp", "tail_exchange")
SMALL = [
    "--cpu",
    "--T",
    "2048",
    "--H",
    "2",
    "--K",
    "16",
    "--V",
    "16",
    "--dtype",
    "float32",
    "--warmup",
    "1",
]  # a small shape on gloo


@pytest.mark.parametrize(("op", "dtype_bytes"), [("gdn", 2), ("kda", 4)])
def test_scheme_sizes_are_the_cost_models_payloads(op: str, dtype_bytes: int) -> None:
    shape = {"T": 8192, "H": 4, "K": 32, "V": 16, "W": 4}
    sizes = comm.scheme_sizes(op=op, dtype_bytes=dtype_bytes, **shape)
    want: dict[str, set[int]] = {}
    for mode in SCHEMES:
        for direction in ("fwd", "bwd"):
            cost = comm_cost(mode, B=1, dtype_bytes=dtype_bytes, op=op, direction=direction, warmup_chunks=2, **shape)
            assert cost is not None
            for kind, payload in cost.payload_bytes.items():
                if kind == "all_to_all":  # headwise's inputs, then its outputs: the model sums the two calls
                    assert sum(sizes["all_to_all"]) == payload and len(sizes["all_to_all"]) == 2
                elif kind != "recv":
                    want.setdefault(kind, set()).add(payload // cost.collectives[kind])
    assert {k: set(v) for k, v in sizes.items() if k != "all_to_all"} == want


def test_fit_link_recovers_alpha_and_beta() -> None:
    exact = [(b, 5e-6 + b * 2e-10) for b in (1024, 16384, 1 << 20)]
    fit = comm.fit_link(exact)
    assert fit is not None
    assert fit["alpha_s"] == pytest.approx(5e-6) and fit["beta_s_per_byte"] == pytest.approx(2e-10)
    noisy = comm.fit_link([(1024, 3e-4), (2048, 1e-4), (4096, 1e-4)])  # a falling line: negative beta
    assert noisy is not None and noisy["alpha_s"] >= 0 and noisy["beta_s_per_byte"] >= 0
    assert comm.fit_link([(1024, 1e-5)]) is None


@pytest.mark.multiproc
def test_bench_comm_on_two_pretend_hosts(tmp_path: Path, capfd: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "comm.json"
    rc = comm.main([*SMALL, "--world", "4", "--ranks-per-host", "2", "--iters", "3", "--out", str(out)])
    assert rc == 0
    doc = json.loads(out.read_text())
    assert doc["topology"] == {"hosts": 2, "ranks_per_host": 2, "W": 4, "interconnect": "loopback+tcp/lo"}
    assert doc["measured"] == ["inter", "intra"]
    sizes = comm.scheme_sizes(op="gdn", T=2048, H=2, K=16, V=16, W=4, dtype_bytes=4)
    sends = {(s["link"], s["peer"], s["bytes"]) for s in doc["samples"] if s["kind"] == "send"}
    assert sends == {
        (link, peer, b) for link, peer in (("intra", 1), ("inter", 2)) for b in {*comm.LATENCY_SIZES, *sizes["send"]}
    }
    groups = sorted((s["kind"], s["bytes"]) for s in doc["samples"] if s["kind"] != "send")
    assert groups == sorted((k, b) for k in ("all_gather", "all_to_all", "reduce_scatter") for b in sizes[k])
    assert all(s["seconds"] > 0 for s in doc["samples"])
    params = CommParams.from_json(doc)
    assert params.measured == ("inter", "intra") and params.intra.alpha_s == doc["links"]["intra"]["alpha_s"]
    check = comm_check(doc)
    assert len(check) == len(groups) and all(c["predicted_ms"] > 0 for c in check)
    err = capfd.readouterr().err  # the ranks' progress lines: file-descriptor capture sees the spawned processes
    assert f"[{len(doc['samples'])}/{len(doc['samples'])}]" in err and "to rank 2 (inter)" in err


def test_bench_comm_bad_arguments_say_why(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit, match="does not divide"):
        comm.main(["--cpu", "--world", "4", "--ranks-per-host", "3"])
    with pytest.raises(SystemExit):
        comm.main(["--cpu", "--world", "0"])
    assert "--world must be >= 1" in capsys.readouterr().err


@pytest.mark.multiproc
def test_bench_comm_under_torchrun_on_two_hosts(tmp_path: Path) -> None:
    """Two torchrun "hosts" of 2 ranks on loopback (c10d rendezvous): the topology comes from torchrun's
    environment (WORLD_SIZE / LOCAL_WORLD_SIZE) and rank 0 writes the JSON."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = tmp_path / "comm.json"
    rdzv = ["--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}"]
    run = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "2", *rdzv]
    cmd = [*run, "-m", "runners.bench.comm", *SMALL, "--iters", "2", "--out", str(out)]
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[3]), "GLOO_SOCKET_IFNAME": "lo"}
    hosts = [subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for _ in range(2)]
    logs = [h.communicate(timeout=300)[0] for h in hosts]
    assert [h.returncode for h in hosts] == [0, 0], logs
    doc = json.loads(out.read_text())
    assert doc["topology"] == {"hosts": 2, "ranks_per_host": 2, "W": 4, "interconnect": "loopback+tcp/lo"}
    assert doc["measured"] == ["inter", "intra"] and "W=4 = 2x2 loopback+tcp/lo" in doc["source"]
