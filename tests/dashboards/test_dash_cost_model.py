"""The communication cost model (cp-schemes.md §5.2) against hand-computed numbers and its scaling laws.

Scenarios: the one-device modes move nothing; headwise / all_gather / true_cp / ring payloads on a worked GDN and KDA
shape (numbers computed by hand in the test); how each grows with T and W; point-to-point counted over the gang, as
`runners.profile.merge_ranks` does; cases the model does not cover give None; bad sizes raise naming the argument.
"""

from __future__ import annotations

import pytest

from dashboards.cost_model import comm_cost, elements_per_token

SHAPE = {"B": 1, "T": 1024, "H": 4, "K": 32, "V": 32, "W": 2, "dtype_bytes": 2}


@pytest.mark.parametrize("mode", ["none", "warmup_correct"])
def test_comm_cost_one_device_modes_move_nothing(mode: str) -> None:
    cost = comm_cost(mode, **SHAPE)
    assert cost is not None
    assert (cost.count, cost.total_payload_bytes, cost.bytes_out, cost.bytes_in) == (0, 0, 0, 0)


def test_elements_per_token_gdn_and_kda() -> None:
    # q, k: K each; v: V; gate: 1 (gdn) or K (kda); beta: 1 -> per head
    assert elements_per_token("gdn", H=4, K=32, V=32) == (4 * (32 + 32 + 32 + 1 + 1), 4 * 32)
    assert elements_per_token("kda", H=4, K=32, V=32) == (4 * (32 + 32 + 32 + 32 + 1), 4 * 32)
    with pytest.raises(ValueError, match="op="):
        elements_per_token("mamba", H=4, K=32, V=32)


def test_comm_cost_headwise_worked_example() -> None:
    cost = comm_cost("headwise", **SHAPE)
    assert cost is not None
    # T_l = 512 tokens; P_in = 392, P_out = 128 elements; bf16
    payload = 512 * (392 + 128) * 2
    assert cost.collectives == {"all_to_all": 2}
    assert cost.payload_bytes == {"all_to_all": payload} and payload == 532_480
    assert cost.bytes_out == cost.bytes_in == payload // 2  # (W-1)/W of the buffer leaves the rank


def test_comm_cost_all_gather_and_true_cp_worked_example() -> None:
    ag = comm_cost("all_gather", **{**SHAPE, "W": 4})
    cp = comm_cost("true_cp", **{**SHAPE, "W": 4})
    assert ag is not None and cp is not None
    assert ag.collectives == cp.collectives == {"all_gather": 1}
    assert ag.payload_bytes["all_gather"] == 256 * 392 * 2  # the local tokens' inputs
    assert cp.payload_bytes["all_gather"] == 4 * 32 * (32 + 32) * 4  # [M, S_ext] in fp32, one sequence
    assert ag.bytes_out == 3 * ag.payload_bytes["all_gather"]  # ring all-gather forwards W-1 blocks
    assert cp.bytes_in == 3 * cp.payload_bytes["all_gather"]


def test_comm_cost_scaling_laws() -> None:
    def payload(mode: str, **kw: int) -> int:
        cost = comm_cost(mode, **{**SHAPE, **kw})
        assert cost is not None
        return cost.total_payload_bytes

    # true_cp and ring move states: independent of T; all_gather and headwise move tokens: linear in T
    assert payload("true_cp", T=8192) == payload("true_cp", T=1024)
    assert payload("ring", T=8192) == payload("ring", T=1024)
    assert payload("all_gather", T=8192) == 8 * payload("all_gather", T=1024)
    assert payload("headwise", T=8192) == 8 * payload("headwise", T=1024)
    # more ranks: each holds fewer tokens
    assert payload("all_gather", W=4) * 2 == payload("all_gather", W=2)
    # a KDA gate is K wide: more input bytes than GDN
    kda = comm_cost("all_gather", **SHAPE, op="kda")
    gdn = comm_cost("all_gather", **SHAPE)
    assert kda is not None and gdn is not None
    assert kda.total_payload_bytes - gdn.total_payload_bytes == 512 * 4 * (32 - 1) * 2


@pytest.mark.parametrize("W", [1, 2, 4, 8])
def test_comm_cost_ring_counts_over_the_gang(W: int) -> None:
    cost = comm_cost("ring", **{**SHAPE, "W": W, "B": 2})
    assert cost is not None
    state = 2 * 4 * 32 * 32 * 4  # B H K V fp32
    assert cost.collectives == ({} if W == 1 else {"send": W - 1, "recv": W - 1})
    assert cost.payload_bytes.get("send", 0) == (W - 1) * state
    assert cost.bytes_out == (0 if W == 1 else state)  # the busiest rank sends one state


def test_comm_cost_tail_exchange_needs_warmup_chunks() -> None:
    assert comm_cost("tail_exchange", **SHAPE) is None
    cost = comm_cost("tail_exchange", **SHAPE, warmup_chunks=2)
    assert cost is not None
    assert cost.payload_bytes["send"] == 1 * 128 * 392 * 2  # 2 chunks of 64 tokens, W-1 = 1 message


def test_comm_cost_unmodelled_cases_are_none() -> None:
    assert comm_cost("fancy_mode", **SHAPE) is None
    assert comm_cost("true_cp", **SHAPE, direction="fwd+bwd") is None


@pytest.mark.parametrize("arg", ["B", "T", "W", "dtype_bytes"])
def test_comm_cost_invalid_sizes(arg: str) -> None:
    with pytest.raises(ValueError, match=f"{arg}=0"):
        comm_cost("true_cp", **{**SHAPE, arg: 0})
