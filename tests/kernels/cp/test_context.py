"""Partition context, shard/unshard, and the validation errors of kernels.cp (no processes).

Scenarios: FLA's context example (cu=[0,5,12], W=3, rank 1); a zigzag layout with a sequence crossing
three parts; shard/unshard round trips for both layouts and W in {1, 2, 4}; every ValueError of
build_context, shard/unshard, cp.forward (checked before any collective) and cp.warmup_correct.
"""

from __future__ import annotations

import pytest
import torch

import kernels.cp as cp
from tests.utils import make_inputs


def test_build_context_contiguous_example() -> None:
    ctx = cp.build_context([0, 5, 12], world_size=3, rank=1)
    assert ctx.local_cu_seqlens == (0, 1, 4)
    (slot,) = ctx.slots
    assert slot.part == 1 and slot.preds == (0,) and slot.next_part == 2
    assert [(p.start, p.end, p.seq, p.cont, p.carries) for p in slot.pieces] == [(0, 1, 0, True, False), (1, 4, 1, False, True)]
    assert ctx.part_cont == (False, True, True) and ctx.part_carries == (True, True, False)
    assert ctx.part_preds == ((), (0,), (1,))
    assert cp.build_context([0, 5, 12], 3, 1) is ctx  # cached
    assert cp.build_context(torch.tensor([0, 5, 12]), 3, 1) is ctx


def test_build_context_zigzag() -> None:
    ctx = cp.build_context([0, 300, 512], world_size=2, rank=1, layout="zigzag")
    assert ctx.part_len == 128 and ctx.num_parts == 4
    assert ctx.part_owner == ((0, 0), (1, 0), (1, 1), (0, 1))
    front, back = ctx.slots
    assert (front.part, back.part) == (1, 2)
    assert ctx.local_cu_seqlens == (0, 128, 172, 256)
    assert front.preds == (0,) and front.next_part == 2
    assert back.preds == (0, 1) and back.next_part == 3
    assert [(p.cont, p.carries) for p in back.pieces] == [(True, False), (False, True)]
    r0 = cp.build_context([0, 300, 512], 2, 0, "zigzag")
    assert r0.parts_of(0) == (0, 3) and r0.local_cu_seqlens == (0, 128, 256)
    assert r0.slots[1].preds == (2,) and r0.slots[1].next_part is None


def test_no_crossing() -> None:
    ctx = cp.build_context([0, 128, 256, 512], 2, 0)
    assert not ctx.any_crossing
    assert cp.expected_collectives("true_cp", ctx) == {} and cp.expected_collectives("ring", ctx) == {}
    assert cp.expected_collectives("headwise", ctx) == {"all_to_all": 2}


