"""Host-side chunk metadata from `cu_seqlens`, computed once and cached; nothing here runs in a step.

A call with `cu_seqlens` (varlen, B == 1) or without (dense, B sequences of length T) is described by a
`ChunkIndex`: the sequence bounds on the device, their host copy, and for every chunk of every sequence
its (sequence id, chunk id) pair. Triton launchers read `chunk_indices`/`chunk_offsets` on the device;
the torch path reads the padding maps of `PadIndex`.

Host syncs: the values of `cu_seqlens` are needed on the host exactly once per tensor. When the tensor
is on the CPU that costs nothing; when it lives on a GPU the first `prepare_chunk_index` copies it to
the host (one device-to-host sync) and every later call with the same tensor object (same identity,
not modified in place since) hits the cache. Callers that build a new `cu_seqlens` every step should
pass its CPU copy as `cu_seqlens_cpu` so that not even the first call syncs. An inference tensor (made under
`torch.inference_mode()`) has no version counter: it is keyed by its values when they are on the host (a CPU
tensor, or `cu_seqlens_cpu` given), else by identity alone, as FLA does (refill one in place: pass cu_seqlens_cpu).
"""

from __future__ import annotations

import functools
import logging
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

__all__ = ["ChunkIndex", "PadIndex", "cu_seqlens_host", "prepare_chunk_index"]

logger = logging.getLogger(__name__)

# how many distinct cu_seqlens tensors / shapes are remembered (a training job alternates between few)
_CACHE_SIZE = 64


@dataclass(eq=False)
class ChunkIndex:
    """Chunk layout of one batch (dense: B sequences of length T; varlen: the sequences of `cu_seqlens`).

    cu_seqlens: int32 `[N+1]` on the data's device (for dense input: `arange(B+1) * T`).
    cu_seqlens_cpu: the same bounds as a host list of N+1 ints.
    chunk_offsets: int32 `[N+1]` on the device; sequence n owns global chunks [chunk_offsets[n], chunk_offsets[n+1]).
    chunk_indices: int32 `[NT_total, 2]` on the device; row c = (sequence id, chunk id within the sequence).
    num_seqs: N.  num_chunks: NT_total.  chunk_size: C.  seq_len: T of the flattened token axis.
    is_varlen: True when built from a caller's `cu_seqlens` (kernels then read the bounds), else dense.
    """

    cu_seqlens: Tensor
    cu_seqlens_cpu: list[int]
    chunk_offsets: Tensor
    chunk_indices: Tensor
    num_seqs: int
    num_chunks: int
    chunk_size: int
    seq_len: int
    is_varlen: bool
    chunk_offsets_cpu: list[int] = field(default_factory=list)

    @property
    def device(self) -> torch.device:
        return self.cu_seqlens.device

    @property
    def max_chunks(self) -> int:
        """Chunks of the longest sequence: the length of the serial state pass."""
        return max((b - a for a, b in zip(self.chunk_offsets_cpu[:-1], self.chunk_offsets_cpu[1:], strict=True)), default=0)

    @functools.cached_property
    def pad(self) -> PadIndex:
        """Gather/scatter maps that pad every sequence to a multiple of the chunk size (built once)."""
        return _build_pad_index(self)


@dataclass(eq=False)
class PadIndex:
    """Maps between the flat token axis (B*T rows) and the padded chunk layout (NT_total*C rows).

    gather: int64 `[NT_total*C]`; padded row -> flat token row, or B*T (a zero row the caller appends) for padding.
    scatter: int64 `[B*T]`; flat token row -> padded row.
    steps: per chunk position j of the serial pass, (seq_ids, chunk_ids) int64 device tensors of the sequences
        that have a j-th chunk, or None in place of seq_ids when all sequences do (no gather needed).
    identity: True when no padding is needed (dense input with T % C == 0): then gather/scatter are the identity.
    """

    gather: Tensor
    scatter: Tensor
    steps: list[tuple[Tensor | None, Tensor]]
    identity: bool


# ----------------------------------------------------------------------------------------------------------------------
# identity + version keyed caches (in the spirit of FLA's tensor_cache): the tensor object itself is kept in the entry,
# so its id cannot be recycled while the entry lives; an in-place change bumps `_version` and misses the cache.

