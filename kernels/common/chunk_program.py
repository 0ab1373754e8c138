"""Triton helpers shared by the kernels: which chunk a program owns (the chunk-parallel kernels: WY prep, output);
`heuristics`, the launch-time constexprs of every kernel (`triton.heuristics` at a lower host cost); and its entries
`given` (an optional argument's flag) and `group_heads` (G for grouped value heads, every kernel that reads q or k).

Grid convention: program axis `i_c` walks chunks (all sequences' chunks for varlen, the chunks of one batch row
for dense input), `i_b` the batch row (0 for varlen).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import triton
import triton.language as tl
from triton.runtime.autotuner import Heuristics

__all__ = ["chunk_of_program", "given", "group_heads", "heuristics"]


class _Named:
    """The launch's arguments by name without building a dict of all of them (an entry reads one or two): a positional
    argument by its index, else a keyword one or an earlier entry's value."""

    __slots__ = ("args", "kwargs", "index")

    def __init__(self, args: tuple[Any, ...], kwargs: dict[str, Any], index: dict[str, int]) -> None:
        self.args, self.kwargs, self.index = args, kwargs, index

    def __getitem__(self, name: str) -> Any:
        i = self.index.get(name, len(self.args))
        return self.args[i] if i < len(self.args) else self.kwargs[name]


# a launch-time constexpr of the launch's named arguments (read as `args[name]`)
Entries = dict[str, Callable[[_Named], Any]]


class _Heuristics(Heuristics):
    """`triton.heuristics`' wrapper that names the launch's arguments once (`_Named`), not once per entry and per
    stacked decorator: Triton's costs about 3 us per entry on the host (35 arguments), and a short training step
    issues ~15 launches (`benchmarks/host_bound_lab.py`). Same results: each entry sees the arguments and the entries
    before. (Session 21: this wrapper's own time was 23 us a launch under cProfile on a slow H200 host, 13 launches a
    step; without the dict, about 3 % less host time a short step on the CPU.)"""

    def __init__(self, fn: Any, arg_names: list[str], values: Entries) -> None:
        super().__init__(fn, arg_names, values)
        self.index = {name: i for i, name in enumerate(arg_names)}

    def run(self, *args: Any, **kwargs: Any) -> Any:
        named = _Named(args, kwargs, self.index)  # defaults left out are missing, as in Triton's dict
        for name, entry in self.values.items():
            kwargs[name] = entry(named)
        return self.fn.run(*args, **kwargs)


def heuristics(values: Entries) -> Callable[[Any], _Heuristics]:
    """Drop-in for `@triton.heuristics(values)`; stacked ones merge into one wrapper (the outer entries first, as
    Triton evaluates them)."""

    def wrap(fn: Any) -> _Heuristics:
        if isinstance(fn, _Heuristics):
            return _Heuristics(fn.fn, fn.arg_names, {**values, **fn.values})
        return _Heuristics(fn, fn.arg_names, dict(values))

    return wrap


def given(**flags: str) -> dict[str, Callable[[_Named], bool]]:
    """`triton.heuristics` entries FLAG -> "argument `name` is not None", one per keyword (FLAG=name): the optional
    inputs and outputs a kernel specialises on."""
    return {flag: (lambda args, name=name: args[name] is not None) for flag, name in flags.items()}


def group_heads(name: str) -> Callable[[_Named], int]:
    """The `triton.heuristics` entry of G, the value heads per q/k head: argument `name`'s heads (a per-value-head
    tensor, [B, T, HV, ...]) over k's; a kernel reads q and k at head i_h // G."""
    return lambda args: args[name].shape[2] // args["k"].shape[2]


@triton.jit
def chunk_of_program(i_c, i_b, cu_seqlens, chunk_indices, T, BT: tl.constexpr, IS_VARLEN: tl.constexpr):
    """(sequence i_n, chunk i_t within it, global chunk row i_tg, first token bos, sequence length T) of (i_c, i_b)."""
    if IS_VARLEN:
        i_n = tl.load(chunk_indices + i_c * 2).to(tl.int64)
        i_t = tl.load(chunk_indices + i_c * 2 + 1)
        i_tg = i_c.to(tl.int64)
        bos = tl.load(cu_seqlens + i_n).to(tl.int64)
        eos = tl.load(cu_seqlens + i_n + 1).to(tl.int64)
        T = eos - bos
    else:
        i_n = i_b.to(tl.int64)
        i_t = i_c
        i_tg = i_n * tl.cdiv(T, BT) + i_c
        bos = i_n * T
    return i_n, i_t, i_tg, bos, T
