"""The topology record and its one label (`db.topology`), as the worker writes it and the model and figures read it.

Scenarios: a stored row's columns win over its params, a row without them ran on one host of W ranks; the label is
"<hosts>x<ranks per host> <interconnect>" (no interconnect when it is not known); ranks spread unequally keep their
shares and count every rank; nonsense shapes are refused with the values in the message; the columns and the
report's detail are what migration 0006's columns and the report hold.
"""

from __future__ import annotations

import pytest

from db.topology import Topology


def test_of_row_reads_the_columns_or_defaults_to_one_host() -> None:
    assert Topology.of_row({"W": 4}) == Topology(1, 4)
    assert Topology.of_row({"W": None}) == Topology(1, 1)
    assert Topology.of_row({"W": 8, "hosts": 2, "ranks_per_host": 4, "interconnect": "IB"}) == Topology(2, 4, "IB")
    assert Topology.of_row({"W": 8, "params": {"hosts": 4}}) == Topology(4, 2)
    assert Topology.of_row({"W": 4, "hosts": 2, "params": {"hosts": 4}}).hosts == 2  # the column wins


def test_the_one_label() -> None:
    assert Topology(2, 2, "loopback+tcp/lo").label == "2x2 loopback+tcp/lo"
    assert Topology(1, 4, "nvlink").label == "1x4 nvlink"
    assert Topology(2, 4).label == "2x4"


def test_unequal_shares_columns_and_detail() -> None:
    t = Topology.of_hosts([2, 1], ["h0", "h1"], "loopback+tcp")
    assert (t.hosts, t.ranks_per_host, t.W, t.host(2)) == (2, 2, 3, 1)
    assert t.columns() == {"hosts": 2, "ranks_per_host": 2, "interconnect": "loopback+tcp"}
    assert t.detail() == {**t.columns(), "ranks_by_host": [2, 1], "host_names": ["h0", "h1"]}
    assert Topology(2, 4).W == 8 and Topology(2, 4).ranks_by_host == (4, 4)


def test_bad_shapes_are_refused() -> None:
    with pytest.raises(ValueError, match="hosts=0, ranks_per_host=2"):
        Topology(0, 2)
    with pytest.raises(ValueError, match="at least one rank"):
        Topology.of_hosts([], [], "none")
    with pytest.raises(ValueError, match=r"ranks_by_host=\(3, 1\) does not match"):
        Topology(2, 2, None, (3, 1))