_HOST_CACHE: OrderedDict[tuple[Any, ...], tuple[Tensor, list[int]]] = OrderedDict()
_INDEX_CACHE: OrderedDict[tuple[Any, ...], tuple[Tensor | None, ChunkIndex]] = OrderedDict()


def _remember(cache: OrderedDict, key: tuple[Any, ...], value: Any) -> None:
    cache[key] = value
    cache.move_to_end(key)
    while len(cache) > _CACHE_SIZE:
        cache.popitem(last=False)


def _version(t: Tensor) -> int | None:
    """The tensor's version counter; None for an inference tensor (made under `torch.inference_mode()`), which has
    none: such a GPU tensor is cached by identity alone, as FLA caches its indices (a CPU one by its values)."""
    return None if t.is_inference() else t._version


def cu_seqlens_host(cu_seqlens: Tensor, cu_seqlens_cpu: Tensor | Sequence[int] | None = None) -> list[int]:
    """The values of `cu_seqlens` as a host list, read at most once per tensor (see the module docstring).

    `cu_seqlens_cpu`, when given, is trusted to hold the same values and is used instead of the device tensor.
    """
    if cu_seqlens_cpu is not None:
        if isinstance(cu_seqlens_cpu, Tensor):
            if cu_seqlens_cpu.device.type != "cpu":
                raise ValueError(f"cu_seqlens_cpu must be a host (CPU) tensor or a list, got device {cu_seqlens_cpu.device}")
            values = [int(x) for x in cu_seqlens_cpu.tolist()]
        else:
            values = [int(x) for x in cu_seqlens_cpu]
        if cu_seqlens.device.type != "cpu":
            # later calls with the same device tensor (e.g. from a launcher that was not handed the copy) hit this entry
            _remember(_HOST_CACHE, (id(cu_seqlens), _version(cu_seqlens)), (cu_seqlens, values))
        return values
    if cu_seqlens.device.type == "cpu":
        return [int(x) for x in cu_seqlens.tolist()]
    key = (id(cu_seqlens), _version(cu_seqlens))
    hit = _HOST_CACHE.get(key)
    if hit is not None and hit[0] is cu_seqlens:
        _HOST_CACHE.move_to_end(key)
        return hit[1]
    # the one device-to-host copy of this tensor's life (pass cu_seqlens_cpu to avoid it)
    logger.debug("cu_seqlens on %s copied to the host once; pass cu_seqlens_cpu to avoid the sync", cu_seqlens.device)
    values = [int(x) for x in cu_seqlens.tolist()]
    _remember(_HOST_CACHE, key, (cu_seqlens, values))
    return values


def prepare_chunk_index(
    cu_seqlens: Tensor | None,
    *,
    batch: int,
    seq_len: int,
    chunk_size: int = 64,
    device: torch.device | str | None = None,
    cu_seqlens_cpu: Tensor | Sequence[int] | None = None,
) -> ChunkIndex:
    """The (cached) `ChunkIndex` of a batch.

    Args:
        cu_seqlens: int `[N+1]` sequence bounds (varlen, then batch must be 1), or None for dense input.
        batch, seq_len: B and T of the `[B, T, ...]` inputs.
        chunk_size: C (64 by default; the Triton kernels take 16, 32 and 64, `kernels.common.wy.CHUNK_SIZES`).
        device: where the index tensors live (the data's device); defaults to cu_seqlens' device, else CPU.
        cu_seqlens_cpu: optional host copy of cu_seqlens (list or CPU tensor) so no device data is read.

    The values are assumed valid (kernels.validate checks them before any launch).
    """
    dev = torch.device(device) if device is not None else (cu_seqlens.device if cu_seqlens is not None else torch.device("cpu"))
    if cu_seqlens is None:
        key: tuple[Any, ...] = ("dense", batch, seq_len, chunk_size, str(dev))
        hit = _INDEX_CACHE.get(key)
        if hit is not None:
            _INDEX_CACHE.move_to_end(key)
            return hit[1]
        bounds = [i * seq_len for i in range(batch + 1)]
        index = _build_index(bounds, None, chunk_size=chunk_size, seq_len=seq_len, device=dev, is_varlen=False)
        _remember(_INDEX_CACHE, key, (None, index))
        return index
    # a given cu_seqlens_cpu is trusted to match the tensor, so identity + version of the tensor is the whole key
    version: Any = _version(cu_seqlens)
    if version is None and (cu_seqlens_cpu is not None or cu_seqlens.device.type == "cpu"):
        version = tuple(cu_seqlens_host(cu_seqlens, cu_seqlens_cpu))  # host values, free here, stand in for it
    key = ("varlen", id(cu_seqlens), version, batch, seq_len, chunk_size, str(dev))
    hit = _INDEX_CACHE.get(key)
    if hit is not None and hit[0] is cu_seqlens:
        _INDEX_CACHE.move_to_end(key)
        return hit[1]
    bounds = cu_seqlens_host(cu_seqlens, cu_seqlens_cpu)
    index = _build_index(bounds, cu_seqlens, chunk_size=chunk_size, seq_len=seq_len, device=dev, is_varlen=True)
    _remember(_INDEX_CACHE, key, (cu_seqlens, index))
    return index


