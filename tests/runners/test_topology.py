"""The topology a measurement records (`runners.topology`): hosts, ranks per host and interconnect of a point's
ranks, from their places; the links between hosts from the environment the process groups see.

Scenarios: the first W ranks of a 2x2 gang (torchrun numbers ranks host by host) span one host up to W=2 and two
hosts at W=4; one rank has no link; unequal shares report the largest; a single-host gang is one host of W ranks;
gloo's network names its interface; NCCL's is what its log reports, else NCCL_NET, else InfiniBand only when not
disabled.
"""

from __future__ import annotations

import pytest

from runners.topology import RankPlace, inter_host_link, intra_host_link, nccl_network, single_host_topology, topology_of

GANG_2X2 = [RankPlace(node=r // 2, host=f"h{r // 2}", local_rank=r % 2, link="loopback") for r in range(4)]


def test_first_ranks_of_a_two_host_gang() -> None:
    got = {W: topology_of(GANG_2X2[:W], "tcp/lo") for W in (1, 2, 3, 4)}
    assert {W: (t.hosts, t.ranks_per_host, t.interconnect) for W, t in got.items()} == {
        1: (1, 1, "none"),
        2: (1, 2, "loopback"),
        3: (2, 2, "loopback+tcp/lo"),
        4: (2, 2, "loopback+tcp/lo"),
    }
    assert got[3].ranks_by_host == (2, 1) and got[4].label == "2x2 loopback+tcp/lo"
    assert got[4].detail() == {"hosts": 2, "ranks_per_host": 2, "interconnect": "loopback+tcp/lo", "ranks_by_host": [2, 2],
                               "host_names": ["h0", "h1"]}  # fmt: skip
    with pytest.raises(ValueError, match="at least one rank"):
        topology_of([], "tcp")


def test_a_single_host_gang_is_one_host_of_W_ranks() -> None:
    t = single_host_topology(4, "cpu")
    assert t.columns() == {"hosts": 1, "ranks_per_host": 4, "interconnect": "loopback"}
    assert single_host_topology(1, "cpu").interconnect == "none"
    assert intra_host_link("cpu") == "loopback"


def test_links_between_hosts(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GLOO_SOCKET_IFNAME", raising=False)
    assert inter_host_link("gloo") == "tcp"
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "eth0")
    assert inter_host_link("gloo") == "tcp/eth0"
    monkeypatch.setenv("NCCL_NET", "IB")
    assert inter_host_link("nccl") == "IB"
    log = "h:1:1 [0] NCCL INFO NET/Plugin: Could not find: libnccl-net.so\nh:1:1 [0] NCCL INFO Using network Socket\n"
    assert nccl_network(log) == "Socket" and inter_host_link("nccl", log) == "Socket"  # what NCCL reports comes first
    assert nccl_network("h:1:1 [0] NCCL INFO Bootstrap: Using eth0\n") is None
    monkeypatch.delenv("NCCL_NET")
    monkeypatch.setenv("NCCL_IB_DISABLE", "1")
    assert inter_host_link("nccl") == "Socket"
