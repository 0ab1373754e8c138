"""Communication cost model of the CP schemes (cp-schemes.md §5.2, forward, one layer): what the ranks should move.

No I/O: `comm_cost(mode, B=, T=, H=, K=, V=, W=, dtype_bytes=)` gives the number of collective calls per kind
and their bytes, counted the way `runners.profile.merge_ranks` reports a measured step, so the communication
figure can put the two side by side: group collectives (all-gather, all-to-all) per rank, point-to-point (send,
recv) summed over the W ranks.

One source: the modes, the partition and the call counts are kernels.cp's own (`kernels.cp.MODES`,
`build_context`, `expected_collectives_gang`, what the worker stores beside the measured profile); this module
adds only the bytes. (dashboards -> kernels.cp is the one edge beside dashboards -> db: kernels.cp is the leaf
library that owns the mode vocabulary, so the arrow still points down and nothing is re-derived.)

How tokens sit on ranks (DESIGN.md §2, kernels.cp.context): the B sequences (or the varlen `lengths`) are one
stream of N = B T tokens cut into P equal parts, P = W (`contiguous`: rank r holds part r) or P = 2W (`zigzag`:
rank r holds parts r and 2W-1-r). A cut between two parts is *internal* when it falls inside a sequence; only
internal cuts between parts on different ranks need state to travel.

Sizes: inputs per token `q, k, v, beta` in the activation dtype (`dtype_bytes`) plus the gate in fp32
(`gate_bytes = 4`; one value per head for GDN, K for KDA); outputs per token `H V` in the activation dtype. States
are fp32 (`state_bytes = 4`): a state is `H K V`, a transition summary `[M, S_ext]` is `H K (K + V)`.

| mode | calls (as profiled) | payload: local input bytes of the calls (as profiled) |
|---|---|---|
| none, warmup_correct | 0 | 0 |
| headwise | 2 all_to_all per rank | (N / W) (in + out bytes per token) |
| all_gather | 1 all_gather per rank | (N / W) in bytes per token |
| true_cp | 1 all_gather per rank when any cut is internal, else 0 | parts per rank x H K (K + V) 4 |
| ring | one send + one recv per internal cross-rank cut | per message H K V 4 |
| tail_exchange | as ring | per message min(warmup_chunks C, N / P) in bytes per token |

`model_speedup(mode, W, T=)` is the compute-only prediction of t(none) / t(mode at W) from the critical paths of
kernels/cp/README.md §3: the device forward Φ is linear in tokens and heads, a transition (M, S_ext) costs
TRANSITION_COST of a forward per token, and collective time is left out (so it is an upper bound where the
collectives do not overlap):

| mode | critical path | model speedup |
|---|---|---|
| headwise | Φ(T, H/W) | W |
| all_gather, ring | Φ(T, H) | 1 |
| true_cp | Φ_transition(T/W) + Φ(T/W) | W / (1 + TRANSITION_COST) |
| tail_exchange | Φ_transition(window) + Φ(T/W) | W / (1 + TRANSITION_COST min(1, window 64 W / T)) |

`bytes_out` / `bytes_in` are the wire bytes of the busiest rank: all-gathers on a ring (a rank forwards W-1
blocks), all-to-alls keeping 1/W of the buffer local, and for the chains the most messages one rank sends.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import accumulate

import kernels.cp as cp

__all__ = ["CHUNK_SIZE", "MODELLED_MODES", "TRANSITION_COST", "CommCost", "bytes_per_token", "comm_cost",
           "crossing_cuts", "model_speedup"]

CHUNK_SIZE = 64
TRANSITION_COST = 0.5  # a transition (M, S_ext) per token, relative to a forward per token (assumed)
MODELLED_MODES = tuple(cp.MODES)


@dataclass(frozen=True)
class CommCost:
    """Collective calls and bytes of one layer forward, counted as the profiler reports them (see the module doc)."""

    mode: str
    collectives: dict[str, int] = field(default_factory=dict)  # kind -> calls (per rank; send/recv over all ranks)
    payload_bytes: dict[str, int] = field(default_factory=dict)  # kind -> local input bytes of those calls
    bytes_out: int = 0  # wire bytes sent by the busiest rank
    bytes_in: int = 0  # wire bytes received by the busiest rank

    @property
    def count(self) -> int:
        return sum(self.collectives.values())

    @property
    def total_payload_bytes(self) -> int:
        return sum(self.payload_bytes.values())


def bytes_per_token(op: str, *, H: int, K: int, V: int, dtype_bytes: int, gate_bytes: int = 4) -> tuple[int, int]:
    """(input bytes, output bytes) per token for `op` ("gdn": scalar gate per head, "kda": gate per key dim)."""
    if op not in ("gdn", "kda"):
        raise ValueError(f"op must be 'gdn' or 'kda', got op={op!r}")
    gate = 1 if op == "gdn" else K
    return H * ((2 * K + V + 1) * dtype_bytes + gate * gate_bytes), H * V * dtype_bytes


def crossing_cuts(lengths: Sequence[int], W: int, layout: str = "contiguous") -> tuple[int, int]:
    """(internal cuts between parts on different ranks, internal cuts in all) of the token stream `lengths`."""
    ctx = cp.build_context(_bounds(lengths), W, 0, layout)
    internal = [i for i in range(ctx.num_parts - 1) if ctx.part_carries[i]]
    return sum(ctx.part_owner[i][0] != ctx.part_owner[i + 1][0] for i in internal), len(internal)


def _bounds(lengths: Sequence[int]) -> list[int]:
    return [0, *accumulate(int(n) for n in lengths)]


def comm_cost(
    mode: str,
    *,
    B: int,
    T: int,
    H: int,
    K: int,
    V: int,
    W: int,
    dtype_bytes: int,
    op: str = "gdn",
    layout: str = "contiguous",
    lengths: Sequence[int] | None = None,
    gate_bytes: int = 4,
    state_bytes: int = 4,
    direction: str = "fwd",
    warmup_chunks: int | None = None,
) -> CommCost | None:
    """Model of one layer forward; None where the model does not cover the case.

    `lengths` (varlen) replaces the B sequences of T tokens. None for: a mode outside `kernels.cp.MODES`, a
    `direction` other than "fwd" (the suite is forward-only), and `tail_exchange` without `warmup_chunks`.
    The call counts are `kernels.cp.expected_collectives_gang`'s; an unknown layout raises its ValueError.
    """
    for name, value in (("B", B), ("T", T), ("H", H), ("K", K), ("V", V), ("W", W), ("dtype_bytes", dtype_bytes)):
        if int(value) < 1:
            raise ValueError(f"{name} must be >= 1, got {name}={value!r}")
    if layout not in cp.LAYOUTS:
        raise ValueError(f"layout must be one of {cp.LAYOUTS}, got layout={layout!r}")
    if mode not in cp.MODES or direction != "fwd" or (mode == "tail_exchange" and warmup_chunks is None):
        return None
    seqs = list(lengths) if lengths else [T] * B
    tokens = sum(seqs)
    local = tokens // W
    tok_in, tok_out = bytes_per_token(op, H=H, K=K, V=V, dtype_bytes=dtype_bytes, gate_bytes=gate_bytes)
    calls, per_rank = cp.expected_collectives_gang(mode, _bounds(seqs), W, layout)
    if not calls:
        return CommCost(mode)
    if mode == "headwise":
        payload = local * (tok_in + tok_out)
        wire = payload * (W - 1) // W
        return CommCost(mode, dict(calls), {"all_to_all": payload}, wire, wire)
    if mode == "all_gather":
        return _all_gather(mode, calls, local * tok_in, W)
    if mode == "true_cp":
        per_rank_parts = 1 if layout == "contiguous" else 2
        return _all_gather(mode, calls, per_rank_parts * H * K * (K + V) * state_bytes, W)
    busiest = max(max(c.get("send", 0), c.get("recv", 0)) for c in per_rank)
    if mode == "ring":
        return _chain(mode, calls, H * K * V * state_bytes, busiest)
    part = tokens // (W if layout == "contiguous" else 2 * W)  # tail_exchange
    return _chain(mode, calls, min(int(warmup_chunks or 0) * CHUNK_SIZE, part) * tok_in, busiest)


def _all_gather(mode: str, calls: dict[str, int], payload: int, W: int) -> CommCost:
    return CommCost(mode, dict(calls), {"all_gather": payload}, (W - 1) * payload, (W - 1) * payload)


def _chain(mode: str, calls: dict[str, int], message: int, busiest: int) -> CommCost:
    """Point-to-point hand-offs of `message` bytes (`calls`: sends and recvs over the gang); the busiest rank sends
    or receives `busiest` of them."""
    payload = {k: n * message for k, n in calls.items()}
    return CommCost(mode, dict(calls), payload, busiest * message, busiest * message)


def model_speedup(mode: str, W: int, *, T: int, warmup_chunks: int = 2) -> float | None:
    """Compute-only speedup over one device of `mode` at CP size W on T tokens (see the module doc); None for the
    one-device modes (none, warmup_correct) and modes outside the model."""
    if W < 1 or T < 1:
        raise ValueError(f"W and T must be >= 1, got W={W!r}, T={T!r}")
    if mode not in MODELLED_MODES or mode in ("none", "warmup_correct"):
        return None
    if W == 1 or mode in ("all_gather", "ring"):  # at W = 1 no cut: every scheme runs the one-device forward
        return 1.0
    if mode == "headwise":
        return float(W)
    if mode == "true_cp":
        return W / (1.0 + TRANSITION_COST)
    return W / (1.0 + TRANSITION_COST * min(1.0, warmup_chunks * CHUNK_SIZE * W / T))
