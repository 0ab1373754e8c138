"""The torch-free vocabulary (kernels.vocabulary) against the code that acts on it.

Scenarios: the pure collective count equals `kernels.cp.expected_collectives` for every mode, direction and
tail_exchange fallback over several partitions (dense, crossing, aligned; contiguous and zigzag; W = 1, 2, 3, 4),
and, merged over the ranks, the dashboards' cost model; ring and tail_exchange post the same hand-offs (the one
fact the count shares between them); the registry, the scheme options, the spec, the profile's phases and the
dtype maps use the vocabulary's names; the two direction concepts are apart.
"""

from __future__ import annotations

import typing

import pytest
import torch

import kernels.cp as cp
import kernels.vocabulary as vocab
from dashboards.cost_model import comm_cost
from kernels.cp import ring, tail_exchange
from runners.profile import PROFILE_DIRECTIONS
from runners.spec import Axes, SweepSpec, parse_spec
from runners.workload import TORCH_DTYPES

PARTITIONS = [  # (sequence lengths, W, layout)
    ((512,), 1, "contiguous"),
    ((512,), 2, "contiguous"),
    ((100, 300, 112), 2, "zigzag"),
    ((100, 300, 110), 3, "contiguous"),
    ((128, 128, 128, 128), 4, "contiguous"),
    ((128, 128, 128, 128), 2, "zigzag"),
    ((37, 200, 19, 256), 4, "zigzag"),
]
OPTIONS = [None, {"fallback": "none"}, {"fallback": "true_cp"}, {"window": 3}]


def _bounds(lengths: tuple[int, ...]) -> list[int]:
    out = [0]
    for n in lengths:
        out.append(out[-1] + n)
    return out


def _contexts() -> list[cp.CPContext]:
    return [cp.build_context(_bounds(lens), W, r, layout) for lens, W, layout in PARTITIONS for r in range(W)]


@pytest.mark.parametrize("mode", vocab.MODES)
@pytest.mark.parametrize("direction", vocab.COUNTED_DIRECTIONS)
def test_the_pure_count_is_the_kernels_count(mode: str, direction: str) -> None:
    for ctx in _contexts():
        sends, recvs = ring.p2p_counts(ctx)
        for options in OPTIONS if mode == "tail_exchange" else [None]:
            pure = vocab.collective_count(mode, crossing=ctx.any_crossing, sends=sends, recvs=recvs, options=options,
                                          direction=direction)
            assert pure == cp.expected_collectives(mode, ctx, options, direction), (ctx, options)


def test_ring_and_tail_exchange_post_the_same_hand_offs() -> None:
    for ctx in _contexts():
        assert ring.p2p_counts(ctx) == tail_exchange.p2p_counts(ctx), ctx


@pytest.mark.parametrize("mode", vocab.MODES)
@pytest.mark.parametrize("direction", vocab.COUNTED_DIRECTIONS)
def test_the_gang_count_is_the_cost_models(mode: str, direction: str) -> None:
    for lengths, W, layout in PARTITIONS:
        gang, _ = cp.expected_collectives_gang(mode, _bounds(lengths), W, layout, direction=direction)
        model = comm_cost(mode, B=1, T=sum(lengths), H=2, K=16, V=16, W=W, dtype_bytes=2, layout=layout,
                          lengths=lengths, direction=direction, warmup_chunks=2)
        assert model is not None and model.collectives == gang, (lengths, W, layout)


def test_bad_mode_and_direction_are_named() -> None:
    with pytest.raises(ValueError, match="mode must be one of"):
        vocab.collective_count("rings", crossing=True, sends=1, recvs=1)
    with pytest.raises(ValueError, match="direction must be one of"):
        vocab.collective_count("ring", crossing=True, sends=1, recvs=1, direction="bwd+fwd")
    with pytest.raises(ValueError, match="option fallback must be one of"):
        vocab.collective_count("tail_exchange", crossing=True, sends=1, recvs=1, options={"fallback": "ring"})


def test_the_registry_and_the_schemes_use_the_vocabulary() -> None:
    assert tuple(cp.MODES) == vocab.MODES
    for mode, scheme in cp.MODES.items():
        assert dict(scheme.OPTIONS) == dict(vocab.MODE_OPTIONS[mode])
    assert set(vocab.SINGLE_DEVICE) < set(vocab.MODES)
    assert set(vocab.EXACT_MODES) | set(vocab.APPROXIMATE_MODES) == set(vocab.MODES)
    assert not set(vocab.EXACT_MODES) & set(vocab.APPROXIMATE_MODES)
    assert set(vocab.AUTOGRAD_MODES).isdisjoint(vocab.HAND_BACKWARD) and "warmup_correct" not in vocab.AUTOGRAD_MODES


def test_the_two_direction_concepts() -> None:
    """A point asks for the forward or the training step; a profile splits a step into phases; both are counted."""
    assert vocab.POINT_DIRECTIONS == ("fwd", "fwd+bwd") and vocab.PHASES == ("fwd", "bwd")
    assert set(vocab.COUNTED_DIRECTIONS) == set(vocab.POINT_DIRECTIONS) | set(vocab.PHASES)
    assert tuple(PROFILE_DIRECTIONS) == vocab.PHASES
    base = {"name": "d", "ops": "gdn", "modes": "none", "axes": {"T": 64}}
    assert parse_spec({**base, "axes": {"T": 64, "direction": list(vocab.POINT_DIRECTIONS)}})
    with pytest.raises(Exception, match="unknown direction 'bwd'"):
        parse_spec({**base, "axes": {"T": 64, "direction": "bwd"}})


def test_the_spec_and_the_dtype_maps_use_the_vocabulary() -> None:
    def literal(model: type, field: str) -> tuple[str, ...]:
        return typing.get_args(typing.get_args(model.model_fields[field].annotation)[0])

    assert literal(Axes, "dtype") == vocab.DTYPES and literal(Axes, "layout") == vocab.LAYOUTS
    assert literal(SweepSpec, "ops") == vocab.OPS
    assert tuple(TORCH_DTYPES) == vocab.DTYPES
    for name, dt in TORCH_DTYPES.items():
        assert torch.empty(0, dtype=dt).element_size() == vocab.DTYPE_BYTES[name]
    assert vocab.LAYOUTS == cp.LAYOUTS
