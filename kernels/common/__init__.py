"""Code shared by GDN and KDA: host chunk index, the chunked torch path, segment transitions (and the Triton kernels)."""

from kernels.common.index import ChunkIndex, PadIndex, cu_seqlens_host, prepare_chunk_index

__all__ = ["ChunkIndex", "PadIndex", "cu_seqlens_host", "prepare_chunk_index"]
