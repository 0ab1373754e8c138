"""KDA's backward from the forward's kept gated Ag (the recompute policy "ag", `kernels.plan.LaunchPlan.keep`; GDN's
is `kernels.ops.gdn.ag_bwd`): no WY prep (`wy_kda_fwd`, 2.8 ms of a 21 ms step at 1x64K on the H200,
`benchmarks/results/kernels_train_tuned_h200.md`) in the backward.

KDA's two-kernel forward (`kernels.ops.kda.fused`, on the fused path) keeps what its Ag pass stores in the gated form
(`kernels.ops.kda.wy_ag.GatedKeys`, the Triton pass's `gated` variant or the TileLang pass `kernels.ops.kda.ag_hopper`):
Ag = T diag(beta) and Aqk `[B, T, HV, BT]`, qg = scale Q e^G, ke = K e^G, kd = K e^(G_C - G) `[B, T, HV, K]` and
G_C `[NT, HV, K]` fp32 (`KEPT_GATED`). The backward then runs

1. `kda_wy_from_ag` (one chunk-parallel kernel, per chunk and value head, every product a 64-row `tl.dot`):

       w = Ag ke,   u = Ag V

   what `wy_kda_fwd` gives (its kg is kd, its gc G_C, its qg and Aqk the kept ones);
2. `chunk_bwd` for KDA with those factors (`wy=`): T as the forward's Ag pass stored it (`GatedKeys.tt`, kept as
   "tt": both passes store it since session 29), else by `wy_inverse` (1.2 ms at 1x64K; KDA's M, the beta-free
   decayed gram, is not formed from the kept tensors: T = I - Ag M would need it); its state recompute, reverse state
   pass and gradients. Under `LaunchPlan(bwd_grads="tilelang")`, and "auto" where nothing refuses them (session 33),
   the gradients are `tilelang_grads`' (session 30: two chunk-parallel TileLang kernels from the kept gated tensors
   and the chunk states, in place of `chunk_bwd_dqk` + `wy_bwd`; the step on them 0.66x FLA's at 1x64K on an H100 in
   session 33, the second kernel on two warpgroups): `kernels.ops.kda.state_grads_hopper` (the state products), then
   `kernels.ops.kda.bwd_products_hopper` (dA, the four decayed products, dq, dk, dg, dbeta). Any layout (session
   31): dense sequences of whole chunks on their dense builds, varlen or a dense T not a multiple of the chunk on
   their varlen builds; grouped heads read their q, k head in the kernel (dq, dk summed per group after); bf16
   (`tilelang_grads_refusal` says why not, in one line). "auto" takes them under `KDA_TILELANG_GRADS_AUTO`.

Bytes per token-head of step 1 (bf16, K = V = 128, chunk 64): reads Ag (128), ke, v (512); writes w, u (512): 1.15 KB,
against `wy_kda_fwd`'s reads of q, k, v, g (fp32), beta and writes of w, u, kg, qg, Aqk (~2.4 KB) and its per-key
exponentials. What the forward holds: 3 x [T, HV, K] + 3 x [T, HV, 64] bf16 (with T) + G_C: 1.15 KB per token-head,
as much as "wy"'s (w, u, kg, qg, Aqk: 1.15 KB).
"""

from __future__ import annotations

import functools
from typing import Any

import torch
import triton
import triton.language as tl
from torch import Tensor

from kernels.common.bwd_tiles import group_sum
from kernels.common.chunk_bwd import chunk_bwd
from kernels.common.chunk_program import chunk_of_program, heuristics
from kernels.common.index import ChunkIndex, prepare_chunk_index
from kernels.common.wy import BT_WY, CHUNK_SIZES
from kernels.configs import KernelSpec, LaunchConfig, cdiv, head_block, register
from kernels.ops.kda.bwd_products_hopper import bwd_products_hopper
from kernels.ops.kda.state_grads_hopper import state_grads_hopper, state_grads_refusal
from kernels.plan import LaunchPlan, default_plan, launch_config

__all__ = ["KDA_TILELANG_GRADS_AUTO", "KDA_TILELANG_GRADS_DTYPE", "KDA_WY_FROM_AG", "KEPT_GATED", "chunk_kda_bwd_ag",
           "grads_mode", "kda_wy_from_ag", "tilelang_grads", "tilelang_grads_refusal"]  # fmt: skip

