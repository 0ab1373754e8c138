"""The forward's kept factors for GDN's reverse-walk backward (Ag, the gate cumsum, the chunk states), built by the
torch Ag form (`kernels.common.reverse_bwd_torch`): the inputs of `reverse_walk` and of the TileLang kernel it
mirrors, for their tests; and the ranges of the forward walk's tests (`forward_ranges`)."""

from __future__ import annotations

import torch
from torch import Tensor

from kernels.common.chunk_torch import compute_dtype, from_chunks, to_chunks
from kernels.common.index import prepare_chunk_index
from kernels.common.reverse_bwd_torch import _factors, chunk_states

__all__ = ["forward_ranges", "kept_for_walk"]


def kept_for_walk(
    q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, h0: Tensor, cu: list[int], C: int, scale: float
) -> tuple[Tensor, Tensor, Tensor, list[int]]:
    """(Ag `[1, T, H, C]`, gate cumsum `[1, T, H]`, the chunk states `[NT, H, K, V]` entering each chunk, the first
    chunk of each sequence) as the forward keeps them, by the torch Ag form (q, k with Hk heads, v with H), in the
    inputs' compute dtype and device (B = 1, sequences bounded by cu)."""
    T, grp = v.shape[1], v.shape[2] // k.shape[2]
    index = prepare_chunk_index(torch.tensor(cu, device=q.device), batch=1, seq_len=T, chunk_size=C, device=q.device)
    cd = compute_dtype(q)
    xs = [to_chunks(x, index, cd) for x in (q.repeat_interleave(grp, 2), k.repeat_interleave(grp, 2), v, g, beta)]
    f = _factors(xs[0], xs[1], xs[3], xs[4], scale)
    h = chunk_states(*xs, h0.to(cd), index=index, scale=scale)
    first = [sum(-(-(cu[i + 1] - cu[i]) // C) for i in range(n)) for n in range(len(cu) - 1)]
    return from_chunks(f["Ag"], index, 1, T), from_chunks(f["G"], index, 1, T), h, first


def forward_ranges(cu: list[int], first: list[int], h: Tensor, span: int, C: int) -> dict[str, Tensor]:
    """The forward walk's arguments for sequences bounded by cu walked in ranges of `span` tokens (chunk-aligned), the
    programs in reverse order: "cu" the range bounds, "co" each range's first chunk, "pmap" (program p walks range
    P - 1 - p), "fin" (each sequence's last range stores its final state at the sequence's index, the others none) and
    "h0" each program's entering state (the kept chunk state there); int32 and h's device."""
    bounds, offs, fin, entering = [], [], [], []
    for n in range(len(cu) - 1):
        starts = list(range(cu[n], cu[n + 1], span))
        for j, s0 in enumerate(starts):
            bounds.append(s0)
            offs.append(first[n] + (s0 - cu[n]) // C)
            fin.append(n if j == len(starts) - 1 else -1)
            entering.append(h[offs[-1]])
    dev = h.device

    def ints(x: list[int]) -> Tensor:
        return torch.tensor(x, dtype=torch.int32, device=dev)

    return {"cu": ints([*bounds, cu[-1]]), "co": ints(offs), "pmap": ints(list(range(len(fin) - 1, -1, -1))),
            "fin": ints(fin[::-1]), "h0": torch.stack(entering[::-1]).contiguous()}  # fmt: skip
