"""Host chunk index: contents for dense and varlen input, and the identity + version keyed cache."""

from __future__ import annotations

import torch

from kernels.common.index import cu_seqlens_host, prepare_chunk_index


def test_varlen_index_contents() -> None:
    cu = torch.tensor([0, 37, 137, 141, 230], dtype=torch.int64)
    idx = prepare_chunk_index(cu, batch=1, seq_len=230, chunk_size=64)
    assert idx.is_varlen and idx.num_seqs == 4 and idx.num_chunks == 6 and idx.max_chunks == 2
    assert idx.cu_seqlens.dtype == torch.int32 and idx.cu_seqlens.tolist() == [0, 37, 137, 141, 230]
    assert idx.chunk_offsets.tolist() == [0, 1, 3, 4, 6]
    assert idx.chunk_indices.tolist() == [[0, 0], [1, 0], [1, 1], [2, 0], [3, 0], [3, 1]]
    pad = idx.pad
    assert not pad.identity and pad.gather.numel() == 6 * 64 and pad.scatter.numel() == 230
    # every token lands on its own padded row and comes back
    assert torch.equal(pad.gather[pad.scatter], torch.arange(230))
    assert int((pad.gather == 230).sum()) == 6 * 64 - 230


def test_dense_index_is_equal_length_varlen() -> None:
    idx = prepare_chunk_index(None, batch=3, seq_len=100)
    assert not idx.is_varlen and idx.cu_seqlens.tolist() == [0, 100, 200, 300]
    assert idx.chunk_indices.tolist() == [[n, j] for n in range(3) for j in range(2)]
    assert prepare_chunk_index(None, batch=2, seq_len=128).pad.identity


def test_cache_by_identity_and_version() -> None:
    cu = torch.tensor([0, 10, 70], dtype=torch.int32)
    a = prepare_chunk_index(cu, batch=1, seq_len=70)
    assert prepare_chunk_index(cu, batch=1, seq_len=70) is a
    # an equal-valued but different tensor builds its own entry; an in-place change misses the cache
    assert prepare_chunk_index(cu.clone(), batch=1, seq_len=70) is not a
    cu[1] = 20
    b = prepare_chunk_index(cu, batch=1, seq_len=70)
    assert b is not a and b.cu_seqlens_cpu == [0, 20, 70]


def test_host_copy_is_used() -> None:
    # a given host copy is what is read (the device tensor is not touched): meta tensors hold no data
    cu = torch.empty(3, dtype=torch.int32, device="meta")
    assert cu_seqlens_host(cu, [0, 5, 9]) == [0, 5, 9]
    assert cu_seqlens_host(cu) == [0, 5, 9]   # remembered for this tensor
