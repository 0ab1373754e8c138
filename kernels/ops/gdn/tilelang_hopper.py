"""What GDN's TileLang kernels need, in one place: the TileLang version they were checked on, their sizes (K = V = 128,
chunk 64), a Hopper GPU (sm_90), and the dtype names TileLang takes. `kernels.ops.gdn.reverse_bwd` (the
backward's reverse walk), `kernels.ops.gdn.fwd_walk` (the forward's
state+output walk) and `kernels.ops.gdn.ag_hopper` (the Ag pass) refuse through `tilelang_refusal`, with one line
saying why; a plan option that picks between a Triton pass and one of them decides through `tilelang_chosen`; each
builds under `hopper_jit` (the target and pass configs they were checked with); an argument a build or mode leaves
unread is bound to a `stand_in`; the reverse walk loads a range's first chunk with `masked_chunk_loads`; a lab switch
the kernel does not know is refused by `check_lab`; KDA's chunk-parallel backward kernels find their chunk's rows with
`chunk_span` and clear a varlen chunk's rows past its sequence with `clear_rows`.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

import torch

__all__ = ["TILELANG_VERSION", "TL_DTYPES", "TL_SIZES", "check_lab", "chunk_span", "clear_rows", "hopper_jit",
           "masked_chunk_loads", "masked_load", "stand_in", "tilelang_chosen", "tilelang_refusal",
           "tilelang_refusal_cached"]  # fmt: skip

TILELANG_VERSION = "0.1.15"  # checked on the H200 against each kernel's mirror; others are refused, not run
TL_SIZES = {"K": 128, "V": 128, "BT": 64}
TL_DTYPES = {torch.bfloat16: "bfloat16", torch.float16: "float16", torch.float32: "float32"}


def tilelang_refusal(what: str, K: int, V: int, BT: int, device: torch.device) -> str | None:
    """Why the TileLang kernel `what` cannot run here (one line), or None."""
    if (TL_SIZES["K"], TL_SIZES["V"], TL_SIZES["BT"]) != (K, V, BT):
        return f"the TileLang {what} takes K = V = 128 and chunk 64, got K={K} V={V} chunk={BT}"
    if device.type != "cuda":
        return f"the TileLang {what} runs on CUDA only, got {device.type}"
    major, minor = torch.cuda.get_device_capability(device)
    if (major, minor) != (9, 0):
        return f"the TileLang {what} is built for sm_90 (Hopper), this GPU is sm_{major}{minor}"
    try:
        import tilelang
    except ImportError:
        return f"the TileLang {what} needs tilelang (./dev up installs it on a GPU host)"
    if tilelang.__version__.split("+")[0] != TILELANG_VERSION:
        return f"the TileLang {what} was checked on tilelang {TILELANG_VERSION}, found {tilelang.__version__}"
    return None


@functools.cache
def tilelang_refusal_cached(what: str, K: int, V: int, BT: int, device: torch.device) -> str | None:
    """`tilelang_refusal` once per (kernel, sizes, device): the automatic choices ask it on every call."""
    return tilelang_refusal(what, K, V, BT, device)


def tilelang_chosen(option: str, mode: str, what: str, K: int, V: int, BT: int, device: torch.device, *,
                    auto: bool) -> bool:  # fmt: skip
    """Whether a plan option choosing between a Triton pass and the TileLang kernel `what` takes the kernel: mode
    "triton" never; "tilelang" always (a ValueError naming the option and `tilelang_refusal`'s reason where it cannot
    run); "auto" where the caller's rule `auto` holds (the dtype the kernel was timed in) and nothing refuses it."""
    if mode == "triton" or (mode == "auto" and not auto):
        return False
    why = tilelang_refusal_cached(what, K, V, BT, device)
    if mode == "tilelang":
        if why is not None:
            raise ValueError(f"LaunchPlan({option}='tilelang'): {why}")
        return True
    return why is None


def check_lab(lab: frozenset[str], known: Mapping[str, str]) -> None:
    """A one-line ValueError for a lab switch (a build knob that leaves a part out, timing only) the kernel does not
    know; `known`: the kernel's switches and what each leaves out."""
    unknown = set(lab) - set(known)
    if unknown:
        raise ValueError(f"unknown lab switches {sorted(unknown)}; known: {sorted(known)}")


@functools.cache
def stand_in(device: torch.device, dtype: torch.dtype, *shape: int) -> torch.Tensor:
    """A zero tensor (made once per device, dtype and shape) for an argument a kernel's build or mode leaves unread:
    TileLang binds every argument of a prim_func."""
    return torch.zeros(shape, dtype=dtype, device=device)


