"""The rows a kernel benchmark runs (`cpbench bench kernels` / `bench train`): shapes x value heads x gate
strengths, most important first, named presets of them, and the deadline that stops a run cleanly.

    --shapes 1x8192,8x8192 --hv 16,32 --lb=-5,-1     # explicit lists (B x T; value heads; gates lb * sigmoid(randn))
    --preset issue26                                  # issue 26's grid: the five shapes x HV 16, 32 x lb -5, -1

Rows are ordered by importance, so a run cut by its deadline has measured what matters most: the first HV and the
first lb of the lists (a preset lists them in its order), then the shapes in `SHAPE_ORDER`'s order (the long B=1
sequences, where the intra-device split decides, first). `Deadline`: the first row always runs; a later row
starts only if the elapsed time plus the longest row so far (its libraries' first calls left out: compile and
autotune are paid once) stays within the budget; the rows left are reported as cut, and the report is written after
every row.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

__all__ = ["PRESETS", "SHAPE_ORDER", "Case", "Deadline", "expand_cases", "parse_floats", "parse_shapes"]

# the shapes in the order they are run: the long B=1 sequences first (issue 26: 1x128K and 1x32K lead)
SHAPE_ORDER = ((1, 131072), (1, 32768), (1, 65536), (8, 8192), (1, 8192))


@dataclass(frozen=True)
class Preset:
    """A named grid: shapes (B, T), value heads and gate strengths, each in its order of importance."""

    shapes: tuple[tuple[int, int], ...]
    hv: tuple[int, ...]
    lb: tuple[float | None, ...]


PRESETS = {
    # issue 26's targets: B=1 T in {8K, 32K, 64K, 128K}, B=8 T=8K; HV in {16, 32}; lb in {-5, -1} (-1 first)
    "issue26": Preset(shapes=SHAPE_ORDER, hv=(16, 32), lb=(-1.0, -5.0)),
}


@dataclass(frozen=True)
class Case:
    """One row of the grid: B sequences of T tokens, HV value heads (H query/key heads), gates lb * sigmoid(randn)
    (None: FLA's logsigmoid(randn))."""

    B: int
    T: int
    HV: int
    lb: float | None

    @property
    def label(self) -> str:
        gate = "logsigmoid" if self.lb is None else f"lb={self.lb:g}"
        return f"{self.B}x{self.T} HV={self.HV} {gate}"


def parse_shapes(text: str) -> tuple[tuple[int, int], ...]:
    """`"1x8192,8x8192"` -> ((1, 8192), (8, 8192)); a one-line ValueError for a bad item."""
    out = []
    for item in (s.strip() for s in text.split(",") if s.strip()):
        try:
            B, T = (int(x) for x in item.lower().split("x"))
        except ValueError:
            raise ValueError(f"--shapes: {item!r} is not BxT (e.g. 1x8192)") from None
        if B < 1 or T < 1:
            raise ValueError(f"--shapes: {item!r} needs B >= 1 and T >= 1")
        out.append((B, T))
    return tuple(out)


def parse_floats(text: str | None, what: str) -> tuple[float, ...]:
    """`"-5,-1"` -> (-5.0, -1.0) (None or "" -> ()); a one-line ValueError naming the flag `what`."""
    try:
        return tuple(float(x) for x in text.split(",") if x.strip()) if text else ()
    except ValueError:
        raise ValueError(f"{what}: {text!r} is not a comma list of numbers") from None


def expand_cases(
    *,
    preset: str | None = None,
    shapes: Sequence[tuple[int, int]] = (),
    hv: Sequence[int] = (),
    lb: Sequence[float | None] = (),
    H: int = 16,
) -> list[Case]:
    """The rows of a run, most important first: `preset`'s grid, or the given lists (empty: the preset's, else the
    five default shapes, HV = H, lb None); a list given beside a preset replaces the preset's."""
    if preset is not None and preset not in PRESETS:
        raise ValueError(f"--preset: unknown preset {preset!r}; one of {', '.join(PRESETS)}")
    base = PRESETS[preset] if preset else Preset(shapes=SHAPE_ORDER, hv=(H,), lb=(None,))
    shapes = tuple(shapes) or base.shapes
    hvs, lbs = tuple(hv) or base.hv, tuple(lb) or base.lb
    for n in hvs:
        if n < H or n % H:
            raise ValueError(f"--hv: value heads must be a multiple of the {H} query/key heads, got {n}")
    rank = {s: i for i, s in enumerate(SHAPE_ORDER)}
    ordered = sorted(dict.fromkeys(shapes), key=lambda s: (rank.get(s, len(rank)), shapes.index(s)))
    return [Case(B, T, n, g) for n in dict.fromkeys(hvs) for g in dict.fromkeys(lbs) for B, T in ordered]


class Deadline:
    """A run's time budget in seconds (0: none). The first row always runs; `allows()` a later one only if the
    elapsed time plus the longest row so far stays within it."""

    def __init__(self, seconds: float, clock: Callable[[], float] = time.monotonic) -> None:
        self.seconds, self.clock = float(seconds), clock
        self.start = clock()
        self.longest: float | None = None  # None: no row finished yet
        self.row_start = self.start

    def elapsed(self) -> float:
        return self.clock() - self.start

    def allows(self) -> bool:
        """Whether the next row may start (and, if so, its clock starts now)."""
        ok = self.seconds <= 0 or self.longest is None or self.elapsed() + self.longest <= self.seconds
        if ok:
            self.row_start = self.clock()
        return ok

    def done(self, first_calls_s: float = 0.0) -> float:
        """Close the row started by the last `allows()`: its seconds. `first_calls_s`: what its libraries' first calls
        (compile, autotune) took, left out of the estimate of the rows after it (they find the caches warm)."""
        took = self.clock() - self.row_start
        self.longest = max(self.longest or 0.0, took - first_calls_s)
        return took

    def why(self) -> str:
        return (
            f"cut by the deadline: {self.elapsed():.0f} s elapsed + {self.longest or 0:.0f} s (the longest row) "
            f"> {self.seconds:g} s"
        )
