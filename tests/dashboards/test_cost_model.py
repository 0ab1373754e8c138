"""The communication cost model (cp-schemes.md §5.2, as kernels.cp shards tokens) against hand-computed numbers.

Scenarios: the one-device modes move nothing; bytes per token (gate in fp32, the rest in the activation dtype);
headwise / all_gather payloads scale with the local tokens; true_cp and ring move one summary / one state per
crossing, independent of T and B; cuts that fall on sequence ends need no message (dense B > 1 and varlen);
zigzag doubles the summaries per rank and skips the hand-off inside the middle rank; point-to-point counted over
the gang, as `runners.profile.merge_ranks` does; unmodelled cases give None; bad sizes raise naming the argument.
(The model was checked against the profiler on 160 CPU gloo points: gdn/kda, bf16/fp32, B 1/3, W 2/4, both layouts,
varlen. tests/bench_server/test_api_e2e.py re-checks the counts on every CI run.)
"""

from __future__ import annotations

import pytest

from dashboards.cost_model import bytes_per_token, comm_cost, crossing_cuts

SHAPE = {"B": 1, "T": 1024, "H": 4, "K": 32, "V": 32, "W": 2, "dtype_bytes": 2}
GDN_IN = 4 * ((32 + 32 + 32 + 1) * 2 + 1 * 4)  # q, k, v, beta in bf16 + one fp32 gate value, per head
GDN_OUT = 4 * 32 * 2


@pytest.mark.parametrize("mode", ["none", "warmup_correct"])
def test_comm_cost_one_device_modes_move_nothing(mode: str) -> None:
    cost = comm_cost(mode, **SHAPE)
    assert cost is not None
    assert (cost.count, cost.total_payload_bytes, cost.bytes_out, cost.bytes_in) == (0, 0, 0, 0)


def test_bytes_per_token_gdn_and_kda() -> None:
    assert bytes_per_token("gdn", H=4, K=32, V=32, dtype_bytes=2) == (GDN_IN, GDN_OUT) == (792, 256)
    # KDA's gate is K wide, fp32 either way
    assert bytes_per_token("kda", H=4, K=32, V=32, dtype_bytes=2)[0] == GDN_IN + 4 * 31 * 4
    assert bytes_per_token("gdn", H=4, K=32, V=32, dtype_bytes=4) == (4 * (97 * 4 + 4), 4 * 32 * 4)
    with pytest.raises(ValueError, match="op="):
        bytes_per_token("mamba", H=4, K=32, V=32, dtype_bytes=2)


def test_comm_cost_headwise_and_all_gather_worked_example() -> None:
    hw = comm_cost("headwise", **SHAPE)
    ag = comm_cost("all_gather", **{**SHAPE, "W": 4})
    assert hw is not None and ag is not None
    assert hw.collectives == {"all_to_all": 2}
    assert hw.payload_bytes == {"all_to_all": 512 * (792 + 256)}  # both calls' local buffers, 512 local tokens
    assert hw.bytes_out == hw.bytes_in == 512 * (792 + 256) // 2  # (W-1)/W of the buffer leaves the rank
    assert ag.collectives == {"all_gather": 1} and ag.payload_bytes == {"all_gather": 256 * 792}
    assert ag.bytes_out == 3 * 256 * 792  # ring all-gather forwards W-1 blocks


def test_comm_cost_true_cp_and_ring_move_states() -> None:
    cp = comm_cost("true_cp", **{**SHAPE, "W": 4})
    ring = comm_cost("ring", **{**SHAPE, "W": 4})
    assert cp is not None and ring is not None
    assert cp.collectives == {"all_gather": 1} and cp.payload_bytes == {"all_gather": 4 * 32 * 64 * 4}  # [M, S_ext]
    assert ring.collectives == {"send": 3, "recv": 3} and ring.payload_bytes["send"] == 3 * 4 * 32 * 32 * 4
    assert ring.bytes_out == 4 * 32 * 32 * 4  # the busiest rank hands on one state
    for T in (4096, 65536):  # independent of the sequence length
        assert comm_cost("true_cp", **{**SHAPE, "W": 4, "T": T}) == cp
        assert comm_cost("ring", **{**SHAPE, "W": 4, "T": T}) == ring
    assert comm_cost("all_gather", **{**SHAPE, "T": 8192}).total_payload_bytes == 8 * comm_cost("all_gather", **SHAPE).total_payload_bytes


