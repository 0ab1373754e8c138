"""The links of the scaling model (`dashboards.scaling_model`): an alpha-beta model per link class, `intra` (within
a host) and `inter` (between hosts), where a gang's ranks sit, and what each collective puts on each link (pure
arithmetic, no torch).

`Link.time(messages, bytes) = messages alpha + bytes beta`. Ranks sit on hosts host-major (rank r on host
r // ranks_per_host); traffic to a rank on another host pays the `inter` link, the rest `intra` (`link_load`):

| kind | latency terms | bytes received by a rank |
|---|---|---|
| all_gather (ring) | W-1 steps, each at the slowest link the ring uses (inter when hosts > 1) | (W-1) x block: (rph-1) blocks intra, (W-rph) inter |
| reduce_scatter (ring) | as all_gather | (W-1)/W of the buffer, split as all_gather |
| all_to_all | one per link class the rank talks over (the sends are concurrent) | (W-1)/W of the buffer: (rph-1)/W intra, (W-rph)/W inter |
| send/recv (`p2p_load`) | ring: every hand-off of the chain, in order; tail_exchange: one (all posted at once) | each message on its hop's link |

`CommParams` holds the two links and where they came from (`cpbench bench comm` writes them as JSON:
`CommParams.from_json`, `load_params` reads the file CPBENCH_COMM_PARAMS names); `DEFAULT_PARAMS` are assumed H200
figures (NVLink within a host, 400 Gb/s InfiniBand per GPU between hosts), marked as assumed. `comm_check` holds the
link model against the collectives a comm run timed. Where the ranks sit is a `db.topology.Topology` (hosts, ranks
per host, interconnect: the measurement's record; `Topology.of_row` reads it off a stored measurement).
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from db.topology import Topology

__all__ = [
    "DEFAULT_PARAMS",
    "LINK_CLASSES",
    "PARAMS_ENV",
    "CommParams",
    "Link",
    "LinkLoad",
    "collective_time",
    "comm_check",
    "link_load",
    "load_params",
    "p2p_load",
    "params_json",
]

LINK_CLASSES = ("intra", "inter")


@dataclass(frozen=True)
class Link:
    """One link class: a message costs `alpha_s` plus `beta_s_per_byte` per byte."""

    alpha_s: float
    beta_s_per_byte: float

    def time(self, messages: float, nbytes: float) -> float:
        return messages * self.alpha_s + nbytes * self.beta_s_per_byte

    @property
    def gbytes_per_s(self) -> float:
        return math.inf if self.beta_s_per_byte <= 0 else 1e-9 / self.beta_s_per_byte


@dataclass(frozen=True)
class CommParams:
    """The links of a cluster and their provenance: `source` says where they came from (a `cpbench bench comm` run:
    its command, date and gang; or "assumed"), `measured` which link classes that run fitted."""

    intra: Link
    inter: Link
    source: str = "assumed"
    measured: tuple[str, ...] = ()

    def link(self, name: str) -> Link:
        return self.intra if name == "intra" else self.inter

    @classmethod
    def from_json(cls, doc: Mapping[str, Any], *, fallback: CommParams | None = None) -> CommParams:
        """From `cpbench bench comm`'s JSON: {"links": {"intra": {alpha_s, beta_s_per_byte}, "inter": ...},
        "measured": [...], "source": ...}; a class the run could not fit keeps `fallback`'s (DEFAULT_PARAMS)."""
        base = fallback or DEFAULT_PARAMS
        links = doc.get("links") or {}
        measured = tuple(c for c in doc.get("measured") or () if c in LINK_CLASSES and c in links)
        got = {
            c: Link(float(links[c]["alpha_s"]), float(links[c]["beta_s_per_byte"])) if c in measured else base.link(c)
            for c in LINK_CLASSES
        }
        return cls(got["intra"], got["inter"], str(doc.get("source") or "cpbench bench comm"), measured)

    @classmethod
    def load(cls, path: str) -> CommParams:
        with open(path) as f:
            return cls.from_json(json.load(f))

    def describe(self) -> list[dict[str, Any]]:
        """One row per link class: alpha (us), bandwidth (GB/s) and whether it was measured or assumed."""
        return [
            {
                "link": c,
                "alpha_us": self.link(c).alpha_s * 1e6,
                "GB/s": self.link(c).gbytes_per_s,
                "from": self.source if c in self.measured else "assumed (DEFAULT_PARAMS)",
            }
            for c in LINK_CLASSES
        ]


# assumed H200 figures: NVLink 4 (~360 GB/s achieved per direction, ~8 us per NCCL call), InfiniBand NDR 400 Gb/s
# per GPU (~45 GB/s achieved, ~20 us); replace them with a `cpbench bench comm` run of the cluster
DEFAULT_PARAMS = CommParams(Link(8e-6, 1 / 360e9), Link(20e-6, 1 / 45e9), "assumed (H200 NVLink / 400 Gb/s IB)", ())


