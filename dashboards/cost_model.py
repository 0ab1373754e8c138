"""Communication cost model of the CP schemes (cp-schemes.md §5.2, forward, one layer): what each rank should move.

Pure arithmetic, no I/O: `comm_cost(mode, B=, T=, H=, K=, V=, W=, dtype_bytes=)` gives the number of collective
calls per kind and their bytes, counted the way `runners.profile.merge_ranks` reports a measured step, so the
communication figure can put the two side by side: group collectives (all-gather, all-to-all) per rank, point-to-point
(send, recv) summed over the W ranks. Conventions (ours, matching DESIGN.md §2):

- a rank holds `T_l = B * T / W` tokens (B dense sequences, each cut into W contiguous or zigzag pieces);
- inputs per token `P_in = H * (2K + V + G + 1)` elements (q, k, v, gate, beta packed into one buffer; `G = 1` for
  GDN's scalar gate, `K` for KDA's per-key gate), outputs per token `P_out = H * V`, all in the activation dtype;
- states and transition summaries are fp32 (`state_bytes = 4`): a state is `H K V` and a summary `[M, S_ext]` is
  `H K (K + V)` per sequence piece;
- `payload_bytes` is the local input of the calls (what the profiler records from the call's input shape), with the
  same per-rank / summed-over-ranks rule as the counts; `bytes_out` / `bytes_in` are the wire bytes of the busiest
  rank, with all-gathers on a ring (a rank forwards W-1 blocks) and all-to-alls keeping 1/W of the buffer local.

| mode | calls (as profiled) | payload (as profiled) |
|---|---|---|
| none, warmup_correct | 0 | 0 |
| headwise | 2 all_to_all per rank | T_l (P_in + P_out) b_a per rank |
| all_gather | 1 all_gather per rank | T_l P_in b_a per rank |
| true_cp | 1 all_gather per rank | B H K (K + V) 4 per rank |
| ring | W-1 send + W-1 recv in all | (W-1) B H K V 4 each way |
| tail_exchange | W-1 send + W-1 recv of a predecessor's last `warmup_chunks` chunks | (W-1) B min(n_w C, T/W) P_in b_a each way |
"""

from __future__ import annotations

from dataclasses import dataclass, field

__all__ = ["CHUNK_SIZE", "MODELLED_MODES", "CommCost", "comm_cost", "elements_per_token"]

CHUNK_SIZE = 64
MODELLED_MODES = ("none", "headwise", "all_gather", "ring", "true_cp", "warmup_correct", "tail_exchange")


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


def elements_per_token(op: str, *, H: int, K: int, V: int) -> tuple[int, int]:
    """(P_in, P_out): input and output elements per token for `op` ("gdn" or "kda")."""
    if op not in ("gdn", "kda"):
        raise ValueError(f"op must be 'gdn' or 'kda', got op={op!r}")
    gate = 1 if op == "gdn" else K
    return H * (2 * K + V + gate + 1), H * V


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
    state_bytes: int = 4,
    direction: str = "fwd",
    warmup_chunks: int | None = None,
) -> CommCost | None:
    """Model of one layer forward; None where the model does not cover the case.

    None for: a mode outside MODELLED_MODES, `direction` other than "fwd" (the suite is forward-only), and
    `tail_exchange` without `warmup_chunks`.
    """
    for name, value in (("B", B), ("T", T), ("H", H), ("K", K), ("V", V), ("W", W), ("dtype_bytes", dtype_bytes)):
        if int(value) < 1:
            raise ValueError(f"{name} must be >= 1, got {name}={value!r}")
    if mode not in MODELLED_MODES or direction != "fwd":
        return None
    p_in, p_out = elements_per_token(op, H=H, K=K, V=V)
    local_tokens = B * T // W
    if mode in ("none", "warmup_correct"):
        return CommCost(mode)
    if mode == "headwise":
        payload = local_tokens * (p_in + p_out) * dtype_bytes
        wire = payload * (W - 1) // W
        return CommCost(mode, {"all_to_all": 2}, {"all_to_all": payload}, wire, wire)
    if mode == "all_gather":
        payload = local_tokens * p_in * dtype_bytes
        return _all_gather(mode, payload, W)
    if mode == "true_cp":
        payload = B * H * K * (K + V) * state_bytes
        return _all_gather(mode, payload, W)
    if mode == "ring":
        payload = B * H * K * V * state_bytes
        return _send_recv(mode, payload, W)
    if warmup_chunks is None:  # tail_exchange
        return None
    tail_tokens = min(warmup_chunks * CHUNK_SIZE, T // W)
    return _send_recv(mode, B * tail_tokens * p_in * dtype_bytes, W)


def _all_gather(mode: str, payload: int, W: int) -> CommCost:
    return CommCost(mode, {"all_gather": 1}, {"all_gather": payload}, (W - 1) * payload, (W - 1) * payload)


def _send_recv(mode: str, payload: int, W: int) -> CommCost:
    """A chain r -> r+1: W-1 messages; a middle rank (the busiest) sends one and receives one."""
    if W == 1:
        return CommCost(mode)
    total = (W - 1) * payload
    return CommCost(mode, {"send": W - 1, "recv": W - 1}, {"send": total, "recv": total}, payload, payload)
