"""`cpbench tune --backend flash_qla`: FlashQLA's auto-CP cost coefficients refit from its kernels timed on this GPU.

    result = tune_flash_qla(shapes=[Shape(T=65536, H=16)], spec=TuneSpec(direction="fwd+bwd", samples=10))

Per shape (B=1, K=V=128, bf16 or fp16: FlashQLA's intra-card CP splits flattened sequences, one, or several with
`lengths`) and per split size S (partitions of S chunks; `splits="decide"`, the default, times `decided_splits`: the
candidates FlashQLA's own `decide` prices at the shape with its shipped coefficients, its picks, the splits one
partition either side of them and no split; `splits="all"` times `split_sizes`, every power of two and 2..8-partition
cut from FlashQLA's minimum up to the longest sequence. Each new launch variant (a V tile width, CP or not) is a
TileLang compile of 15-50 s on a cold cache: "decide" compiles the few its decision prices), FlashQLA's own
`chunk_gated_delta_rule` runs (the forward; `direction: fwd+bwd` the training step, whose
kernels price FlashQLA's training decision) under the CP context of that split, built by FlashQLA
(`_build_intra_cp_context`). Each of its kernel launchers is timed with CUDA events around its call
(`KernelTimer`) and its time goes to the coefficient row FlashQLA's `launch_config` prices it under; the point's
(depth, u) are FlashQLA's `struct_features` of that split, with the warmups its gate asks for
(`warmup_from_gate_avg`). Each row needs points whose (depth, u) do not lie on one line: the correction rows' depth
is the partition count and u heads x partitions, so they need two head counts or a shape of several sequences
(`lengths=`). The medians over `spec.samples` runs are fitted per row
(`runners.tuner.flash_qla_coefs.fit_coefficients`); a row the points cannot fit, or did not time, keeps FlashQLA's
shipped coefficients and says why (`config["source"] == "shipped"`).

The result is a `TuneResult` (stored with `db.crud.store_tuning`): one `KernelResult` per coefficient row, named
`flash_qla.<row>`, keyed by (arch, P, chunk), whose config is {a, b, c, source, n, rms_ms, shipped, shipped_rms_ms,
why} and whose trials are its timings (key: T, H, lengths, lb, S, depth, u; config: {S}); its median_ms is the row's median
timing (0 where it was not timed). Runs only on a GPU with flash_qla installed (`require_flash_qla`).
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import itertools
import math
import statistics
import time
from collections.abc import Callable, Collection, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from runners.tuner.flash_qla_coefs import Timing, coef_csv, coef_key, fit_coefficients, predict_ms
from runners.tuner.result import FLASH_QLA_PREFIX, KernelResult, OnResult, Trial, TuneResult
from runners.tuner.spec import TuneSpec
from runners.tuner.tune import Shape, device_facts

__all__ = [
    "FlashQLADevice",
    "SPLIT_CHOICES",
    "KernelTimer",
    "check_shapes",
    "coef_results",
    "decided_splits",
    "flash_qla_context",
    "flash_qla_device",
    "flash_qla_inputs",
    "require_flash_qla",
    "run_step",
    "seq_chunks",
    "split_sizes",
    "splits_around",
    "time_shape",
    "time_splits",
    "tune_flash_qla",
]

# FlashQLA's kernel launchers (module attributes of flash_qla.ops.gated_delta_rule.chunk) -> the kernel they price
LAUNCHERS = {"fused_gdr_fwd": "fused_fwd", "correct_initial_states": "correct_h0", "correct_terminal_states": "correct_dht",
             "fused_gdr_dh": "prepare_dh", "fused_gdr_bwd": "fused_bwd", "fused_gdr_h": "prepare_h"}  # fmt: skip
DTYPES = ("bfloat16", "float16")
HEAD_DIM = 128  # FlashQLA's only K and V
SPLIT_CHOICES = ("decide", "all")  # the split sizes a refit times: `decided_splits` or `split_sizes`
_CHUNK_MODULE = "flash_qla.ops.gated_delta_rule.chunk"


def require_flash_qla() -> None:
    """ValueError (one line) unless this host has a CUDA device and flash_qla is installed."""
    import torch

    if not torch.cuda.is_available():
        raise ValueError("--backend flash_qla times FlashQLA's kernels on an SM90/SM100 GPU: this host has no CUDA device")
    if importlib.util.find_spec("flash_qla") is None:
        raise ValueError("--backend flash_qla needs flash_qla installed (pip install flash-qla; "
                         "../shared/tools/flashqla_bundle.sh packs it for the device)")  # fmt: skip


def check_shapes(shapes: Sequence[Shape]) -> None:
    """ValueError naming the first shape FlashQLA's intra-card CP cannot time: B=1 dense, K=V=128, bf16/fp16."""
    for s in shapes:
        if s.B != 1:
            raise ValueError(
                f"--backend flash_qla: intra-card CP splits flattened sequences: B=1 (lengths= for several), got B={s.B}"
            )
        if s.K != HEAD_DIM or s.V != HEAD_DIM:
            raise ValueError(f"--backend flash_qla: FlashQLA runs K=V={HEAD_DIM} only, got K={s.K}, V={s.V}")
        if s.dtype not in DTYPES:
            raise ValueError(f"--backend flash_qla: FlashQLA runs {' and '.join(DTYPES)} only, got dtype={s.dtype}")


