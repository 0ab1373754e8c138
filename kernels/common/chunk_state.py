"""The serial state pass across chunks (GDN and KDA), one Triton program per (sequence, head, V-block).

With S the fp32 state [K, BV] entering chunk t (h0 or zeros at the sequence start):

    v_new = u - w S
    S'    = Diag(gamma_C) S + K~^T v_new,      K~ = K * exp(G_C - G)

GDN passes the raw keys and the fp32 gate cumsum [B, T, H] (K~ and gamma_C are formed here); KDA passes the
pre-gated keys kg and the per-chunk last-row gate gc [NT_total, H, K] (from `kernels.common.wy`). H counts the value
heads (u's); k and q may have H / G heads (grouped heads, G from the shapes): a program reads head i_h // G.

GDN's Ag form (`ag` given: w and u are not formed): u is v and v_new = Ag (v - exp(G) o (K S)), with Ag = T diag(beta)
the forward's kept factor `[B, T, H, BT]` (`kernels.ops.gdn.ag_bwd`): the same v_new as u - w S with w = Ag (exp(G) o
K), u = Ag v, one more [BT, BT] x [BT, BV] product per chunk and no w, u in memory.

One kernel, four launchers (each with its own launch spec, since their best configs differ):
- `chunk_state_fwd`: stores the per-chunk entering states h [NT_total, H, K, V] (k's dtype) and v_new, for
  `kernels.common.chunk_output` (the FLA-style split into a state pass and a chunk-parallel output pass).
- `chunk_state_output_fwd`: the output fused into the pass, o = scale (Q exp G) S + Aqk v_new (KDA:
  qg S + Aqk v_new; Aqk from `kernels.common.wy` includes the scale), so neither h nor v_new touches memory.
- `chunk_state_ag_fwd`: the plain pass in the Ag form (GDN), h only (what the reverse-walk backward reads).
- `chunk_state_transition_fwd`: the segment map by linearity: the pass runs on the augmented state
  [K, K+V] from [I | 0] with right-hand side [0 | u], so the columns < K end as M and the others as S_ext.

Varlen: `cu_seqlens` gives token bounds and `chunk_offsets` the global index of each sequence's first chunk
(for h and gc); `seq_map` (optional) makes program n run sequence seq_map[n] (the transition of only some
segments); `final_idx` (optional) stores a program's final state at ht[final_idx[n]], or nowhere if < 0;
`need` (optional, transition only, bool per program, or per program and head) skips the work of programs whose
flag is 0: their chunk loop runs zero times and they store M = 0, S_ext = 0 (a device-side mask: no host sync,
same launch). `chunk_state_final_fwd` runs the plain pass from zero over the layout's ranges and stores only the
final states (the warmup windows of `kernels.common.warm_split`).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch import Tensor

from kernels.common.chunk_program import given, group_heads, heuristics
from kernels.common.state_program import range_of_program
from kernels.configs import KernelSpec, LaunchConfig, cdiv, head_block, register
from kernels.plan import LaunchPlan, launch_config

__all__ = [
    "CHUNK_STATE_AG_FWD",
    "CHUNK_STATE_FWD",
    "CHUNK_STATE_OUTPUT_FWD",
    "CHUNK_STATE_TRANSITION_FWD",
    "SeqLayout",
    "chunk_state_ag_fwd",
    "chunk_state_final_fwd",
    "chunk_state_fwd",
    "chunk_state_output_fwd",
    "chunk_state_transition_fwd",
    "skipped_states",
]

_KEY = ("H", "K", "V", "BT", "GATE", "IS_VARLEN", "dtype")

CHUNK_STATE_FWD = register(KernelSpec(
    name="chunk_state_fwd",
    key=_KEY,
    # FLA's fwd_h picks BV=64 on Hopper for K=V=128: a [128, 64] fp32 state is 64 registers a thread at 4 warps
    # (182 in all, ptxas sm_90a); num_stages 2 prefetches w/u/k (98 KB of shared memory)
    default=LaunchConfig(BV=64, num_warps=4, num_stages=2),
    # BV 32 doubles the programs (helps when N*H is small), 128 halves them; stages prefetch w/u/k
    space={"BV": (32, 64, 128), "num_warps": (2, 4, 8), "num_stages": (1, 2, 3)},
))

CHUNK_STATE_AG_FWD = register(KernelSpec(
    name="chunk_state_ag_fwd",
    key=_KEY,
    # the plain pass's tiles plus Ag [64, 64] and one more product per chunk; v_new is not stored
    default=LaunchConfig(BV=64, num_warps=4, num_stages=2),
    space={"BV": (32, 64, 128), "num_warps": (4, 8), "num_stages": (1, 2, 3)},
))

CHUNK_STATE_OUTPUT_FWD = register(KernelSpec(
    name="chunk_state_output_fwd",
    key=_KEY,
    # the fused pass also loads q and Aqk: BV 64 / 4 warps is 247-255 registers without spills; one stage keeps
    # shared memory at 57 KB so 2 programs share an SM (two stages take 131 KB: one program per SM)
    default=LaunchConfig(BV=64, num_warps=4, num_stages=1),
    space={"BV": (32, 64, 128), "num_warps": (4, 8), "num_stages": (1, 2, 3)},
))

CHUNK_STATE_TRANSITION_FWD = register(KernelSpec(
    name="chunk_state_transition_fwd",
    key=_KEY,
    # (K+V)/BV programs per sequence and head; same per-chunk work as the plain pass without stores;
    # 167 registers and 57 KB of shared memory at one stage: 3 programs per SM
    default=LaunchConfig(BV=64, num_warps=4, num_stages=1),
    space={"BV": (32, 64, 128), "num_warps": (2, 4, 8), "num_stages": (1, 2, 3)},
))


@heuristics({
    **given(USE_INITIAL_STATE="h0", STORE_FINAL_STATE="ht", STORE_STATES="h", SAVE_NEW_VALUE="v_new", FUSE_OUTPUT="o",
            TRANSITION="m", IS_VARLEN="cu_seqlens", USE_SEQ_MAP="seq_map", USE_FINAL_IDX="final_idx", USE_NEED="need",
            AG_FORM="ag"),
    "G": group_heads("u"),
})
@triton.jit(do_not_specialize=["T"])
def chunk_state_fwd_kernel(
    k,  # [B, T, H, K]: raw keys (GDN) or kg (KDA)
    w,  # [B, T, H, K] (None in the Ag form)
    u,  # [B, T, H, V] (the Ag form: v)
    ag,  # [B, T, H, BT] Ag, lower incl. the diagonal (GDN's Ag form) or None
    g,  # GDN: gate cumsum [B, T, H] fp32; KDA: last-row gate per chunk [NT_total, H, K] fp32
    q,  # fused output: q (GDN) or qg (KDA), [B, T, H, K]
    aqk,  # fused output: scale (QK^T (x) decay), lower incl. diagonal, [B, T, H, BT]
    h0,  # [N, H, K, V] fp32 or None
    h,  # out [NT_total, H, K, V] or None
    ht,  # out [N*, H, K, V] fp32 or None (TRANSITION: S_ext)
    m,  # out [N, H, K, K] fp32 (TRANSITION) or None
    v_new,  # out [B, T, H, V] or None
    o,  # out [B, T, H, V] or None
    cu_seqlens,  # [N+1] int32 or None
    chunk_offsets,  # [N+1] int32 or None
    seq_map,  # [N_programs] int32 or None
    final_idx,  # [N_programs] int32 or None
    need,  # [N_programs] or [N_programs, H] bool or None (TRANSITION): 0 = skip this program's pass, store zeros
    scale,
    T,
    H: tl.constexpr, K: tl.constexpr, V: tl.constexpr, BT: tl.constexpr, BK: tl.constexpr, BV: tl.constexpr,
    GATE_VECTOR: tl.constexpr, USE_INITIAL_STATE: tl.constexpr, STORE_FINAL_STATE: tl.constexpr,
    STORE_STATES: tl.constexpr, SAVE_NEW_VALUE: tl.constexpr, FUSE_OUTPUT: tl.constexpr, TRANSITION: tl.constexpr,
    IS_VARLEN: tl.constexpr, USE_SEQ_MAP: tl.constexpr, USE_FINAL_IDX: tl.constexpr, USE_NEED: tl.constexpr,
    AG_FORM: tl.constexpr, NEED_PER_HEAD: tl.constexpr = False, G: tl.constexpr = 1,
):
    i_v, i_nh = tl.program_id(0), tl.program_id(1)
    i_n, i_h = (i_nh // H).to(tl.int64), i_nh % H
    i_s, bos, T, boc, NT = range_of_program(i_n, seq_map, cu_seqlens, chunk_offsets, T, BT, IS_VARLEN, USE_SEQ_MAP)
    if USE_NEED:
        # a masked program walks no chunk (branch-free skip; early return also compiles, but this keeps one exit
        # and stores defined zeros)
        if NEED_PER_HEAD:
            b_need = tl.load(need + i_n * H + i_h) != 0
        else:
            b_need = tl.load(need + i_n) != 0
        NT = tl.where(b_need, NT, 0)
    else:
        b_need = True
    dt = k.dtype.element_ty

    o_k = tl.arange(0, BK)  # the state rows: K padded to a power of two, the rows past K masked
    m_k = o_k < K
    o_t = tl.arange(0, BT)
    o_c = i_v * BV + tl.arange(0, BV)  # state columns (TRANSITION: of the augmented [K, K+V] state)
    m_causal = o_t[:, None] >= o_t[None, :]
    if TRANSITION:
        m_c = o_c < K + V
    else:
        m_c = o_c < V
    m_kc = m_k[:, None] & m_c[None, :]

    if TRANSITION:
        b_h = tl.where((o_k[:, None] == o_c[None, :]) & (o_c < K)[None, :] & b_need, 1., 0.)  # [I | 0] (zeros when masked)
        if USE_INITIAL_STATE:  # a skipped program's S_ext (its certified window's state), in its S_ext columns
            m_s = m_k[:, None] & (o_c >= K)[None, :] & m_c[None, :] & (b_need == 0)
            b_h += tl.load(h0 + (i_n * H + i_h) * K * V + o_k[:, None] * V + (o_c - K)[None, :], mask=m_s, other=0.)
    else:
        b_h = tl.zeros([BK, BV], dtype=tl.float32)
        if USE_INITIAL_STATE:
            b_h += tl.load(h0 + (i_n * H + i_h) * K * V + o_k[:, None] * V + o_c[None, :], mask=m_kc, other=0.)

    for i_t in range(NT):
        o_r = i_t * BT + o_t
        m_r = o_r < T
        p_row = (bos + o_r) * H + i_h  # [BT] token-head rows
        p_qk = (bos + o_r) * (H // G) + i_h // G  # the rows of k and q (grouped heads: the shared head)
        if STORE_STATES:
            tl.store(h + ((boc + i_t) * H + i_h) * K * V + o_k[:, None] * V + o_c[None, :], b_h.to(h.dtype.element_ty),
                     mask=m_kc)
        if not AG_FORM:
            b_w = tl.load(w + p_row[:, None] * K + o_k[None, :], mask=m_r[:, None] & m_k[None, :], other=0.)
        if TRANSITION:
            b_u = tl.load(u + p_row[:, None] * V + (o_c - K)[None, :], mask=m_r[:, None] & ((o_c >= K) & m_c)[None, :],
                          other=0.)
        else:
            b_u = tl.load(u + p_row[:, None] * V + o_c[None, :], mask=m_r[:, None] & m_c[None, :], other=0.)
        b_kT = tl.load(k + p_qk[None, :] * K + o_k[:, None], mask=m_r[None, :] & m_k[:, None], other=0.)  # [BK, BT]
        b_hc = b_h.to(dt)
        if AG_FORM:  # v_new = Ag (v - exp(G) o (K S)) (GDN: scalar gate)
            b_ge = tl.exp(tl.load(g + p_row, mask=m_r, other=0.))
            b_a = tl.load(ag + p_row[:, None] * BT + o_t[None, :], mask=m_r[:, None] & m_causal, other=0.)
            b_wn = b_u.to(tl.float32) - b_ge[:, None] * tl.dot(tl.trans(b_kT), b_hc)
            b_v = tl.dot(b_a, b_wn.to(dt))
        else:
            b_v = b_u.to(tl.float32) - tl.dot(b_w, b_hc)  # v_new [BT, BV]
        if SAVE_NEW_VALUE:
            tl.store(v_new + p_row[:, None] * V + o_c[None, :], b_v.to(v_new.dtype.element_ty),
                     mask=m_r[:, None] & m_c[None, :])
        if GATE_VECTOR:
            b_gl = tl.load(g + ((boc + i_t) * H + i_h) * K + o_k, mask=m_k, other=0.)  # [BK]
            if FUSE_OUTPUT:
                b_q = tl.load(q + p_qk[:, None] * K + o_k[None, :], mask=m_r[:, None] & m_k[None, :], other=0.)
                b_A = tl.load(aqk + p_row[:, None] * BT + o_t[None, :], mask=m_r[:, None] & m_causal, other=0.)
                b_o = tl.dot(b_q, b_hc) + tl.dot(b_A, b_v.to(dt))
                tl.store(o + p_row[:, None] * V + o_c[None, :], b_o.to(o.dtype.element_ty), mask=m_r[:, None] & m_c[None, :])
            b_h = b_h * tl.exp(b_gl)[:, None]
            b_h = tl.dot(b_kT, b_v.to(dt), b_h)
        else:
            b_g = tl.load(g + p_row, mask=m_r, other=0.)  # [BT]
            b_gl = tl.load(g + (bos + tl.minimum(i_t * BT + BT, T) - 1) * H + i_h)
            if FUSE_OUTPUT:
                b_q = tl.load(q + p_qk[:, None] * K + o_k[None, :], mask=m_r[:, None] & m_k[None, :], other=0.)
                b_A = tl.load(aqk + p_row[:, None] * BT + o_t[None, :], mask=m_r[:, None] & m_causal, other=0.)
                b_o = tl.dot(b_q, b_hc) * (tl.exp(b_g) * scale)[:, None] + tl.dot(b_A, b_v.to(dt))
                tl.store(o + p_row[:, None] * V + o_c[None, :], b_o.to(o.dtype.element_ty), mask=m_r[:, None] & m_c[None, :])
            b_v = tl.where(m_r[:, None], b_v * tl.exp(b_gl - b_g)[:, None], 0.)
            b_h = b_h * tl.exp(b_gl)
            b_h = tl.dot(b_kT, b_v.to(dt), b_h)

    if TRANSITION:
        tl.store(m + (i_n * H + i_h) * K * K + o_k[:, None] * K + o_c[None, :], b_h, mask=m_k[:, None] & (o_c < K)[None, :])
        tl.store(ht + (i_n * H + i_h) * K * V + o_k[:, None] * V + (o_c - K)[None, :], b_h,
                 mask=m_k[:, None] & ((o_c >= K) & m_c)[None, :])
    elif STORE_FINAL_STATE:
        if USE_FINAL_IDX:
            i_f = tl.load(final_idx + i_n).to(tl.int64)
            if i_f >= 0:
                tl.store(ht + (i_f * H + i_h) * K * V + o_k[:, None] * V + o_c[None, :], b_h, mask=m_kc)
        else:
            tl.store(ht + (i_n * H + i_h) * K * V + o_k[:, None] * V + o_c[None, :], b_h, mask=m_kc)


# ---------------------------------------------------------------------------------------------------------------------
# launchers


class SeqLayout:
    """Which token ranges the pass walks: dense (B sequences of length T) or a varlen list of ranges.

    cu_seqlens / chunk_offsets: int32 device tensors `[S+1]` (None for dense); num_seqs: S, the programs per
    head and V-block unless `seq_map` narrows them; seq_map / final_idx: see the module docstring.
    """

    __slots__ = ("chunk_offsets", "cu_seqlens", "final_idx", "num_seqs", "seq_map")

    def __init__(self, num_seqs: int, cu_seqlens: Tensor | None = None, chunk_offsets: Tensor | None = None,
                 seq_map: Tensor | None = None, final_idx: Tensor | None = None) -> None:
        self.num_seqs = num_seqs
        self.cu_seqlens = cu_seqlens
        self.chunk_offsets = chunk_offsets
        self.seq_map = seq_map
        self.final_idx = final_idx

    @property
    def num_programs(self) -> int:
        return self.seq_map.numel() if self.seq_map is not None else self.num_seqs


def _key(H: int, K: int, V: int, BT: int, gate_vector: bool, layout: SeqLayout, dtype: torch.dtype) -> dict[str, object]:
    return {"H": H, "K": K, "V": V, "BT": BT, "GATE": "vector" if gate_vector else "scalar",
            "IS_VARLEN": layout.cu_seqlens is not None, "dtype": str(dtype).removeprefix("torch.")}


def _launch(cfg: LaunchConfig, ncols: int, layout: SeqLayout, H: int, *, k: Tensor, w: Tensor | None, u: Tensor,
            g: Tensor, BT: int, gate_vector: bool, ag: Tensor | None = None, q: Tensor | None = None,
            aqk: Tensor | None = None, h0: Tensor | None = None, h: Tensor | None = None, ht: Tensor | None = None,
            m: Tensor | None = None, v_new: Tensor | None = None, o: Tensor | None = None, need: Tensor | None = None,
            scale: float = 1.0) -> None:
    BV = cfg.BV
    K, V = k.shape[-1], u.shape[-1]
    assert BV is not None and BV >= 16 and BT >= 16, f"tiles must be >= 16, got BV={BV} BT={BT}"
    T = k.shape[1]
    grid = (cdiv(ncols, BV), layout.num_programs * H)  # the last block's columns past ncols are masked
    if grid[1] == 0:
        return
    chunk_state_fwd_kernel[grid](
        k, w, u, ag, g, q, aqk, h0, h, ht, m, v_new, o,
        layout.cu_seqlens, layout.chunk_offsets, layout.seq_map, layout.final_idx, need,
        scale, T, H=H, K=K, V=V, BT=BT, BK=head_block(K), BV=BV, GATE_VECTOR=gate_vector,
        NEED_PER_HEAD=need is not None and need.dim() == 2,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages,
    )


def chunk_state_fwd(
    k: Tensor, w: Tensor, u: Tensor, g: Tensor, *, layout: SeqLayout, num_chunks: int, BT: int, gate_vector: bool,
    h0: Tensor | None = None, output_final_state: bool = False, num_states: int | None = None,
    launch: LaunchPlan | None = None, save_v_new: bool = True,
) -> tuple[Tensor, Tensor | None, Tensor | None]:
    """Plain pass: (h [NT_total, H, K, V] in k's dtype, v_new (None without `save_v_new`), ht fp32 or None)."""
    H, K, V = u.shape[2], k.shape[3], u.shape[-1]
    cfg = launch_config(launch, CHUNK_STATE_FWD, _key(H, K, V, BT, gate_vector, layout, k.dtype), bv_limit=head_block(V))
    h = k.new_empty(num_chunks, H, K, V)
    v_new = torch.empty_like(u) if save_v_new else None
    ht = k.new_empty(num_states or layout.num_seqs, H, K, V, dtype=torch.float32) if output_final_state else None
    _launch(cfg, V, layout, H, k=k, w=w, u=u, g=g, BT=BT, gate_vector=gate_vector, h0=h0, h=h, ht=ht, v_new=v_new)
    return h, v_new, ht


def chunk_state_ag_fwd(
    k: Tensor, v: Tensor, ag: Tensor, gs: Tensor, *, layout: SeqLayout, num_chunks: int, BT: int,
    h0: Tensor | None = None, launch: LaunchPlan | None = None,
) -> Tensor:
    """GDN's plain pass in the Ag form (module docstring): h `[NT_total, H, K, V]` in k's dtype, the state entering
    every chunk, from the raw k `[B, T, H / G, K]`, v `[B, T, H, V]`, the forward's Ag `[B, T, H, BT]` and the fp32
    in-chunk gate cumsum gs `[B, T, H]` (what `chunk_state_fwd` stores from w = Ag (exp(G) o K), u = Ag v)."""
    H, K, V = v.shape[2], k.shape[3], v.shape[-1]
    if ag.shape != (*v.shape[:3], BT) or gs.shape != v.shape[:3]:
        raise ValueError(f"chunk_state_ag_fwd: Ag {tuple(ag.shape)} / gs {tuple(gs.shape)} do not match v "
                         f"{tuple(v.shape)} with chunk {BT}")  # fmt: skip
    cfg = launch_config(launch, CHUNK_STATE_AG_FWD, _key(H, K, V, BT, False, layout, k.dtype), bv_limit=head_block(V))
    h = k.new_empty(num_chunks, H, K, V)
    _launch(cfg, V, layout, H, k=k, w=None, u=v, g=gs, ag=ag, BT=BT, gate_vector=False, h0=h0, h=h)
    return h


def chunk_state_output_fwd(
    k: Tensor, w: Tensor, u: Tensor, g: Tensor, q: Tensor, *, layout: SeqLayout, BT: int, gate_vector: bool,
    scale: float, aqk: Tensor, h0: Tensor | None = None, output_final_state: bool = False,
    num_states: int | None = None, out_dtype: torch.dtype | None = None, launch: LaunchPlan | None = None,
) -> tuple[Tensor, Tensor | None]:
    """Pass with the output fused in: (o [B, T, H, V], ht fp32 or None). GDN: raw q; KDA: q is qg (scaled)."""
    H, K, V = u.shape[2], k.shape[3], u.shape[-1]
    cfg = launch_config(launch, CHUNK_STATE_OUTPUT_FWD, _key(H, K, V, BT, gate_vector, layout, k.dtype), bv_limit=head_block(V))
    o = torch.empty(u.shape, dtype=out_dtype or q.dtype, device=u.device)
    ht = k.new_empty(num_states or layout.num_seqs, H, K, V, dtype=torch.float32) if output_final_state else None
    _launch(cfg, V, layout, H, k=k, w=w, u=u, g=g, BT=BT, gate_vector=gate_vector, q=q, aqk=aqk, h0=h0, ht=ht, o=o,
            scale=scale)
    return o, ht


def skipped_states(skipped: Tensor | None, need: Tensor | None, shape: tuple[int, ...]) -> Tensor | None:
    """A launch's `skipped` states, contiguous, checked: fp32 of `shape` and only beside a `need` mask (the pairs it
    skips store them as they are: the warm split's certified windows, `kernels.common.warm_split` / `warm_bwd`)."""
    if skipped is None:
        return None
    assert need is not None and tuple(skipped.shape) == shape and skipped.dtype == torch.float32, (
        f"skipped must be fp32 {list(shape)} beside need, got {skipped.dtype} {tuple(skipped.shape)}"
    )
    return skipped.contiguous()


def chunk_state_transition_fwd(
    k: Tensor, w: Tensor, u: Tensor, g: Tensor, *, layout: SeqLayout, BT: int, gate_vector: bool,
    launch: LaunchPlan | None = None, need: Tensor | None = None, skipped: Tensor | None = None,
) -> tuple[Tensor, Tensor]:
    """Segment maps of the programs' sequences: (M [N, H, K, K], S_ext [N, H, K, V]) fp32, N = layout.num_programs.

    need: bool `[N]` or `[N, H]` on the device, or None (all): programs (per head) whose flag is False skip their
    pass and return zeros, or (S_ext) their state in skipped fp32 `[N, H, K, V]` where given (the warm split's
    certified windows and their E_win, `kernels.common.warm_split`).
    """
    H, K, V = u.shape[2], k.shape[3], u.shape[-1]
    cfg = launch_config(launch, CHUNK_STATE_TRANSITION_FWD, _key(H, K, V, BT, gate_vector, layout, k.dtype),
                        bv_limit=min(head_block(K), head_block(V)))
    N = layout.num_programs
    M = k.new_empty(N, H, K, K, dtype=torch.float32)
    S = k.new_empty(N, H, K, V, dtype=torch.float32)
    flags = None
    if need is not None:
        assert need.shape in ((N,), (N, H)) and need.dtype == torch.bool, \
            f"need must be bool [{N}] or [{N}, {H}], got {need.dtype} {tuple(need.shape)}"
        flags = need.contiguous()  # bool: the kernel reads one byte per program (Triton loads int1 as int8)
    _launch(cfg, K + V, layout, H, k=k, w=w, u=u, g=g, BT=BT, gate_vector=gate_vector,
            h0=skipped_states(skipped, need, (N, H, K, V)), ht=S, m=M, need=flags)
    return M, S


def chunk_state_final_fwd(
    k: Tensor, w: Tensor, u: Tensor, g: Tensor, *, layout: SeqLayout, BT: int, gate_vector: bool,
    launch: LaunchPlan | None = None,
) -> Tensor:
    """The state at the end of each program's range from a zero start, fp32 `[N, H, K, V]` (N = layout.num_programs).

    The plain pass without per-chunk stores (the transition's S_ext columns alone, no M): the warmup windows of
    `kernels.common.warm_split`. Ranges are whole chunks of the forward's chunking (GDN's gate cumsum is per chunk).
    """
    H, K, V = u.shape[2], k.shape[3], u.shape[-1]
    cfg = launch_config(launch, CHUNK_STATE_TRANSITION_FWD, _key(H, K, V, BT, gate_vector, layout, k.dtype),
                        bv_limit=head_block(V))
    ht = k.new_empty(layout.num_programs, H, K, V, dtype=torch.float32)
    _launch(cfg, V, layout, H, k=k, w=w, u=u, g=g, BT=BT, gate_vector=gate_vector, ht=ht)
    return ht
