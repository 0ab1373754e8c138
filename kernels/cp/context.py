"""Partition context of a CP step: built once on the host from the GLOBAL `cu_seqlens`, cached, read by every scheme.

The global token axis (B = 1 varlen, T tokens) is cut into equal *parts*, the links of the state chain in
global token order: W parts for the `contiguous` layout (rank r holds part r), 2W parts for `zigzag`
(rank r holds part r, its *front* slot, and part 2W-1-r, its *back* slot; its local tokens are
`[front; back]`). A sequence may cross any number of part boundaries.

For every part the context knows its *pieces* (the intersections of sequences with the part), whether its
first piece continues a sequence from the previous part (`cont`) and whether its last piece carries a
sequence on to the next part (`carries`); for a continued piece, the chain of predecessor parts whose
summaries fold into its initial state. Every rank builds the same global facts, so a scheme also knows
what every other rank will send or expect. Nothing here touches a device tensor except the cached
host-to-device copies of the bounds (`ctx.device_tensor`), made once per device.

    ctx = build_context([0, 300, 512], world_size=2, rank=1, layout="zigzag")
    ctx.local_cu_seqlens    # rank-local bounds over [front; back], e.g. (0, 128, 172, 256)
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor

from kernels.vocabulary import LAYOUTS

__all__ = ["LAYOUTS", "CPContext", "Piece", "Slot", "build_context", "host_bounds"]

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Piece:
    """The part of one global sequence that lies in one part, in the rank's local token coordinates."""

    start: int      # local token offset of the first token
    end: int        # local token offset past the last token
    seq: int        # global sequence id
    cont: bool      # the sequence started in an earlier part: the initial state comes from predecessors
    carries: bool   # the sequence goes on in a later part: the final state is needed by a successor

    @property
    def length(self) -> int:
        return self.end - self.start


@dataclass(frozen=True)
class Slot:
    """One part held by this rank (contiguous: one slot; zigzag: front slot 0 and back slot 1)."""

    part: int                    # global part index = position in the chain
    global_start: int            # global token interval [global_start, global_end)
    global_end: int
    offset: int                  # local token offset of the slot
    pieces: tuple[Piece, ...]
    preds: tuple[int, ...]       # parts (chain order) whose last pieces precede the first piece, () unless cont
    next_part: int | None        # the part that continues the last piece's sequence, None unless carries

    @property
    def first(self) -> Piece:
        return self.pieces[0]

    @property
    def last(self) -> Piece:
        return self.pieces[-1]


@dataclass(frozen=True, eq=False)
class CPContext:
    """Everything a scheme step needs about the partition, computed on the host (see the module docstring).

    Global facts (identical on every rank): `cu_seqlens`, `total_len`, `num_parts`, `part_len`, `part_owner`
    (part -> (rank, slot)), `part_cont`/`part_carries` (per part), `part_preds` (per part: the predecessor
    chain of its first piece). Rank facts: `slots`, `local_len`, `local_cu_seqlens`.
    """

    world_size: int
    rank: int
    layout: str
    cu_seqlens: tuple[int, ...]
    total_len: int
    num_parts: int
    part_len: int
    part_owner: tuple[tuple[int, int], ...]
    part_cont: tuple[bool, ...]
    part_carries: tuple[bool, ...]
    part_preds: tuple[tuple[int, ...], ...]
    slots: tuple[Slot, ...]
    local_len: int
    local_cu_seqlens: tuple[int, ...]
    _device_cache: dict[tuple[str, str], Tensor] = field(default_factory=dict, repr=False, compare=False)

    @property
    def num_seqs(self) -> int:
        return len(self.cu_seqlens) - 1

    @property
    def slots_per_rank(self) -> int:
        return 2 if self.layout == "zigzag" else 1

    @property
    def pieces(self) -> tuple[Piece, ...]:
        """The rank's local pieces in local token order (the sequences of `local_cu_seqlens`)."""
        return tuple(p for s in self.slots for p in s.pieces)

    @property
    def any_crossing(self) -> bool:
        """Whether any sequence crosses a part boundary (else every part is independent)."""
        return any(self.part_carries)

    def parts_of(self, rank: int) -> tuple[int, ...]:
        """The global parts held by `rank`, in its slot order."""
        return _parts_of(rank, self.world_size, self.layout)

    def device_tensor(self, name: str, device: torch.device | str) -> Tensor:
        """A cached int32 device copy of a host bound list: `local_cu_seqlens` or `cu_seqlens` (one H2D copy per device)."""
        dev = torch.device(device)
        key = (name, str(dev))
        t = self._device_cache.get(key)
        if t is None:
            values = {"local_cu_seqlens": self.local_cu_seqlens, "cu_seqlens": self.cu_seqlens}[name]
            t = torch.tensor(values, dtype=torch.int32, device=dev)
            self._device_cache[key] = t
        return t

    def index(self, name: str, values: Sequence[int], device: torch.device | str) -> Tensor:
        """A cached int64 device tensor of host `values` under `name` (a scheme's static gather/scatter index)."""
        dev = torch.device(device)
        key = ("index:" + name, str(dev))
        t = self._device_cache.get(key)
        if t is None:
            t = torch.tensor(list(values), dtype=torch.int64, device=dev)
            self._device_cache[key] = t
        return t