# ------------------------------------------------------------------------------------------------ communication
@dataclass(frozen=True)
class LinkLoad:
    """What one call puts on each link class, for the busiest rank: latency terms and bytes."""

    messages: dict[str, float] = field(default_factory=dict)
    nbytes: dict[str, float] = field(default_factory=dict)

    def time(self, params: CommParams) -> float:
        return sum(params.link(c).time(self.messages.get(c, 0.0), self.nbytes.get(c, 0.0)) for c in LINK_CLASSES)


def link_load(kind: str, payload: float, topo: Topology, *, calls: int = 1) -> LinkLoad:
    """The link load of `calls` group collectives of `kind` whose local input bytes sum to `payload` (the profiler's
    bytes: an all-gather's block, an all-to-all's or reduce-scatter's whole buffer), as the module doc's table."""
    W, rph = topo.W, topo.ranks_per_host
    if W == 1:
        return LinkLoad()
    intra, inter = (rph - 1) / (W - 1), (W - rph) / (W - 1)  # the shares of a rank's peers on / off its host
    if kind == "all_gather":
        received = (W - 1) * payload
    elif kind in ("reduce_scatter", "all_to_all"):
        received = (W - 1) / W * payload
    else:
        raise ValueError(f"kind must be all_gather, reduce_scatter or all_to_all, got kind={kind!r}")
    if kind == "all_to_all":
        messages = {c: float(calls) for c, share in (("intra", intra), ("inter", inter)) if share > 0}
    else:
        messages = {"inter" if topo.hosts > 1 else "intra": float(calls * (W - 1))}
    return LinkLoad(messages, {"intra": received * intra, "inter": received * inter})


def p2p_load(hops: Sequence[tuple[int, int]], message: float, topo: Topology, *, serial: bool) -> LinkLoad:
    """Point-to-point hand-offs of `message` bytes each along `hops` (src, dst ranks): all of them in order
    (`serial`: ring's chain), or one on the critical path, the slowest (tail_exchange posts all at once)."""
    classes = ["inter" if topo.host(a) != topo.host(b) else "intra" for a, b in hops]
    if not classes:
        return LinkLoad()
    if not serial:
        classes = ["inter" if "inter" in classes else "intra"]
    msgs = {c: float(classes.count(c)) for c in set(classes)}
    return LinkLoad(msgs, {c: n * message for c, n in msgs.items()})


def collective_time(kind: str, payload: float, topo: Topology, params: CommParams, *, calls: int = 1) -> float:
    """Seconds of `calls` group collectives of `kind` moving `payload` local bytes in all, on `topo`."""
    return link_load(kind, payload, topo, calls=calls).time(params)


def params_json(params: CommParams) -> dict[str, Any]:
    """`params` as the JSON `CommParams.from_json` reads."""
    return {
        "links": {c: asdict(params.link(c)) for c in LINK_CLASSES},
        "measured": list(params.measured),
        "source": params.source,
    }


def comm_check(doc: Mapping[str, Any], params: CommParams | None = None) -> list[dict[str, Any]]:
    """The group collectives a `cpbench bench comm` run timed, beside what the link model predicts for them on that
    run's topology with its fitted links (`params`, default: the run's own): error = predicted / measured - 1."""
    topo = Topology.of_row(doc.get("topology") or {})
    params = params or CommParams.from_json(doc)
    out = []
    for s in doc.get("samples") or ():
        if s.get("kind") in ("all_gather", "all_to_all", "reduce_scatter") and s.get("seconds"):
            predicted = collective_time(s["kind"], s["bytes"], topo, params)
            out.append(
                {
                    "kind": s["kind"],
                    "bytes": s["bytes"],
                    "W": topo.W,
                    "measured_ms": s["seconds"] * 1e3,
                    "predicted_ms": predicted * 1e3,
                    "error": predicted / s["seconds"] - 1.0,
                }
            )
    return out


PARAMS_ENV = "CPBENCH_COMM_PARAMS"  # the `cpbench bench comm` JSON the server's /scaling page and figures use


def load_params(path: str | None = None) -> tuple[CommParams, dict[str, Any] | None, str | None]:
    """(the links, the JSON they came from or None, why it could not be used or None): from `path`, else the file
    CPBENCH_COMM_PARAMS names, else DEFAULT_PARAMS. A missing or malformed file falls back to DEFAULT_PARAMS and
    says why in one line."""
    path = path or os.environ.get(PARAMS_ENV) or None
    if not path:
        return DEFAULT_PARAMS, None, None
    try:
        with open(path) as f:
            doc = json.load(f)
        return CommParams.from_json(doc), doc, None
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as err:
        return DEFAULT_PARAMS, None, f"{PARAMS_ENV}={path} unusable ({type(err).__name__}: {err}); assumed links used"
