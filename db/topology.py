"""THE TOPOLOGY OF A MEASUREMENT, the one record and the one label (no torch, no store access): how many hosts a
point's ranks spanned, how many ranks ran on each and the links between them.

The worker writes it (`runners.topology` places a gang's ranks and names the links: `topology_of`), the store keeps
its columns (`db.models.Measurement.hosts`, `ranks_per_host`, `interconnect`, migration 0006; the details in the
report's `topology`), the scaling model (`dashboards.links`, `dashboards.scaling_model`) and the figures read it
back (`Topology.of_row`: THE one reading of those fields).

`interconnect` is "none" for one rank, the intra-host link on one host ("loopback", "nvlink", "pcie"),
"<intra>+<inter>" across hosts ("nvlink+IB", "loopback+tcp/lo"); None when not recorded (older GPU rows).
`Topology.label` is how every page, figure and report names a topology: "<hosts>x<ranks per host> <interconnect>"
("2x2 loopback+tcp/lo", "1x4 nvlink"; "2x4" when the interconnect is not known).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = ["NO_LINK", "Topology"]

NO_LINK = "none"  # the interconnect of a one-rank point


@dataclass(frozen=True)
class Topology:
    """`hosts` hosts of at most `ranks_per_host` ranks (host-major: rank r on host r // ranks_per_host), joined by
    `interconnect`; `ranks_by_host` the ranks on each host in host order (default: `ranks_per_host` on every host),
    `host_names` their names when known (the report's detail; not part of equality)."""

    hosts: int
    ranks_per_host: int
    interconnect: str | None = None
    ranks_by_host: tuple[int, ...] = ()
    host_names: tuple[str, ...] = field(default=(), compare=False)

    def __post_init__(self) -> None:
        if self.hosts < 1 or self.ranks_per_host < 1:
            raise ValueError(
                f"hosts and ranks_per_host must be >= 1, got hosts={self.hosts}, ranks_per_host={self.ranks_per_host}"
            )
        if not self.ranks_by_host:
            object.__setattr__(self, "ranks_by_host", (self.ranks_per_host,) * self.hosts)
        if len(self.ranks_by_host) != self.hosts or max(self.ranks_by_host) != self.ranks_per_host:
            raise ValueError(
                f"ranks_by_host={self.ranks_by_host} does not match hosts={self.hosts}, ranks_per_host={self.ranks_per_host}"
            )

    @property
    def W(self) -> int:
        """The number of ranks."""
        return sum(self.ranks_by_host)

    def host(self, rank: int) -> int:
        return rank // self.ranks_per_host

    @property
    def label(self) -> str:
        """THE name of a topology: "2x2 loopback+tcp/lo" (hosts x ranks per host, then the interconnect if known)."""
        net = f" {self.interconnect}" if self.interconnect else ""
        return f"{self.hosts}x{self.ranks_per_host}{net}"

    def columns(self) -> dict[str, Any]:
        """The measurement's topology columns (`db.crud.store_measurement`'s fields)."""
        return {"hosts": self.hosts, "ranks_per_host": self.ranks_per_host, "interconnect": self.interconnect}

    def detail(self) -> dict[str, Any]:
        """What the measurement's report keeps under `topology`: the columns, the ranks per host, the host names."""
        return {**self.columns(), "ranks_by_host": list(self.ranks_by_host), "host_names": list(self.host_names)}

    @classmethod
    def of_hosts(cls, ranks_by_host: Sequence[int], host_names: Sequence[str], interconnect: str) -> Topology:
        """The topology of `ranks_by_host[i]` ranks on host `host_names[i]`, in host order."""
        if not ranks_by_host:
            raise ValueError("a topology needs at least one rank")
        return cls(len(ranks_by_host), max(ranks_by_host), interconnect, tuple(ranks_by_host), tuple(host_names))

    @classmethod
    def of_row(cls, row: Mapping[str, Any]) -> Topology:
        """The topology a stored measurement ran on: its `hosts`, `ranks_per_host`, `interconnect` (the row's
        columns, else its params); a row without them ran on one host: hosts=1, ranks_per_host=W."""
        params = row.get("params") or {}

        def get(key: str) -> Any:
            value = row.get(key)
            return params.get(key) if value is None else value

        W = int(row.get("W") or 1)
        hosts = int(get("hosts") or 1)
        rph = int(get("ranks_per_host") or max(1, W // hosts))
        return cls(hosts, rph, get("interconnect"))