def _parts_of(rank: int, world_size: int, layout: str) -> tuple[int, ...]:
    return (rank, 2 * world_size - 1 - rank) if layout == "zigzag" else (rank,)


def _check_int(name: str, x: object) -> int:
    if isinstance(x, bool) or not isinstance(x, int):
        raise ValueError(f"{name} must be an int, got {name}={x!r}")
    return x


def host_bounds(cu_seqlens: object) -> tuple[int, ...]:
    """Bounds as a host tuple of ints from a CPU int tensor or a sequence; a device tensor is refused (it would sync)."""
    if isinstance(cu_seqlens, Tensor):
        if cu_seqlens.device.type != "cpu":
            raise ValueError(
                f"cu_seqlens must be a host tensor or a list (reading a {cu_seqlens.device} tensor would sync), "
                f"got a tensor on {cu_seqlens.device}; pass cu_seqlens.cpu() once, outside the step"
            )
        if cu_seqlens.dim() != 1 or cu_seqlens.dtype.is_floating_point or cu_seqlens.dtype == torch.bool:
            raise ValueError(f"cu_seqlens must be a 1-D integer tensor, got shape={tuple(cu_seqlens.shape)} dtype={cu_seqlens.dtype}")
        return tuple(int(x) for x in cu_seqlens.tolist())
    if isinstance(cu_seqlens, Sequence) and not isinstance(cu_seqlens, (str, bytes)):
        out = []
        for i, x in enumerate(cu_seqlens):
            if isinstance(x, bool) or not isinstance(x, int):
                raise ValueError(f"cu_seqlens must hold ints, got cu_seqlens[{i}]={x!r}")
            out.append(x)
        return tuple(out)
    raise ValueError(f"cu_seqlens must be a host int tensor or a sequence of ints, got {type(cu_seqlens).__name__}")


def build_context(cu_seqlens: Tensor | Sequence[int], world_size: int, rank: int, layout: str = "contiguous") -> CPContext:
    """The (cached) partition context of `rank` in a CP group of `world_size` ranks.

    Args:
        cu_seqlens (torch.Tensor | Sequence[int]):
            GLOBAL int bounds `[N+1]` of the B = 1 varlen batch, on the host (a CUDA tensor is refused: reading it
            would sync). Every rank passes the same values.
        world_size (int):
            CP size W >= 1.
        rank (int):
            this rank, 0 <= rank < W.
        layout (str):
            `"contiguous"` (rank r holds tokens [r T/W, (r+1) T/W)) or `"zigzag"` (2W equal parts; rank r holds parts
            r and 2W-1-r). Default: `"contiguous"`.

    Returns:
        CPContext: cached by (bounds, W, rank, layout), so a step that calls this again pays a dict lookup.

    Raises:
        ValueError: cu_seqlens not starting at 0, decreasing, holding an empty sequence or fewer than 2 entries;
            W < 1; rank out of range; unknown layout; total tokens not divisible by W (2W for zigzag).
    """
    bounds = host_bounds(cu_seqlens)
    return _build_context(bounds, _check_int("world_size", world_size), _check_int("rank", rank), layout)