# whether `LaunchPlan.bwd_grads="auto"` takes the TileLang gradients (`tilelang_grads`) where nothing refuses them:
# on since session 33 (an H100: the step on them 16.12 vs FLA's 24.56 ms at 1x64K, 0.66x, right within 2.9e-3, the
# second kernel on two warpgroups; the Triton pair's step is 0.76x FLA's on the H200, session 30; off before: 1.09x
# on one warpgroup, session 31; `kernels/NOTES.md`, "Session 33"); under the tiered first call the step runs the
# Triton pair while they build (`kernels.first_call`)
KDA_TILELANG_GRADS_AUTO = True

# (session 32) the dtype of the state products' dqg, dke, dkd (`state_grads_hopper`'s grads_dtype), which the products
# kernel reads: bf16 halves their 1.6 GB at 1x64K (written, read and held at the step's peak; the session 31 step's
# peak was 8094 MB against FLA's 7192), each rounded once before the finish sums it into dq, dk, dg
KDA_TILELANG_GRADS_DTYPE = torch.bfloat16

# what KDA's forward keeps under "ag" (`kernels.ops.kda.fused.kda_fused_fwd`), the backward's WY names for them
KEPT_GATED = {"ag": "ag", "aqk": "aqk", "qg": "qs", "ke": "ke", "kd": "ks", "gc": "gs"}

KDA_WY_FROM_AG = register(
    KernelSpec(
        name="kda_wy_from_ag",
        key=("HV", "K", "V", "BT", "IS_VARLEN", "dtype"),
        # 64-row products only (Ag ke, Ag V): one warpgroup; BK = BV = 64 column blocks. Not tuned on a GPU yet.
        default=LaunchConfig(BK=64, BV=64, num_warps=4, num_stages=2),
        space={"BK": (32, 64, 128), "BV": (32, 64, 128), "num_warps": (4, 8), "num_stages": (1, 2, 3)},
    )
)