def split_sizes(chunks: int, min_s: int, *, parts: int = 8) -> list[int]:
    """The split sizes timed for a sequence of `chunks` chunks, ascending, from `min_s` to `chunks` (no split): the
    powers of two, and the sizes that cut it into 2..`parts` partitions (ceil(chunks / n)): odd partition counts
    put the launch grid (heads x partitions) between the powers of two, where FlashQLA's fused forward takes its
    middle V tile width (its `dv64` row)."""
    sizes = {chunks}
    s = min_s
    while s < chunks:
        sizes.add(s)
        s *= 2
    sizes.update(math.ceil(chunks / n) for n in range(2, parts + 1))
    return sorted(x for x in sizes if min_s <= x <= chunks)


def splits_around(chunks: int, picks: Iterable[int | None], candidates: Iterable[int], min_s: int) -> list[int]:
    """The split sizes timed for a sequence of `chunks` chunks around a decision, ascending, within [`min_s`,
    `chunks`]: the `candidates` it priced, its `picks` (None: no split) and for each pick the sizes that cut the
    sequence into one partition fewer and one more, and `chunks` itself (no split)."""
    sizes = {chunks, *candidates}
    for pick in picks:
        if pick is None or pick >= chunks:
            continue
        sizes.add(pick)
        n = math.ceil(chunks / pick)
        sizes.update(math.ceil(chunks / k) for k in (n - 1, n + 1) if k >= 1)
    return sorted(x for x in sizes if min_s <= x <= chunks)


class _WallMark:
    """A point on the wall clock with a CUDA event's two methods (`KernelTimer(device="cpu")`)."""

    t = 0.0

    def record(self) -> None:
        self.t = time.perf_counter()

    def elapsed_time(self, end: _WallMark) -> float:
        return (end.t - self.t) * 1e3