@functools.lru_cache(maxsize=256)
def _build_context(cu: tuple[int, ...], W: int, rank: int, layout: str) -> CPContext:
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got layout={layout!r}")
    if W < 1:
        raise ValueError(f"world_size must be >= 1, got world_size={W}")
    if not 0 <= rank < W:
        raise ValueError(f"rank must satisfy 0 <= rank < world_size={W}, got rank={rank}")
    if len(cu) < 2:
        raise ValueError(f"cu_seqlens needs >= 2 entries [0, ..., T], got cu_seqlens={list(cu)}")
    if cu[0] != 0:
        raise ValueError(f"cu_seqlens must start at 0, got cu_seqlens[0]={cu[0]}")
    for i in range(len(cu) - 1):
        if cu[i + 1] <= cu[i]:
            raise ValueError(f"cu_seqlens must be strictly increasing (no empty sequence), got cu_seqlens[{i}]={cu[i]} "
                             f">= cu_seqlens[{i + 1}]={cu[i + 1]}")
    T = cu[-1]
    nparts = 2 * W if layout == "zigzag" else W
    if T % nparts != 0:
        raise ValueError(f"total tokens T={T} must be divisible by {'2W' if layout == 'zigzag' else 'W'}={nparts} "
                         f"(world_size={W}, layout={layout!r}); pad the batch")
    P = T // nparts

    # global facts: per part, its pieces as (global start, global end, seq, cont, carries)
    import bisect

    part_pieces: list[list[tuple[int, int, int, bool, bool]]] = []
    for p in range(nparts):
        a, b = p * P, (p + 1) * P
        s = bisect.bisect_right(cu, a) - 1         # sequence holding token a
        pieces = []
        while s < len(cu) - 1 and cu[s] < b:
            lo, hi = max(cu[s], a), min(cu[s + 1], b)
            pieces.append((lo, hi, s, cu[s] < a, cu[s + 1] > b))
            s += 1
        part_pieces.append(pieces)
    part_cont = tuple(pp[0][3] for pp in part_pieces)
    part_carries = tuple(pp[-1][4] for pp in part_pieces)
    part_preds = tuple(tuple(range(cu[pp[0][2]] // P, p)) if pp[0][3] else () for p, pp in enumerate(part_pieces))
    owner: list[tuple[int, int]] = [(0, 0)] * nparts
    for r in range(W):
        for slot, p in enumerate(_parts_of(r, W, layout)):
            owner[p] = (r, slot)

    slots = []
    offset = 0
    local_cu = [0]
    for p in _parts_of(rank, W, layout):
        a = p * P
        pieces = tuple(Piece(offset + lo - a, offset + hi - a, s, c, y) for lo, hi, s, c, y in part_pieces[p])
        slots.append(Slot(part=p, global_start=a, global_end=a + P, offset=offset, pieces=pieces,
                          preds=part_preds[p], next_part=p + 1 if part_carries[p] else None))
        local_cu.extend(pc.end for pc in pieces)
        offset += P
    ctx = CPContext(world_size=W, rank=rank, layout=layout, cu_seqlens=cu, total_len=T, num_parts=nparts, part_len=P,
                    part_owner=tuple(owner), part_cont=part_cont, part_carries=part_carries, part_preds=part_preds,
                    slots=tuple(slots), local_len=offset, local_cu_seqlens=tuple(local_cu))
    logger.debug("built CP context W=%s rank=%s layout=%s T=%s: local cu %s", W, rank, layout, T, ctx.local_cu_seqlens)
    return ctx
