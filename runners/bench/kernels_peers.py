"""The peers' columns of the kernel benchmarks (`cpbench bench kernels` / `bench train`): which libraries are timed
beside ours (`--peers fla,flash_qla`), why one cannot run here (one line, never a traceback), and FlashQLA called
through its sweep adapter (`runners.peers.flash_qla`, the same calls a sweep makes).

FlashQLA gets two columns, both in the same process as ours and FLA's:

| column | adapter mode | FlashQLA call |
|---|---|---|
| flash_qla | none | `chunk_gated_delta_rule(..., cu_seqlens, auto_cp=False)`: one pass per sequence |
| flash_qla_cp | warmup_correct | its intra-card CP, the context its own rule builds: what `auto_cp=True`, FlashQLA 0.1.3's default, runs |

FlashQLA takes a batch as one varlen sequence set (`B = 1`, `cu_seqlens`; its intra-card CP needs that layout), so
the B x T workload is flattened (`Workload.flat`); ours and FLA's take it dense. Its output is reshaped back.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, cast

import torch
from torch import Tensor

from kernels.builds import wait_for_builds
from runners.workload import Workload

__all__ = [
    "FLASH_QLA_COLUMNS",
    "PEERS",
    "FlashQLAColumns",
    "first_call",
    "first_calls_s",
    "flash_qla_reason",
    "parse_peers",
]

PEERS = ("fla", "flash_qla")  # the libraries a benchmark can time beside ours
# column -> the adapter's mode: auto_cp=False, and its intra-card CP (auto_cp=True: the default a user gets)
FLASH_QLA_COLUMNS = {"flash_qla": "none", "flash_qla_cp": "warmup_correct"}
C_TOKENS = 64  # the shape check's stand-in length (FlashQLA's limits do not depend on T)


def parse_peers(text: str | None, no_fla: bool = False) -> tuple[str, ...]:
    """`--peers` (None: all of PEERS; "" or "none": no peer) minus FLA under `--no-fla`; a one-line ValueError for an
    unknown name."""
    names = PEERS if text is None else tuple(dict.fromkeys(s.strip() for s in text.split(",") if s.strip()))
    if names == ("none",):
        names = ()
    bad = [n for n in names if n not in PEERS]
    if bad:
        raise ValueError(f"--peers: unknown peer(s) {', '.join(bad)}; choose from {', '.join(PEERS)} (or none)")
    return tuple(n for n in names if not (no_fla and n == "fla"))


def flash_qla_reason(op: str, *, H: int, HV: int, K: int, V: int, dtype: str = "bfloat16") -> str | None:
    """Why FlashQLA cannot run this row in this process (one line), or None: the package imports (FlashQLA's own
    import error otherwise, e.g. a GPU it does not support), the device (the adapter's `available`), then the
    shape (the adapter's `skip_reason`, through the grid's rule)."""
    from runners.peers import peer_skip_reason
    from runners.peers.flash_qla import FLASH_QLA
    from runners.point import PointSpec

    try:
        import flash_qla  # noqa: F401 - imported for its error only
    except Exception as err:  # noqa: BLE001 - any import failure is the reason, in its own words
        return f"flash_qla cannot be imported: {type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"
    why = FLASH_QLA.available()
    if why:
        return why
    point = PointSpec.from_json(
        {
            "op": op,
            "mode": "none",
            "backend": "flash_qla",
            "B": 1,
            "T": C_TOKENS,
            "H": H,
            "HV": HV if HV != H else None,
            "K": K,
            "V": V,
            "lb": -1.0,
            "W": 1,
            "layout": "contiguous",
            "direction": "fwd",
            "dtype": dtype,
            "seed": 0,
            "rep": 0,
        }
    )
    return peer_skip_reason(FLASH_QLA, point)


def first_call(fn: Callable[[], Any], cuda: bool) -> tuple[Any, float]:
    """fn()'s result and its wall seconds, synchronised (a library's first call: its compile or autotune). Ours: the
    call as a training job's first step sees it, on Triton where the TileLang kernels its "auto" choices take are not
    built yet (they build in the background: CPBENCH_TILELANG_BUILD, `kernels.first_call`); then, untimed, those
    builds are waited for (`kernels.wait_for_builds`), so whatever is timed after runs the same kernels throughout."""
    t0 = time.perf_counter()
    out = fn()
    if cuda:
        torch.cuda.synchronize()
    seconds = round(time.perf_counter() - t0, 2)
    wait_for_builds()
    return out, seconds


def first_calls_s(rec: dict[str, Any]) -> float:
    """The seconds a benchmark row spent in its libraries' first calls (its `*first_call_s` entries)."""
    return sum(float(v) for k, v in rec.items() if k.endswith("first_call_s") and isinstance(v, (int, float)))


class FlashQLAColumns:
    """FlashQLA's forward and training step of a workload through the sweep adapter, per column of
    `FLASH_QLA_COLUMNS` (one adapter instance per benchmark run: its CP contexts are built once per bounds)."""

    def __init__(self) -> None:
        from runners.peers.flash_qla import FLASH_QLA

        self.peer = type(FLASH_QLA)()

    def forward(self, column: str, wl: Workload) -> tuple[Callable[..., Tensor], list[Tensor]]:
        """(fn, xs): fn(*xs) -> o of `column`, xs the flattened q, k, v, g, beta (views), o in the workload's
        [B, T, HV, V] layout."""
        from kernels import cp

        mode = FLASH_QLA_COLUMNS[column]
        flat = wl.flat()
        ctx = cp.build_context(flat.cu_seqlens_cpu, 1, 0, "contiguous")
        shape = wl.v.shape
        self.peer.begin_point(cast(Any, None))  # forget the split of the previous column

        def fwd(*xs: Tensor) -> Tensor:
            return self.peer.forward(mode, "gdn", *xs, group=None, ctx=ctx, scale=None, options={}).reshape(shape)

        # the gate in fp32 once, outside the timed call (FlashQLA's recipe; its adapter would cast it every step)
        q, k, v, g, beta = flat.tensors
        return fwd, [q, k, v, g.float(), beta]

    def step(self, column: str, wl: Workload, do: Tensor) -> Callable[[], tuple[Tensor, list[Tensor]]]:
        """One training step of `column` (forward + `o.backward(do)` on fresh leaves): (o, the five input grads in the
        workload's layout)."""
        fwd, xs = self.forward(column, wl)

        def step() -> tuple[Tensor, list[Tensor]]:
            leaves = [x.detach().requires_grad_() for x in xs]
            o = fwd(*leaves)
            o.backward(do)
            return o, [cast(Tensor, x.grad).reshape(t.shape) for x, t in zip(leaves, wl.tensors, strict=True)]

        return step

    def split(self) -> dict[str, Any]:
        """The split FlashQLA chose at the last call (its intra-card CP: pieces, longest piece), {} for none."""
        return dict(self.peer.point_report(cast(Any, None)).get("flash_qla", {}))