def hopper_jit() -> Any:
    """`tilelang.jit` as every GDN TileLang kernel builds: sm_90a, fast math."""
    import tilelang

    return tilelang.jit(target={"kind": "cuda", "arch": "sm_90a"},
                        pass_configs={tilelang.PassConfigKey.TL_ENABLE_FAST_MATH: True})  # fmt: skip


def masked_load(T: Any, cond: Any, x: Any, index: tuple[Any, ...], dtype: str) -> Any:
    """x[index] where cond, else 0, as dtype, in a TileLang kernel (`T`: `tilelang.language` of the build): the select
    around the load alone, the cast after it. So TileLang merges cond and its own bound check of the index into one
    predicated load; a cast (or a product) inside the select makes the check a second `if` nested in cond's, and nvcc
    then branches around each load instead of issuing a thread's loads together (session 34, the H100: KDA's products
    kernel took 9.74 ms in the 1x64K step reading its gate so in bf16, 8.55 in fp32; `benchmarks/tilelang_code_report.py`
    lists any nested load left in a build)."""
    return T.cast(T.if_then_else(cond, x[index], T.cast(0, x.dtype)), dtype)


def masked_chunk_loads(T: Any, BT: int, K: int, V: int) -> Any:
    """A TileLang macro (`T`: `tilelang.language` of the build) loading the reverse walk's chunk at t0 row by row into
    its tiles: q, k (key head i_hk), v, dO, Ag (value head i_h) zero past the range's end eos, the gate cumsum repeating
    the last row's there (no decay), beta zero there; the chunk state h[ic] whole. The walk's first chunk, which may be
    partial (`kernels.ops.gdn.reverse_bwd`)."""

    @T.macro
    def load(q, k, v, do, ag, h, gs, beta, q_s, k_s, v_s, do_s, ag_s, h_s, g_s, b_s, t0, eos, ic, i_hk, i_h):  # fmt: skip
        for r, c in T.Parallel(BT, K):
            q_s[r, c] = T.if_then_else(t0 + r < eos, q[T.min(t0 + r, eos - 1), i_hk, c], 0)
            k_s[r, c] = T.if_then_else(t0 + r < eos, k[T.min(t0 + r, eos - 1), i_hk, c], 0)
        for r, c in T.Parallel(BT, V):
            v_s[r, c] = T.if_then_else(t0 + r < eos, v[T.min(t0 + r, eos - 1), i_h, c], 0)
            do_s[r, c] = T.if_then_else(t0 + r < eos, do[T.min(t0 + r, eos - 1), i_h, c], 0)
        for r, c in T.Parallel(BT, BT):
            ag_s[r, c] = T.if_then_else(t0 + r < eos, ag[T.min(t0 + r, eos - 1), i_h, c], 0)
        T.copy(h[ic, i_h, 0:K, 0:V], h_s)
        for r in T.Parallel(BT):
            g_s[r] = gs[T.min(t0 + r, eos - 1), i_h]
            b_s[r] = masked_load(T, t0 + r < eos, beta, (T.min(t0 + r, eos - 1), i_h), "float32")

    return load


def chunk_span(T: Any, C: int, varlen: bool) -> Any:
    """A TileLang macro (`T`: `tilelang.language` of the build) writing a chunk-parallel program's chunk i_c's first
    row and its rows in its sequence into span_l (a local int32 [2]): with varlen from cu_seqlens and the chunk index
    (`kernels.common.index.ChunkIndex`: C rows but for a sequence's last chunk), else 64 i_c and C (dense rows)."""

    @T.macro
    def span(cu, ci, i_c, span_l):
        if varlen:
            span_l[0] = cu[ci[i_c, 0]] + ci[i_c, 1] * C
            span_l[1] = T.min(cu[ci[i_c, 0] + 1] - span_l[0], C)
        else:
            span_l[0] = i_c * C
            span_l[1] = C

    return span


def clear_rows(T: Any) -> Any:
    """A TileLang macro (`T`: `tilelang.language` of the build) zeroing rows n.. of a shared tile x_s: what a varlen
    chunk read past its sequence's end (the next sequence's rows), so that no product carries them into a kept row."""

    @T.macro
    def clear(x_s, n):
        for r, c in T.Parallel(x_s.shape[0], x_s.shape[1]):
            if r >= n:
                x_s[r, c] = T.cast(0.0, x_s.dtype)

    return clear