@dataclass
class KernelTimer:
    """CUDA events around each call of FlashQLA's kernel launchers while `patched(module)` holds; `take()` waits
    for the device and returns {kernel: ms} of the calls since the last take (a kernel called twice: summed).
    `fused_gdr_h` prices prepare_h (final states only: the CP preprocessing) or recompute_h (`output_h=True`: the
    backward's states). `device="cpu"`: the wall clock instead of CUDA events (tests)."""

    device: str = "cuda"
    events: list[tuple[str, Any, Any]] = field(default_factory=list)

    def _mark(self) -> Any:
        if self.device == "cpu":
            return _WallMark()
        import torch

        return torch.cuda.Event(enable_timing=True)

    def _timed(self, launcher: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            kernel = "recompute_h" if launcher == "fused_gdr_h" and kwargs.get("output_h") else LAUNCHERS[launcher]
            start, end = self._mark(), self._mark()
            start.record()
            out = fn(*args, **kwargs)
            end.record()
            self.events.append((kernel, start, end))
            return out

        return timed

    @contextlib.contextmanager
    def patched(self, module: Any) -> Iterator[None]:
        saved = {n: getattr(module, n) for n in LAUNCHERS if getattr(module, n, None) is not None}
        try:
            for name, fn in saved.items():
                setattr(module, name, self._timed(name, fn))
            yield
        finally:
            for name, fn in saved.items():
                setattr(module, name, fn)

    def take(self) -> dict[str, float]:
        if self.device != "cpu":
            import torch

            torch.cuda.synchronize()
        out: dict[str, float] = {}
        for kernel, start, end in self.events:
            out[kernel] = out.get(kernel, 0.0) + start.elapsed_time(end)
        self.events.clear()
        return out


def flash_qla_inputs(shape: Shape, *, train: bool) -> dict[str, Any]:
    """FlashQLA's inputs at `shape` on the GPU (its own benchmark's layout: l2-normalised q, k; fp32 log-gates
    `lb * sigmoid(x)`, fp32 beta), with the output gradient when `train`."""
    import torch
    import torch.nn.functional as F

    gen = torch.Generator(device="cuda").manual_seed(shape.seed)
    dt = getattr(torch, shape.dtype)

    def randn(*size: int, dtype: Any = dt) -> Any:
        return torch.randn(*size, generator=gen, device="cuda", dtype=dtype)

    B, T, H = 1, shape.T, shape.H
    out = {"q": F.normalize(randn(B, T, H, HEAD_DIM), dim=-1), "k": F.normalize(randn(B, T, H, HEAD_DIM), dim=-1),
           "v": randn(B, T, H, HEAD_DIM), "g": shape.lb * torch.sigmoid(randn(B, T, H, dtype=torch.float32)),
           "beta": torch.sigmoid(randn(B, T, H, dtype=torch.float32))}  # fmt: skip
    if train:
        for t in out.values():
            t.requires_grad_(True)
        out["do"] = randn(B, T, H, HEAD_DIM)
    out["lengths"] = list(shape.lengths or (T,))
    out["cu_seqlens"] = torch.tensor([0, *itertools.accumulate(out["lengths"])], dtype=torch.int32, device="cuda")
    return out


def seq_chunks(x: dict[str, Any], chunk: int) -> list[int]:
    """The chunks of each sequence of FlashQLA's inputs `x`."""
    return [math.ceil(n / chunk) for n in x["lengths"]]


def flash_qla_context(lcp: int | None, x: dict[str, Any], chunk: int) -> Any:
    """FlashQLA's CP context for the sequences of `x` split into partitions of `lcp` chunks (None, or at least the
    longest sequence: no split)."""
    from flash_qla.ops.gated_delta_rule.chunk.cp import context as cx

    chunks = seq_chunks(x, chunk)
    if lcp is None or lcp >= max(chunks):
        return cx.FlashQLACPContext(is_intra=False, cu_seqlens=x["cu_seqlens"])
    return cx._build_intra_cp_context(x["cu_seqlens"], chunk, chunks, int(lcp))


def run_step(x: dict[str, Any], ctx: Any) -> None:
    """FlashQLA's forward under `ctx` (and the backward when the inputs carry `do`)."""
    from flash_qla.ops.gated_delta_rule import chunk_gated_delta_rule

    o, _ = chunk_gated_delta_rule(x["q"], x["k"], x["v"], x["g"], x["beta"], cu_seqlens=x["cu_seqlens"], cp_context=ctx)
    if "do" in x:
        o.backward(x["do"])


@dataclass(frozen=True)
class FlashQLADevice:
    """FlashQLA's facts on this device: arch, its kernel backend, SMs, chunk size and shipped coefficients."""

    arch: str
    backend: str
    P: int
    chunk: int
    shipped: dict[str, dict[str, float]]
    shipped_text: str
    version: str


def flash_qla_device() -> FlashQLADevice:
    import importlib.metadata

    import torch
    from flash_qla.ops.gated_delta_rule import chunk as fq
    from flash_qla.ops.gated_delta_rule.chunk.cp.autocp import launch, utils

    arch = launch.current_arch()
    path = utils.coefs_path_for(arch)
    if path is None:
        raise ValueError(f"FlashQLA ships no coefficients for {arch}: nothing to compare a refit with")
    with open(path, encoding="utf-8") as f:
        text = f.read()
    return FlashQLADevice(arch=arch, backend=launch.BACKEND_OF[arch], P=torch.cuda.get_device_properties().multi_processor_count,
                   chunk=int(fq.CHUNK_SIZE), shipped=utils.load_coefs(path, arch=arch)["kernels"], shipped_text=text,
                   version=importlib.metadata.version("flash-qla"))  # fmt: skip


def decided_splits(chunks: Sequence[int], H: int, dev: FlashQLADevice, *, train: bool, g: Any = None) -> list[int]:
    """`splits_around` FlashQLA's own decision for sequences of `chunks` chunks and H value heads: its `decide` with
    the shipped coefficients, called as its CP context calls it (this GPU's SMs, FlashQLA's chunk, and the gate `g`
    `[1, T, H]`, from which `decide` takes each head's warmup depth; without it every warmup is the whole segment)."""
    from flash_qla.ops.gated_delta_rule.chunk.cp.autocp import decide, utils

    coefs = {"kernels": dev.shipped, "P": dev.P, "chunk": dev.chunk, "arch": dev.arch, "backend": dev.backend}
    d = decide(num_chunks=list(chunks), num_v_heads=H, coefs=coefs, P=dev.P, chunk=dev.chunk, is_train=train, debug=True,
               g=g)  # fmt: skip
    return splits_around(max(chunks), (d["lcp"], d["best_cp_lcp"]), (S for S, _ in d["sweep"]), utils.MIN_LCP)


def time_splits(
    shape: Shape,
    spec: TuneSpec,
    dev: FlashQLADevice,
    say: Callable[[str], None],
    *,
    splits: str = "decide",
    skip: Collection[int] = (),
) -> Iterator[tuple[int, list[Timing]]]:
    """Each split size of `shape` (`splits`: "decide" or "all", see the module docstring; those in `skip` left out)
    with every kernel row's median time there, one split at a time (a caller can keep each as it comes)."""
    import importlib

    from flash_qla.ops.gated_delta_rule.chunk.cp.autocp import launch, utils

    if splits not in SPLIT_CHOICES:
        raise ValueError(f"splits must be one of {', '.join(SPLIT_CHOICES)}, got {splits!r}")
    fq = importlib.import_module(_CHUNK_MODULE)
    train = spec.direction == "fwd+bwd"
    x = flash_qla_inputs(shape, train=train)
    chunks = seq_chunks(x, dev.chunk)
    warmups = utils.warmup_from_gate_avg(x["g"].detach().float().mean(dim=1).reshape(-1).tolist(), dev.chunk)
    sizes = (split_sizes(max(chunks), utils.MIN_LCP) if splits == "all"
             else decided_splits(chunks, shape.H, dev, train=train, g=x["g"]))  # fmt: skip
    todo = [S for S in sizes if S not in skip]
    say(f"flash_qla T={shape.T} H={shape.H} lengths={shape.lengths or '-'} lb={shape.lb:g}: split sizes {todo} "
        f"({splits}; {len(sizes) - len(todo)} timed before)")  # fmt: skip
    timer = KernelTimer()
    for i, S in enumerate(todo, 1):
        ctx = flash_qla_context(S, x, dev.chunk)
        feat = utils.struct_features(chunks, S, shape.H, dev.P, warmups, train, backend=dev.backend)
        t0 = time.monotonic()
        with timer.patched(fq):
            run_step(x, ctx)  # the first call of a new launch variant compiles; its times are dropped
            timer.take()
            first_s = time.monotonic() - t0
            runs = []
            for _ in range(spec.samples):
                run_step(x, ctx)
                runs.append(timer.take())
        out = []
        for kernel in sorted({k for r in runs for k in r}):
            row = launch.launch_config(dev.backend, kernel, feat.shape).row
            ms = statistics.median(r[kernel] for r in runs if kernel in r)
            out.append(Timing(row=row, depth=float(feat.depth[kernel]), u=float(feat.u), ms=ms))
        say(f"  S={S} ({i}/{len(todo)}): {feat.num_partitions} partition(s), first call {first_s:.1f} s, "
            f"{spec.samples} runs in {time.monotonic() - t0 - first_s:.1f} s")  # fmt: skip
        yield S, out


def time_shape(
    shape: Shape, spec: TuneSpec, dev: FlashQLADevice, say: Callable[[str], None], *, splits: str = "decide"
) -> list[tuple[Timing, int]]:
    """Every kernel row's median time at each split size of `shape` (`time_splits`), with its split size."""
    return [(t, S) for S, ts in time_splits(shape, spec, dev, say, splits=splits) for t in ts]


def _rms(coefs: dict[str, float] | None, timed: Sequence[tuple[Timing, int, Shape]]) -> float | None:
    """The RMS (ms) of `coefs`' predictions against the timings (None without coefficients or timings)."""
    if coefs is None or not timed:
        return None
    return math.sqrt(statistics.fmean((predict_ms(coefs, t.depth, t.u) - t.ms) ** 2 for t, _, _ in timed))


def coef_results(timed: list[tuple[Timing, int, Shape]], spec: TuneSpec, dev: FlashQLADevice) -> list[KernelResult]:
    """One KernelResult per coefficient row (the shipped ones and any other timed): the fit where it holds."""
    fit = fit_coefficients(t for t, _, _ in timed)
    key, key_str = coef_key(arch=dev.arch, P=dev.P, chunk=dev.chunk)
    source_hash = hashlib.sha256(f"flash-qla {dev.version}\n{dev.shipped_text}".encode()).hexdigest()
    out = []
    for row in dict.fromkeys([*dev.shipped, *fit.rows, *fit.unfitted]):
        mine = [(t, S, s) for t, S, s in timed if t.row == row]
        shipped = dev.shipped.get(row)
        trials = tuple(Trial(kernel=FLASH_QLA_PREFIX + row, key={"T": s.T, "H": s.H, "lengths": s.lengths, "lb": s.lb, "S": S,
                                                                 "depth": t.depth, "u": t.u,
                                                                 "direction": spec.direction},
                             config={"S": S}, strategy="fit", rung=0, status="ok", median_ms=t.ms, n=spec.samples)
                       for t, S, s in mine)  # fmt: skip

        config: dict[str, Any]
        if row in fit.rows:
            f = fit.rows[row]
            config = {**f.coefs(), "source": "fit", "n": f.n, "rms_ms": f.rms_ms, "why": None}
        elif shipped is not None:
            why = fit.unfitted.get(row, f"not timed at these shapes ({spec.direction})")
            config = {**shipped, "source": "shipped", "n": len(mine), "rms_ms": _rms(shipped, mine), "why": why}
        else:
            continue  # timed but neither fitted nor shipped: its trials are all there is
        config.update(shipped=shipped, shipped_rms_ms=_rms(shipped, mine))
        out.append(
            KernelResult(
                kernel=FLASH_QLA_PREFIX + row,
                key=key,
                key_str=key_str,
                source_hash=source_hash,
                trials=trials,
                config=config,
                median_ms=statistics.median(t.ms for t, _, _ in mine) if mine else 0.0,
            )
        )
    return out


def tune_flash_qla(
    *,
    shapes: Sequence[Shape | dict[str, Any]],
    spec: TuneSpec = TuneSpec(),
    on_result: OnResult | None = None,
    say: Callable[[str], None] = lambda _: None,
    splits: str = "decide",
) -> TuneResult:
    """Time FlashQLA's kernels at the split sizes `splits` chooses of `shapes` and fit its coefficients (see the
    module docstring). `say` gets a line per shape and per split; `on_result` the whole result once it is fitted."""
    require_flash_qla()
    if splits not in SPLIT_CHOICES:
        raise ValueError(f"splits must be one of {', '.join(SPLIT_CHOICES)}, got {splits!r}")
    todo = [Shape.of(s) for s in shapes]
    check_shapes(todo)
    dev = flash_qla_device()
    timed: list[tuple[Timing, int, Shape]] = []
    for shape in todo:
        timed += [(t, S, shape) for t, S in time_shape(shape, spec, dev, say, splits=splits)]
    name, cc = device_facts("cuda")
    result = TuneResult(device_name=name, compute_capability=cc, kernels=tuple(coef_results(timed, spec, dev)))
    coef_csv(
        {k.kernel.removeprefix(FLASH_QLA_PREFIX): k.config for k in result.kernels if k.config},
        P=dev.P,
        chunk=dev.chunk,
        arch=dev.arch,
    )  # the export will be loadable: refuse a result that is not
    if on_result is not None:
        on_result(result)
    return result
