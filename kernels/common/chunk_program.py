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

Entries = dict[str, Callable[[dict[str, Any]], Any]]


class _Heuristics(Heuristics):
    """`triton.heuristics`' wrapper with the launch's argument dict built once, not once per entry and per stacked
    decorator: Triton's costs about 3 us per entry on the host (35 arguments), and a short training step issues ~21
    launches (`benchmarks/host_bound_lab.py`). Same results: each entry sees the arguments and the entries before."""

    def run(self, *args: Any, **kwargs: Any) -> Any:
        named = dict(zip(self.arg_names, args, strict=False))  # defaults may be left out
        named.update(kwargs)
        for name, entry in self.values.items():
            kwargs[name] = named[name] = entry(named)
        return self.fn.run(*args, **kwargs)


def heuristics(values: Entries) -> Callable[[Any], _Heuristics]:
    """Drop-in for `@triton.heuristics(values)`; stacked ones merge into one wrapper (the outer entries first, as
    Triton evaluates them)."""

    def wrap(fn: Any) -> _Heuristics:
        if isinstance(fn, _Heuristics):
            return _Heuristics(fn.fn, fn.arg_names, {**values, **fn.values})
        return _Heuristics(fn, fn.arg_names, dict(values))

    return wrap


def given(**flags: str) -> dict[str, Callable[[dict[str, Any]], bool]]:
    """`triton.heuristics` entries FLAG -> "argument `name` is not None", one per keyword (FLAG=name): the optional
    inputs and outputs a kernel specialises on."""
    return {flag: (lambda args, name=name: args[name] is not None) for flag, name in flags.items()}


def group_heads(name: str) -> Callable[[dict[str, Any]], int]:
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
