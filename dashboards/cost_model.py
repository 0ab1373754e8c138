"""Communication cost model of the CP schemes (cp-schemes.md §5.2, one layer, forward and backward): what the ranks move.

Pure arithmetic, no I/O: `comm_cost(mode, B=, T=, H=, K=, V=, W=, dtype_bytes=)` gives the number of collective
calls per kind and their bytes, counted the way `runners.profile.merge_ranks` reports a measured step, so the
communication figure can put the two side by side: group collectives (all-gather, all-to-all) per rank,
point-to-point (send, recv) summed over the W ranks. The calls are `kernels.vocabulary.collective_count` over the
whole gang (the kernels' own count, torch-free); this module adds their bytes.

How tokens sit on ranks (DESIGN.md §2, as kernels.cp shards them): the B sequences (or the varlen `lengths`) are
one stream of N = B T tokens cut into P equal parts, P = W (`contiguous`: rank r holds part r) or P = 2W (`zigzag`:
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
| tail_exchange | as ring | per message min(warmup_chunks C, N / P) x the k, v, g, beta bytes per token (no q) |

`bytes_out` / `bytes_in` are the wire bytes of the busiest rank: all-gathers on a ring (a rank forwards W-1
blocks), all-to-alls keeping 1/W of the buffer local, and for the chains the most messages one rank sends.

`model_speedup(mode, W, T=)` is the compute-only prediction of t(none) / t(mode at W) from the critical paths of
kernels/cp/README.md §3: the device forward Φ is linear in tokens and heads, a transition (M, S_ext) costs
TRANSITION_COST of a forward per token, and collective time is left out (an upper bound where the collectives do
not overlap): headwise W; all_gather and ring 1; true_cp W / (1 + TRANSITION_COST); tail_exchange
W / (1 + TRANSITION_COST min(1, window 64 W / T)).

The backward (`direction="bwd"`; `"fwd+bwd"` adds it to the forward, kind by kind; kernels/cp/README.md §7):

| mode | calls (as profiled) | payload |
|---|---|---|
| none, warmup_correct | 0 | 0 |
| headwise | 2 all_to_all per rank | as the forward (the gradients of the same tensors, same dtypes) |
| all_gather | 1 reduce_scatter per rank | N x the input gradients per token in fp32 (the whole sequence's partials) |
| true_cp | 1 all_gather per rank when any cut is internal | parts per rank x H K V 4 (the gradient terms G) |
| ring | as the forward, reversed | per message H K V 4 |
| tail_exchange | as the forward, reversed | per message min(warmup_chunks C, N / P) x the k, v, g, beta bytes per token |
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from kernels.vocabulary import COUNTED_DIRECTIONS, HAND_BACKWARD, LAYOUTS, MODES, OPS, SINGLE_DEVICE, collective_count

__all__ = ["CHUNK_SIZE", "TRANSITION_COST", "CommCost", "bytes_per_token", "comm_cost", "crossing_cuts",
           "model_speedup", "rank_hops"]

CHUNK_SIZE = 64
TRANSITION_COST = 0.5  # a transition (M, S_ext) per token, relative to a forward per token (assumed)


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
    if op not in OPS:
        raise ValueError(f"op must be 'gdn' or 'kda', got op={op!r}")
    gate = 1 if op == "gdn" else K
    return H * ((2 * K + V + 1) * dtype_bytes + gate * gate_bytes), H * V * dtype_bytes


def crossing_cuts(lengths: Sequence[int], W: int, layout: str = "contiguous") -> tuple[int, int]:
    """(internal cuts between parts on different ranks, internal cuts in all) of the token stream `lengths`."""
    messages, internal, _ = _cut_plan(lengths, W, layout)
    return messages, internal


def rank_hops(lengths: Sequence[int], W: int, layout: str = "contiguous") -> list[tuple[int, int]]:
    """The (source rank, destination rank) of every state hand-off along the token stream `lengths`: one per
    internal cut between parts on different ranks, in stream order (the chain of ring and tail_exchange)."""
    return _cuts(lengths, W, layout)[1]


def _cuts(lengths: Sequence[int], W: int, layout: str) -> tuple[list[int], list[tuple[int, int]]]:
    """(the internal cuts, the cross-rank hops (src, dst) among them)."""
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be 'contiguous' or 'zigzag', got layout={layout!r}")
    parts = W if layout == "contiguous" else 2 * W
    total = sum(lengths)
    ends, acc = set(), 0
    for n in lengths:
        acc += n
        ends.add(acc)

    def owner(part: int) -> int:
        return part if part < W else 2 * W - 1 - part

    internal = [i for i in range(1, parts) if (i * total) // parts not in ends]
    return internal, [(owner(i - 1), owner(i)) for i in internal if owner(i - 1) != owner(i)]


def _cut_plan(lengths: Sequence[int], W: int, layout: str) -> tuple[int, int, int]:
    """(cross-rank internal cuts, internal cuts, most messages one rank sends or receives)."""
    internal, hops = _cuts(lengths, W, layout)
    per_rank = [max(sum(src == r for src, _ in hops), sum(dst == r for _, dst in hops)) for r in range(W)]
    return len(hops), len(internal), max(per_rank, default=0)


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
    """Model of one layer in `direction` ("fwd", "bwd", "fwd+bwd"); None where the model does not cover the case.

    `lengths` (varlen) replaces the B sequences of T tokens. None for: a mode outside `kernels.vocabulary.MODES`
    or a direction outside its COUNTED_DIRECTIONS, and `tail_exchange` without `warmup_chunks`.
    """
    for name, value in (("B", B), ("T", T), ("H", H), ("K", K), ("V", V), ("W", W), ("dtype_bytes", dtype_bytes)):
        if int(value) < 1:
            raise ValueError(f"{name} must be >= 1, got {name}={value!r}")
    if mode not in MODES or direction not in COUNTED_DIRECTIONS:
        return None
    kw = {"B": B, "T": T, "H": H, "K": K, "V": V, "W": W, "dtype_bytes": dtype_bytes, "op": op, "layout": layout,
          "lengths": lengths, "gate_bytes": gate_bytes, "state_bytes": state_bytes, "warmup_chunks": warmup_chunks}
    if direction == "fwd+bwd":
        f, b = _forward(mode, **kw), _backward(mode, **kw)
        if f is None or b is None:
            return None
        return CommCost(mode, _add(f.collectives, b.collectives), _add(f.payload_bytes, b.payload_bytes),
                        f.bytes_out + b.bytes_out, f.bytes_in + b.bytes_in)
    return (_backward if direction == "bwd" else _forward)(mode, **kw)


def _add(a: dict[str, int], b: dict[str, int]) -> dict[str, int]:
    return {k: a.get(k, 0) + b.get(k, 0) for k in sorted({*a, *b})}


def _calls(mode: str, direction: str, seqs: list[int], W: int, layout: str) -> tuple[dict[str, int], int, int]:
    """(the gang's calls per kind, cross-rank internal cuts, the busiest rank's messages): `collective_count` of
    kernels.vocabulary over the whole gang (its hand-offs are every cross-rank cut: send/recv summed over the ranks)."""
    messages, internal, busiest = _cut_plan(seqs, W, layout) if mode in HAND_BACKWARD else (0, 0, 0)
    calls = collective_count(mode, crossing=internal > 0, sends=messages, recvs=messages, direction=direction)
    return calls, messages, busiest


def _backward(mode: str, *, B: int, T: int, H: int, K: int, V: int, W: int, dtype_bytes: int, op: str, layout: str,
              lengths: Sequence[int] | None, gate_bytes: int, state_bytes: int, warmup_chunks: int | None,
              ) -> CommCost | None:
    if mode == "headwise":  # the gradients of the same tensors, in the same dtypes
        return _forward(mode, B=B, T=T, H=H, K=K, V=V, W=W, dtype_bytes=dtype_bytes, op=op, layout=layout,
                        lengths=lengths, gate_bytes=gate_bytes, state_bytes=state_bytes, warmup_chunks=warmup_chunks)
    seqs = list(lengths) if lengths else [T] * B
    calls, messages, busiest = _calls(mode, "bwd", seqs, W, layout)
    if mode == "tail_exchange" and warmup_chunks is None:
        return None
    if not calls:
        return CommCost(mode)
    if mode == "all_gather":
        payload = sum(seqs) * bytes_per_token(op, H=H, K=K, V=V, dtype_bytes=4, gate_bytes=4)[0]
        wire = payload * (W - 1) // W
        return CommCost(mode, calls, {"reduce_scatter": payload}, wire, wire)
    if mode == "true_cp":
        return _all_gather(mode, calls, (1 if layout == "contiguous" else 2) * H * K * V * state_bytes, W)
    return _chain(mode, calls, _message(mode, seqs, H=H, K=K, V=V, W=W, dtype_bytes=dtype_bytes, op=op, layout=layout,
                                        gate_bytes=gate_bytes, state_bytes=state_bytes, warmup_chunks=warmup_chunks),
                  messages, busiest)


def _forward(mode: str, *, B: int, T: int, H: int, K: int, V: int, W: int, dtype_bytes: int, op: str, layout: str,
             lengths: Sequence[int] | None, gate_bytes: int, state_bytes: int, warmup_chunks: int | None,
             ) -> CommCost | None:
    seqs = list(lengths) if lengths else [T] * B
    local = sum(seqs) // W
    tok_in, tok_out = bytes_per_token(op, H=H, K=K, V=V, dtype_bytes=dtype_bytes, gate_bytes=gate_bytes)
    calls, messages, busiest = _calls(mode, "fwd", seqs, W, layout)
    if mode == "tail_exchange" and warmup_chunks is None:
        return None
    if not calls:
        return CommCost(mode)
    if mode == "headwise":
        payload = local * (tok_in + tok_out)
        wire = payload * (W - 1) // W
        return CommCost(mode, calls, {"all_to_all": payload}, wire, wire)
    if mode == "all_gather":
        return _all_gather(mode, calls, local * tok_in, W)
    if mode == "true_cp":
        return _all_gather(mode, calls, (1 if layout == "contiguous" else 2) * H * K * (K + V) * state_bytes, W)
    return _chain(mode, calls, _message(mode, seqs, H=H, K=K, V=V, W=W, dtype_bytes=dtype_bytes, op=op, layout=layout,
                                        gate_bytes=gate_bytes, state_bytes=state_bytes, warmup_chunks=warmup_chunks),
                  messages, busiest)


def _message(mode: str, seqs: list[int], *, H: int, K: int, V: int, W: int, dtype_bytes: int, op: str, layout: str,
             gate_bytes: int, state_bytes: int, warmup_chunks: int | None) -> int:
    """Bytes of one point-to-point hand-off: a state (ring), or a tail window of k, v, g, beta (tail_exchange)."""
    if mode == "ring":
        return H * K * V * state_bytes
    part = sum(seqs) // (W if layout == "contiguous" else 2 * W)
    return min((warmup_chunks or 0) * CHUNK_SIZE, part) * _tail_bytes(op, H, K, V, dtype_bytes, gate_bytes)


def _tail_bytes(op: str, H: int, K: int, V: int, dtype_bytes: int, gate_bytes: int) -> int:
    """Bytes per token of a tail_exchange message: k, v, beta (activation dtype) and the gate (no q)."""
    gate = 1 if op == "gdn" else K
    return H * ((K + V + 1) * dtype_bytes + gate * gate_bytes)


def _all_gather(mode: str, calls: dict[str, int], payload: int, W: int) -> CommCost:
    return CommCost(mode, calls, {"all_gather": payload}, (W - 1) * payload, (W - 1) * payload)


def _chain(mode: str, calls: dict[str, int], message: int, messages: int, busiest: int) -> CommCost:
    """`messages` point-to-point hand-offs of `message` bytes; the busiest rank sends or receives `busiest`."""
    total = messages * message
    return CommCost(mode, calls, {"send": total, "recv": total}, busiest * message, busiest * message)


def model_speedup(mode: str, W: int, *, T: int, warmup_chunks: int = 2) -> float | None:
    """Compute-only speedup over one device of `mode` at CP size W on T tokens (see the module doc); None for the
    one-device modes (none, warmup_correct) and modes outside the model."""
    if W < 1 or T < 1:
        raise ValueError(f"W and T must be >= 1, got W={W!r}, T={T!r}")
    if mode not in MODES or mode in SINGLE_DEVICE:
        return None
    if W == 1 or mode in ("all_gather", "ring"):  # at W = 1 no cut: every scheme runs the one-device forward
        return 1.0
    if mode == "headwise":
        return float(W)
    if mode == "true_cp":
        return W / (1.0 + TRANSITION_COST)
    return W / (1.0 + TRANSITION_COST * min(1.0, warmup_chunks * CHUNK_SIZE * W / T))