@heuristics({"IS_VARLEN": lambda args: args["cu_seqlens"] is not None})
@triton.jit(do_not_specialize=["T"])
def kda_wy_from_ag_kernel(
    ag, ke, v,  # [B, T, HV, BT] Ag (lower incl. the diagonal), [B, T, HV, K] K e^G, [B, T, HV, V]
    w, u,  # out: [B, T, HV, K], [B, T, HV, V]
    cu_seqlens, chunk_indices, T,
    HV: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    IS_VARLEN: tl.constexpr,
):  # fmt: skip
    i_bh, i_hv = tl.program_id(1), tl.program_id(1) % HV
    _, i_t, _, bos, T = chunk_of_program(tl.program_id(0), i_bh // HV, cu_seqlens, chunk_indices, T, BT, IS_VARLEN)
    o_t = tl.arange(0, BT)
    m_r = i_t * BT + o_t < T
    p_v = (bos + i_t * BT + o_t) * HV + i_hv  # rows of the per-value-head tensors
    m_low = (o_t[:, None] >= o_t[None, :]) & m_r[:, None] & m_r[None, :]
    b_a = tl.load(ag + p_v[:, None] * BT + o_t[None, :], mask=m_low, other=0.0)  # [BT, BT]
    for i_k in range(tl.cdiv(K, BK)):
        o_k = i_k * BK + tl.arange(0, BK)
        m_rk = m_r[:, None] & (o_k < K)[None, :]
        b_k = tl.load(ke + p_v[:, None] * K + o_k[None, :], mask=m_rk, other=0.0)
        tl.store(w + p_v[:, None] * K + o_k[None, :], tl.dot(b_a, b_k).to(w.dtype.element_ty), mask=m_rk)
    for i_v in range(tl.cdiv(V, BV)):
        o_v = i_v * BV + tl.arange(0, BV)
        m_rv = m_r[:, None] & (o_v < V)[None, :]
        b_v = tl.load(v + p_v[:, None] * V + o_v[None, :], mask=m_rv, other=0.0).to(b_a.dtype)
        tl.store(u + p_v[:, None] * V + o_v[None, :], tl.dot(b_a, b_v).to(u.dtype.element_ty), mask=m_rv)


def kda_wy_from_ag(ag: Tensor, ke: Tensor, v: Tensor, *, index: ChunkIndex,
                   launch: LaunchPlan | None = None) -> tuple[Tensor, Tensor]:  # fmt: skip
    """(w = Ag ke `[B, T, HV, K]`, u = Ag V `[B, T, HV, V]`) per chunk, in ke's dtype (module docstring)."""
    B, T, HV, K = ke.shape
    V, BT = v.shape[-1], index.chunk_size
    if BT not in CHUNK_SIZES or ag.shape != (B, T, HV, BT) or v.shape[:3] != (B, T, HV):
        raise ValueError(f"kda_wy_from_ag: Ag {tuple(ag.shape)} and v {tuple(v.shape)} do not match ke "
                         f"{tuple(ke.shape)} with chunk {BT}")  # fmt: skip
    key = {"HV": HV, "K": K, "V": V, "BT": BT, "IS_VARLEN": index.is_varlen, "dtype": str(ke.dtype).removeprefix("torch.")}
    cfg = launch_config(launch, KDA_WY_FROM_AG, key)
    BK, BV = min(cfg.BK or 64, head_block(K)), min(cfg.BV or 64, head_block(V))
    w, u = torch.empty_like(ke), torch.empty_like(v, dtype=ke.dtype)
    grid = (index.num_chunks, HV) if index.is_varlen else (cdiv(T, BT), B * HV)
    bounds = (index.cu_seqlens, index.chunk_indices) if index.is_varlen else (None, None)
    kda_wy_from_ag_kernel[grid](ag, ke, v, w, u, *bounds, T, HV=HV, K=K, V=V, BT=BT, BK=BK, BV=BV,
                                num_warps=cfg.num_warps, num_stages=cfg.num_stages)  # fmt: skip
    return w, u


def chunk_kda_bwd_ag(
    q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, do: Tensor, *, scale: float, wy: dict[str, Tensor],
    cu_seqlens: Tensor | None = None, plan: LaunchPlan | None = None, chunk_size: int = BT_WY, **options: Any,
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor | None]:  # fmt: skip
    """KDA's backward (`chunk_bwd`'s arguments and returns) from what its forward kept under "ag" (`KEPT_GATED` in
    `wy`, and the warm windows' sums, "bnd", where kept): w, u formed from Ag, then `chunk_bwd` with the WY factors."""
    missing = sorted(set(KEPT_GATED) - set(wy))
    if missing:
        raise ValueError(f"chunk_kda_bwd_ag: the forward kept no {', '.join(missing)} (KDA's 'ag' keeps {sorted(KEPT_GATED)})")
    B, T = v.shape[:2]
    launch = plan if plan is not None else default_plan()
    index = prepare_chunk_index(cu_seqlens, batch=B, seq_len=T, chunk_size=chunk_size, device=k.device)
    grads_fn = None
    mode = grads_mode(launch, k, v, index, kept_t="tt" in wy)  # (checked before any launch)
    if mode == "tilelang":  # (`chunk_bwd` runs grads_fn whenever it is given)
        grads_fn = functools.partial(tilelang_grads, kept={new: wy[old] for old, new in KEPT_GATED.items()}, scale=scale)
    w, u = kda_wy_from_ag(wy["ag"], wy["ke"], v.contiguous(), index=index, launch=launch)
    factors = {new: wy[old] for old, new in KEPT_GATED.items() if new not in ("ag", "ke")}
    factors.update({name: x for name, x in wy.items() if name not in KEPT_GATED}, w=w, u=u)
    return chunk_bwd("kda", q, k, v, g, beta, do, scale=scale, cu_seqlens=cu_seqlens, plan=launch, wy=factors,
                     chunk_size=chunk_size, grads_fn=grads_fn, **options)  # fmt: skip


def grads_mode(launch: LaunchPlan, k: Tensor, v: Tensor, index: ChunkIndex, *, kept_t: bool = True) -> str:
    """The plan's `bwd_grads` for KDA's backward from the kept gated Ag: "tilelang" where the plan names it (a
    ValueError with `tilelang_grads_refusal`'s line where it cannot run) or where "auto" takes it
    (`KDA_TILELANG_GRADS_AUTO` on and nothing refuses it); else the plan's own choice, left to `chunk_bwd`. kept_t:
    whether the forward kept T (both Ag passes store it under "ag"); the kernels read all of T's tile, and
    `wy_inverse`, the backward's other source, leaves its blocks above the diagonal unwritten."""
    if launch.bwd_grads != "tilelang" and not (launch.bwd_grads == "auto" and KDA_TILELANG_GRADS_AUTO):
        return launch.bwd_grads
    why = tilelang_grads_refusal(k, v, index)
    if why is None and not kept_t:
        why = "bwd_grads='tilelang' (KDA's chunk-parallel TileLang backward): it reads T as the forward kept it, none kept"
    if launch.bwd_grads == "tilelang" and why is not None:
        raise ValueError(why)
    return "tilelang" if why is None else launch.bwd_grads


def tilelang_grads_refusal(k: Tensor, v: Tensor, index: ChunkIndex) -> str | None:
    """Why `bwd_grads="tilelang"` (KDA's chunk-parallel TileLang backward) cannot run on these inputs (one line), or
    None: the TileLang kernels' sizes and device (`state_grads_refusal`) and bf16. Any layout runs (session 31):
    dense sequences of whole chunks on the kernels' dense builds, the rest (varlen, a dense T not a multiple of the
    chunk) on their varlen builds."""
    why = state_grads_refusal(k.shape[-1], v.shape[-1], index.chunk_size, k.device)
    if why is None and k.dtype != torch.bfloat16:
        why = f"it takes bf16 q, k, got {k.dtype}"
    return None if why is None else f"bwd_grads='tilelang' (KDA's chunk-parallel TileLang backward): {why}"


def tilelang_grads(
    q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, do: Tensor, tt: Tensor, h: Tensor, dh: Tensor, *,
    index: ChunkIndex, kept: dict[str, Tensor], scale: float,
) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:  # fmt: skip
    """(dq, dk, dv, dg, dbeta) of KDA's chunks on the two TileLang kernels (module docstring) from the forward's kept
    gated tensors (kept: `KEPT_GATED`'s backward names ag, aqk, qs, ke, ks, gs), T, the chunk states h and their
    gradients dh `[NT, HV, K, V]` (`chunk_bwd`'s step 2); `tilelang_grads_refusal` has passed. `chunk_bwd`'s grads_fn.
    Grouped heads (HV = G Hk): the second kernel reads each value head's q, k head; dq and dk, per value head, are
    summed per group after."""
    B, T, Hk, K = k.shape
    HV = v.shape[2]
    # dense sequences of whole chunks: chunk c at rows 64 c; else each chunk's rows from the bounds (every ChunkIndex
    # has them, dense ones too)
    varlen = (index.cu_seqlens, index.chunk_indices) if index.is_varlen or T % index.chunk_size else None

    def rows(x: Tensor) -> Tensor:  # [B, T, ..] -> the kernels' rows [B * T, ..]
        return x.reshape(B * T, *x.shape[2:])

    s = state_grads_hopper(h, dh, rows(v), rows(do), rows(kept["ag"]), rows(kept["aqk"]), rows(kept["ke"]),
                           rows(kept["ks"]), kept["gs"], varlen=varlen, grads_dtype=KDA_TILELANG_GRADS_DTYPE)  # fmt: skip
    gated = {"qg": rows(kept["qs"]), "ke": rows(kept["ke"]), "kd": rows(kept["ks"])}
    # (session 32) ungrouped, dq and dk come in the inputs' bf16 from the kernel: no fp32 buffers and casts after (a
    # grouped head's sum stays in fp32 before its one rounding)
    dq, dk, dg, dbeta = bwd_products_hopper(rows(q), rows(k), rows(g), rows(beta), rows(tt), gated, s, scale=scale,
                                            varlen=varlen, out_dtype=q.dtype if Hk == HV else torch.float32)  # fmt: skip
    return (group_sum(dq.view(B, T, HV, K), Hk).to(q.dtype), group_sum(dk.view(B, T, HV, K), Hk).to(k.dtype),
            s["dW"].view(B, T, HV, -1).to(v.dtype), dg.view(B, T, HV, K).to(g.dtype),
            dbeta.view(B, T, HV).to(beta.dtype))  # fmt: skip