def _build_index(
    bounds: list[int], cu_seqlens: Tensor | None, *, chunk_size: int, seq_len: int, device: torch.device, is_varlen: bool
) -> ChunkIndex:
    lens = [b - a for a, b in zip(bounds[:-1], bounds[1:], strict=True)]
    counts = [-(-n // chunk_size) for n in lens]
    offsets = [0]
    for c in counts:
        offsets.append(offsets[-1] + c)
    pairs = [(n, j) for n, c in enumerate(counts) for j in range(c)]
    if cu_seqlens is not None and cu_seqlens.dtype == torch.int32 and cu_seqlens.device == device:
        cu_dev = cu_seqlens
    else:
        # host -> device copies only (no sync): built from the host list, not from the device tensor
        cu_dev = torch.tensor(bounds, dtype=torch.int32, device=device)
    return ChunkIndex(
        cu_seqlens=cu_dev,
        cu_seqlens_cpu=list(bounds),
        chunk_offsets=torch.tensor(offsets, dtype=torch.int32, device=device),
        chunk_indices=torch.tensor(pairs, dtype=torch.int32, device=device).reshape(len(pairs), 2),
        num_seqs=len(lens),
        num_chunks=offsets[-1],
        chunk_size=chunk_size,
        seq_len=seq_len,
        is_varlen=is_varlen,
        chunk_offsets_cpu=offsets,
    )


def _build_pad_index(index: ChunkIndex) -> PadIndex:
    C, bounds, offsets = index.chunk_size, index.cu_seqlens_cpu, index.chunk_offsets_cpu
    total = bounds[-1] - bounds[0]
    sentinel = total  # the appended zero row
    gather = torch.full((index.num_chunks, C), sentinel, dtype=torch.int64)
    scatter = torch.empty(total, dtype=torch.int64)
    for n in range(index.num_seqs):
        bos, eos, c0 = bounds[n], bounds[n + 1], offsets[n]
        length = eos - bos
        if length == 0:
            continue
        rows = torch.arange(length, dtype=torch.int64)
        padded = c0 * C + rows
        gather.view(-1)[padded] = bos - bounds[0] + rows
        scatter[bos - bounds[0] : eos - bounds[0]] = padded
    counts = [b - a for a, b in zip(offsets[:-1], offsets[1:], strict=True)]
    steps: list[tuple[Tensor | None, Tensor]] = []
    for j in range(index.max_chunks):
        seqs = [n for n, c in enumerate(counts) if c > j]
        chunk_ids = torch.tensor([offsets[n] + j for n in seqs], dtype=torch.int64, device=index.device)
        seq_ids = None if len(seqs) == index.num_seqs else torch.tensor(seqs, dtype=torch.int64, device=index.device)
        steps.append((seq_ids, chunk_ids))
    identity = index.num_chunks * C == total and bool(torch.equal(gather.view(-1), torch.arange(total)))
    return PadIndex(gather=gather.view(-1).to(index.device), scatter=scatter.to(index.device), steps=steps, identity=identity)
