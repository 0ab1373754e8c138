"""WHERE A POINT'S RANKS RAN: the places of a gang's ranks and the links between them, made into the measurement's
`db.topology.Topology` (the one record and label, stored on every measurement: `db.models.Measurement.hosts`,
`ranks_per_host`, `interconnect`, and the details in its report's `topology`).

- `RankPlace`: where one rank of a gang runs: its node (torchrun's GROUP_RANK, the host's index in the allocation;
  two "hosts" on one machine are two nodes), the host name, its local rank and its host's `intra_host_link`;
- `topology_of(places, inter)`: the topology of a point's ranks (the gang's first W places);
  `single_host_topology(W, device_kind)`: a single-host gang's (the ordinary worker's);
- `intra_host_link(device_kind)`: the link between ranks of one host: "nvlink" (NVML reports an active NVLink on
  GPU 0), "pcie" (GPUs without one), "loopback" (gloo ranks on one machine talk TCP over the loopback);
- `inter_host_link(backend, nccl_log)`: the network between hosts: gloo's is "tcp" (with "/<GLOO_SOCKET_IFNAME>"
  when set); NCCL's is the network NCCL reports in its INFO log ("Using network IB": `nccl_network`; the multi-host
  worker captures it when NCCL_DEBUG is not set), else `NCCL_NET` when set (as NCCL names it: "IB", "Socket", a
  plugin's name), else "IB" when the host has InfiniBand devices and `NCCL_IB_DISABLE` is not 1, else "Socket".

`interconnect` is "none" for one rank, the intra-host link on one host, "<intra>+<inter>" across hosts (e.g.
"nvlink+IB", "loopback+tcp/lo"; `db.topology`).
"""

from __future__ import annotations

import functools
import os
import re
import socket
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from db.topology import NO_LINK, Topology

__all__ = ["RankPlace", "inter_host_link", "intra_host_link", "nccl_network", "single_host_topology", "topology_of"]


@dataclass(frozen=True)
class RankPlace:
    """Where one rank runs: its node's index, the host name, its local rank, its host's intra-host link."""

    node: int
    host: str
    local_rank: int
    link: str


def topology_of(places: Sequence[RankPlace], inter: str) -> Topology:
    """The topology of ranks at `places` (a point's ranks), `inter` the network between their hosts."""
    per_node = Counter(p.node for p in places)
    nodes = sorted(per_node)
    names = {p.node: p.host for p in places}
    if len(places) == 1:
        link = NO_LINK
    else:
        intra = "/".join(sorted({p.link for p in places}))  # one link unless hosts differ
        link = intra if len(nodes) == 1 else f"{intra}+{inter}"
    return Topology.of_hosts([per_node[n] for n in nodes], [names[n] for n in nodes], link)


def single_host_topology(world_size: int, device_kind: str) -> Topology:
    """A gang of `world_size` ranks on this host."""
    host, link = socket.gethostname(), intra_host_link(device_kind)
    return topology_of([RankPlace(0, host, r, link) for r in range(world_size)], NO_LINK)


@functools.lru_cache(maxsize=2)
def intra_host_link(device_kind: str) -> str:
    """The link between ranks on this host (see the module docstring)."""
    if device_kind != "cuda":
        return "loopback"
    return "nvlink" if _nvlink_active() else "pcie"


def _nvlink_active() -> bool:
    try:
        import pynvml  # type: ignore[import-not-found]

        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        for link in range(int(getattr(pynvml, "NVML_NVLINK_MAX_LINKS", 18))):
            try:
                if pynvml.nvmlDeviceGetNvLinkState(handle, link) == pynvml.NVML_FEATURE_ENABLED:
                    return True
            except pynvml.NVMLError:
                continue
    except Exception:  # noqa: BLE001 - no NVML, no GPU: no NVLink known
        return False
    return False


def nccl_network(log_text: str) -> str | None:
    """The network NCCL says it uses in its INFO log ("IB", "Socket", a plugin's name); None when it does not say."""
    found = _NCCL_NETWORK.search(log_text)
    return found.group(1) if found else None


_NCCL_NETWORK = re.compile(r"NCCL INFO Using network (\S+)")


def inter_host_link(backend: str, nccl_log: str = "") -> str:
    """The network between hosts of a `backend` ("gloo" | "nccl") process group (see the module docstring);
    `nccl_log`: NCCL's INFO log of this process, when captured."""
    if backend == "gloo":
        iface = os.environ.get("GLOO_SOCKET_IFNAME", "").strip()
        return f"tcp/{iface}" if iface else "tcp"
    net = nccl_network(nccl_log) or os.environ.get("NCCL_NET", "").strip()
    if net:
        return net
    ib = Path("/sys/class/infiniband")
    if os.environ.get("NCCL_IB_DISABLE", "0").strip() != "1" and ib.is_dir() and any(ib.iterdir()):
        return "IB"
    return "Socket"