@pytest.mark.parametrize(("B", "W", "messages"), [(1, 2, 1), (2, 2, 0), (2, 4, 2), (3, 2, 1), (4, 4, 0), (1, 8, 7)])
def test_comm_cost_dense_batches_cut_between_sequences(B: int, W: int, messages: int) -> None:
    """B sequences are one token stream: a cut on a sequence end needs no hand-off."""
    ring = comm_cost("ring", **{**SHAPE, "B": B, "W": W})
    cp = comm_cost("true_cp", **{**SHAPE, "B": B, "W": W})
    assert ring is not None and cp is not None
    assert ring.collectives == ({"send": messages, "recv": messages} if messages else {})
    assert cp.count == (1 if messages else 0)


@pytest.mark.parametrize(("lengths", "W", "layout", "expected"), [
    ((256,), 2, "zigzag", (2, 3)),  # parts 0|1|2|3 on ranks 0,1,1,0: the middle cut stays on rank 1
    ((256,), 4, "zigzag", (6, 7)),
    ((128, 128), 2, "zigzag", (2, 2)),  # the middle cut is the sequence end
    ((100, 156), 2, "contiguous", (1, 1)),
    ((64, 192), 4, "contiguous", (2, 2)),  # the cut at 64 is a sequence end
    ((128, 128), 2, "contiguous", (0, 0)),
    ((32, 32, 32, 160), 4, "contiguous", (2, 2)),
])
def test_crossing_cuts(lengths: tuple[int, ...], W: int, layout: str, expected: tuple[int, int]) -> None:
    assert crossing_cuts(lengths, W, layout) == expected
    ring = comm_cost("ring", B=1, T=sum(lengths), H=2, K=16, V=16, W=W, dtype_bytes=2, layout=layout, lengths=lengths)
    assert ring is not None and ring.collectives.get("send", 0) == expected[0]


def test_comm_cost_zigzag_true_cp_gathers_two_summaries() -> None:
    zz = comm_cost("true_cp", **SHAPE, layout="zigzag")
    assert zz is not None and zz.payload_bytes == {"all_gather": 2 * 4 * 32 * 64 * 4}
    with pytest.raises(ValueError, match="layout="):
        comm_cost("ring", **SHAPE, layout="striped")


def test_comm_cost_tail_exchange_needs_warmup_chunks() -> None:
    assert comm_cost("tail_exchange", **SHAPE) is None
    cost = comm_cost("tail_exchange", **SHAPE, warmup_chunks=2)
    assert cost is not None
    # 2 chunks of 64 tokens of k, v, beta (bf16) and the gate (fp32): no q
    assert cost.collectives == {"send": 1, "recv": 1} and cost.payload_bytes["send"] == 128 * 4 * ((32 + 32 + 1) * 2 + 4)


def test_comm_cost_unmodelled_cases_are_none() -> None:
    assert comm_cost("fancy_mode", **SHAPE) is None
    assert comm_cost("true_cp", **SHAPE, direction="sideways") is None
    assert comm_cost("tail_exchange", **SHAPE, direction="bwd") is None


def test_comm_cost_backward_and_training_step() -> None:
    # the backward mirrors the forward (kernels/cp/README.md §7); fwd+bwd adds the two, kind by kind
    W4 = {**SHAPE, "W": 4}
    hw_f, hw_b = comm_cost("headwise", **SHAPE), comm_cost("headwise", **SHAPE, direction="bwd")
    assert hw_b == hw_f
    ag = comm_cost("all_gather", **W4, direction="bwd")
    assert ag is not None and ag.collectives == {"reduce_scatter": 1}
    assert ag.payload_bytes == {"reduce_scatter": 1024 * 4 * (97 * 4 + 4)}  # every token's input gradients in fp32
    assert ag.bytes_out == 3 * ag.payload_bytes["reduce_scatter"] // 4
    cp = comm_cost("true_cp", **W4, direction="bwd")
    assert cp is not None and cp.payload_bytes == {"all_gather": 4 * 32 * 32 * 4}  # G [H, K, V] per part
    assert comm_cost("ring", **W4, direction="bwd") == comm_cost("ring", **W4)
    te = comm_cost("tail_exchange", **SHAPE, warmup_chunks=2, direction="bwd")
    assert te is not None and te.payload_bytes["send"] == 128 * 4 * ((32 + 32 + 1) * 2 + 4)  # dk, dv, dbeta, dg
    both = comm_cost("all_gather", **W4, direction="fwd+bwd")
    assert both is not None and both.collectives == {"all_gather": 1, "reduce_scatter": 1}
    assert both.bytes_out == comm_cost("all_gather", **W4).bytes_out + ag.bytes_out
    for mode in ("none", "warmup_correct"):
        assert comm_cost(mode, **SHAPE, direction="fwd+bwd").count == 0


@pytest.mark.parametrize("arg", ["B", "T", "W", "dtype_bytes"])
def test_comm_cost_invalid_sizes(arg: str) -> None:
    with pytest.raises(ValueError, match=f"{arg}=0"):
        comm_cost("true_cp", **{**SHAPE, arg: 0})