@pytest.mark.parametrize("layout", ["contiguous", "zigzag"])
@pytest.mark.parametrize("W", [1, 2, 4])
def test_shard_unshard_roundtrip(W: int, layout: str) -> None:
    cu = [0, 37, 40, 300, 512]
    x = torch.randn(1, 512, 3, 5)
    ctxs = [cp.build_context(cu, W, r, layout) for r in range(W)]
    shards = [cp.shard(x, c) for c in ctxs]
    assert all(s.shape == (1, 512 // W, 3, 5) for s in shards)
    torch.testing.assert_close(cp.unshard(shards, ctxs[0]), x, rtol=0, atol=0)
    if layout == "zigzag" and W == 2:
        P = 128
        torch.testing.assert_close(shards[0], torch.cat([x[:, :P], x[:, 3 * P:]], 1), rtol=0, atol=0)
    for c in ctxs:  # local bounds cover the shard and cut it where the global bounds do
        assert c.local_cu_seqlens[0] == 0 and c.local_cu_seqlens[-1] == c.local_len
        assert sum(p.length for p in c.pieces) == c.local_len


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"cu_seqlens": [0, 10], "world_size": 4, "rank": 0}, "divisible by W=4"),
        ({"cu_seqlens": [0, 12], "world_size": 4, "rank": 0, "layout": "zigzag"}, "divisible by 2W=8"),
        ({"cu_seqlens": [0, 8], "world_size": 0, "rank": 0}, "world_size must be >= 1"),
        ({"cu_seqlens": [0, 8], "world_size": 2, "rank": 2}, "rank must satisfy"),
        ({"cu_seqlens": [0, 8], "world_size": 2, "rank": -1}, "rank must satisfy"),
        ({"cu_seqlens": [0, 8], "world_size": 2, "rank": 0, "layout": "ring"}, "layout must be one of"),
        ({"cu_seqlens": [1, 8], "world_size": 2, "rank": 0}, "must start at 0"),
        ({"cu_seqlens": [0, 4, 4, 8], "world_size": 2, "rank": 0}, "no empty sequence"),
        ({"cu_seqlens": [0], "world_size": 1, "rank": 0}, ">= 2 entries"),
        ({"cu_seqlens": [0, 8.0], "world_size": 1, "rank": 0}, "must hold ints"),
        ({"cu_seqlens": torch.tensor([0, 8], device="meta"), "world_size": 1, "rank": 0}, "would sync"),
        ({"cu_seqlens": [0, 8], "world_size": 2.0, "rank": 0}, "world_size must be an int"),
    ],
)
def test_build_context_errors(kwargs: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        cp.build_context(**kwargs)


def test_shard_unshard_errors() -> None:
    ctx = cp.build_context([0, 64], 2, 0)
    with pytest.raises(ValueError, match=r"x.shape\[1\] must be 64"):
        cp.shard(torch.zeros(1, 32, 2), ctx)
    with pytest.raises(ValueError, match="B = 1"):
        cp.shard(torch.zeros(2, 64, 2), ctx)
    with pytest.raises(ValueError, match="world_size=2 tensors"):
        cp.unshard([torch.zeros(1, 32)], ctx)
    with pytest.raises(ValueError, match=r"shards\[1\].shape\[1\] must be 32"):
        cp.unshard([torch.zeros(1, 32), torch.zeros(1, 31)], ctx)


def _local(op: str = "gdn", H: int = 3, W: int = 2) -> tuple:
    q, k, v, g, beta, cu = make_inputs(op, (256,), H=H, K=16, V=16)
    ctx = cp.build_context(cu, W, 0)
    return ctx, [cp.shard(x, ctx) for x in (q, k, v, g, beta)]


def test_forward_errors_before_any_collective() -> None:
    ctx, xs = _local()
    with pytest.raises(ValueError, match="mode must be one of"):
        cp.forward("ulysses", "gdn", *xs, group=None, ctx=ctx)
    with pytest.raises(ValueError, match="op must be one of"):
        cp.forward("ring", "mamba", *xs, group=None, ctx=ctx)
    with pytest.raises(ValueError, match="backend must be one of"):
        cp.forward("ring", "gdn", *xs, group=None, ctx=ctx, backend="cuda")
    with pytest.raises(ValueError, match=r"head counts divisible by the CP size, got H=3 \(q.shape\[2\]\), HV=3"):
        cp.forward("headwise", "gdn", *xs, group=None, ctx=ctx)
    with pytest.raises(ValueError, match=r"v.shape\[2\] \(value heads HV\) must be a multiple of q.shape\[2\]=3"):
        cp.forward("ring", "gdn", *xs[:2], xs[2][:, :, :2], *xs[3:], group=None, ctx=ctx)
    with pytest.raises(ValueError, match=r"g.shape\[2\] \(heads\) must be 6 \(HV = v.shape\[2\]\)"):
        cp.forward("ring", "gdn", *xs[:2], xs[2].repeat(1, 1, 2, 1), *xs[3:], group=None, ctx=ctx)
    train = [x.clone().requires_grad_() for x in xs]
    with pytest.raises(ValueError, match="mode 'ring' trains on the 'torch' or 'triton' backend"):
        cp.forward("ring", "gdn", *train, group=None, ctx=ctx, backend="reference")
    with pytest.raises(ValueError, match=r"q must be 4-D \[1, 128, ...\]"):
        cp.forward("ring", "gdn", xs[0][:, :100], *xs[1:], group=None, ctx=ctx)
    with pytest.raises(ValueError, match=r"g must be 3-D"):
        cp.forward("ring", "gdn", *xs[:3], xs[3][..., None], xs[4], group=None, ctx=ctx)
    with pytest.raises(ValueError, match="single-device baseline"):
        cp.forward("none", "gdn", *xs, group=None, ctx=ctx)
    with pytest.raises(ValueError, match="runs on one device"):
        cp.forward("warmup_correct", "gdn", *xs, group=None, ctx=ctx)
    with pytest.raises(ValueError, match="ctx must be a CPContext"):
        cp.forward("ring", "gdn", *xs, group=None, ctx={"world_size": 2})
    ctx1 = cp.build_context([0, 256], 1, 0)
    q, k, v, g, beta, _ = make_inputs("gdn", (256,), H=2, K=16, V=16)
    with pytest.raises(ValueError, match="unknown option 'segments' for mode 'none'"):
        cp.forward("none", "gdn", q, k, v, g, beta, group=None, ctx=ctx1, options={"segments": 2})
    with pytest.raises(ValueError, match="segment_len must be None, 'auto' or an int >= 1"):
        cp.forward("none", "gdn", q, k, v, g, beta, group=None, ctx=ctx1, options={"segment_len": 0})


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"tol": 0.0}, r"tol must be a float in \(0, 1\)"),
        ({"tol": 2.0}, r"tol must be a float in \(0, 1\)"),
        ({"segments": 0}, "segments must be 'auto' or an int >= 1"),
        ({"window": 0}, "window must be 'auto' or an int >= 1"),
        ({"fallback": "select"}, "fallback must be one of"),
        ({"cu_seqlens": [0, 100]}, "T = cu_seqlens"),
        ({"cu_seqlens": torch.tensor([0, 256], device="meta")}, "would sync"),
    ],
)
def test_warmup_correct_errors(kwargs: dict, match: str) -> None:
    q, k, v, g, beta, _ = make_inputs("kda", (256,), H=2, K=16, V=16)
    args = {"cu_seqlens": [0, 256]} | kwargs
    with pytest.raises(ValueError, match=match):
        cp.warmup_correct("kda", q, k, v, g, beta, backend="torch", **args)
