"""The state products of KDA's chunk backward as one TileLang kernel per (chunk, value head) on Hopper: the first half
of the planned chunk-parallel KDA backward (`kernels/NOTES.md`, "KDA's backward, the next kernel"; the decayed
products are `kernels.ops.kda.bwd_products_hopper`); the step calls it under `LaunchPlan(bwd_grads="tilelang")`
(`kernels.ops.kda.ag_bwd.tilelang_grads`; right on the H200, 1.86 ms at 1x64K there in session 32). Its CPU mirror
is `kernels.ops.kda.reverse_bwd_torch.state_products`.

Per chunk of C = 64 rows, from the state S entering it and the gradient dS' reaching its leaving state (`[K, V]`,
K = V = 128, as the Triton state passes store them: `chunk_state_fwd`'s h, `chunk_state_bwd`'s dh) and what the
forward keeps under "ag" (Ag, Aqk `[C, C]`; ke, kd, qg `[C, K]`; G_C `[K]`), nine warpgroup products in bf16:

    W = V - ke S,  U = Ag W,  dU = Aqk^T dO + kd dS',  dV = dW = Ag^T dU
    dAqk = Tril(dO U^T),  dAg = dU W^T,  dqg = dO S^T,  dke = -dW S^T,  dkd = U dS'^T
    dG_C = e^G_C o rowsum_V(S o dS')

W, U, dU and dW are rounded to bf16 for the products that read them (as the Triton backward's v_new and dv_new).
Two warpgroups; 160 KB of shared memory (163840 bytes in the generated source; one program an SM). Sizes: K = V =
128, chunk 64, bf16, sm_90, TileLang `kernels.ops.gdn.tilelang_hopper.TILELANG_VERSION`; refused in one line
otherwise. Dense rows (chunk c at 64 c..), or varlen (session 31: a build of its own; each chunk's rows from
`cu_seqlens` and the chunk index, the rows past its sequence's end cleared in every input and not written). Tested on
the GPU against the mirror (tests/kernels/ops/kda/test_state_grads_hopper.py).
"""

import functools
from typing import Any

import torch
from torch import Tensor

from kernels.ops.gdn.tilelang_hopper import chunk_span, clear_rows, hopper_jit, stand_in, tilelang_refusal
from kernels.parallel_compile import build_beside

__all__ = ["state_grads_hopper", "state_grads_refusal"]

_WHAT = "KDA state products"  # how the refusals name this kernel
_THREADS = 256


def state_grads_refusal(K: int, V: int, BT: int, device: torch.device) -> str | None:
    """Why this kernel cannot run here (one line), or None."""
    return tilelang_refusal(_WHAT, K, V, BT, device)


@functools.cache
def _build(H: int, varlen: bool = False, bf16_grads: bool = False) -> Any:
    """The compiled kernel for H value heads (TileLang JIT, cached on disk by TileLang too); varlen: chunk i_c at the
    rows its (sequence, chunk) pair names (`cu`, `ci`), the rows past its sequence's end read as zeros and not
    written; else chunk c at rows 64 c (`cu`, `ci` unread). bf16_grads: dqg, dke, dkd written in bf16, else fp32."""
    import tilelang.language as T

    K = V = 128
    C = 64
    fp32, io = "float32", "bfloat16"
    gdt = io if bf16_grads else fp32  # dqg's, dke's, dkd's
    nchunk, nseq = T.dynamic("nchunk"), T.dynamic("nseq")
    # the rows: any count under varlen; dense, 64 a chunk (then TileLang checks no row bound: the dense build's code
    # is the one before varlen came)
    ntok = T.dynamic("ntok") if varlen else nchunk * C

    @hopper_jit()
    def build() -> Any:
        span, clear = chunk_span(T, C, varlen), clear_rows(T)

        @T.macro
        def rows_out(x_f, out, sign, t0, n, i_h):
            """sign x_f [C, w] into out's rows t0.. of head i_h (a varlen chunk's rows past its sequence not written)."""
            if varlen:
                for r, c in T.Parallel(C, x_f.shape[1]):
                    if r < n:
                        out[t0 + r, i_h, c] = T.cast(sign * x_f[r, c], out.dtype)
            elif sign == 1.0:
                T.copy(x_f, out[t0 : t0 + C, i_h, :])
            else:
                for r, c in T.Parallel(C, x_f.shape[1]):
                    out[t0 + r, i_h, c] = T.cast(sign * x_f[r, c], out.dtype)

        @T.prim_func
        def state_grads(
            h: T.Tensor((nchunk, H, K, V), io), dh: T.Tensor((nchunk, H, K, V), io),
            v: T.Tensor((ntok, H, V), io), do: T.Tensor((ntok, H, V), io),
            ag: T.Tensor((ntok, H, C), io), aqk: T.Tensor((ntok, H, C), io),
            ke: T.Tensor((ntok, H, K), io), kd: T.Tensor((ntok, H, K), io),
            gc: T.Tensor((nchunk, H, K), fp32),
            cu: T.Tensor((nseq + 1,), "int32"), ci: T.Tensor((nchunk, 2), "int32"),
            dv: T.Tensor((ntok, H, V), io), daqk: T.Tensor((ntok, H, C), fp32),
            dag: T.Tensor((ntok, H, C), fp32), dqg: T.Tensor((ntok, H, K), gdt),
            dke: T.Tensor((ntok, H, K), gdt), dkd: T.Tensor((ntok, H, K), gdt),
            dgc: T.Tensor((nchunk, H, K), fp32),
        ):  # fmt: skip
            with T.Kernel(nchunk * H, threads=_THREADS) as (bid,):
                i_c = bid // H
                i_h = bid % H
                span_l = T.alloc_local((2,), "int32")
                span(cu, ci, i_c, span_l)
                t0 = span_l[0]
                n = span_l[1]  # the chunk's rows in its sequence (C but for a varlen sequence's last)
                s_s = T.alloc_shared((K, V), io)
                ds_s = T.alloc_shared((K, V), io)
                v_s = T.alloc_shared((C, V), io)  # V; then W
                do_s = T.alloc_shared((C, V), io)
                ke_s = T.alloc_shared((C, K), io)  # ke; then dW
                kd_s = T.alloc_shared((C, K), io)
                ag_s = T.alloc_shared((C, C), io)
                aq_s = T.alloc_shared((C, C), io)
                u_s = T.alloc_shared((C, V), io)
                du_s = T.alloc_shared((C, V), io)
                w_f = T.alloc_fragment((C, V), fp32)
                x_f = T.alloc_fragment((C, V), fp32)
                c_f = T.alloc_fragment((C, C), fp32)
                sd_f = T.alloc_fragment((K, V), fp32)
                sd_s = T.alloc_shared((K,), fp32)

                T.copy(h[i_c, i_h, 0:K, 0:V], s_s)
                T.copy(dh[i_c, i_h, 0:K, 0:V], ds_s)
                T.copy(v[t0 : t0 + C, i_h, :], v_s)
                T.copy(do[t0 : t0 + C, i_h, :], do_s)
                T.copy(ke[t0 : t0 + C, i_h, :], ke_s)
                T.copy(kd[t0 : t0 + C, i_h, :], kd_s)
                T.copy(ag[t0 : t0 + C, i_h, :], ag_s)
                T.copy(aqk[t0 : t0 + C, i_h, :], aq_s)
                # Aqk above the diagonal cleared: the Triton Ag pass leaves it unwritten (`_store_aqk`), whatever
                # memory held there (the TileLang pass writes zeros); a varlen chunk's rows past its sequence (the
                # next sequence's) cleared in every input: then no product carries them into a kept row
                for r, c in T.Parallel(C, C):
                    if c > r:
                        aq_s[r, c] = T.cast(0.0, io)
                if varlen:
                    clear(ag_s, n)
                    clear(aq_s, n)
                    clear(v_s, n)
                    clear(do_s, n)
                    clear(ke_s, n)
                    clear(kd_s, n)

                # dG_C = e^G_C o rowsum_V(S o dS')
                for r, c in T.Parallel(K, V):
                    sd_f[r, c] = T.cast(s_s[r, c], fp32) * T.cast(ds_s[r, c], fp32)
                T.reduce_sum(sd_f, sd_s, dim=1)
                for r in T.Parallel(K):
                    dgc[i_c, i_h, r] = T.exp(gc[i_c, i_h, r]) * sd_s[r]

                # W = V - ke S (into v_s), U = Ag W
                T.gemm(ke_s, s_s, w_f, clear_accum=True)
                for r, c in T.Parallel(C, V):
                    v_s[r, c] = T.cast(T.cast(v_s[r, c], fp32) - w_f[r, c], io)
                T.fence_proxy_async()
                T.gemm(ag_s, v_s, x_f, clear_accum=True)
                T.copy(x_f, u_s)
                # dU = Aqk^T dO + kd dS'
                T.gemm(aq_s, do_s, w_f, transpose_A=True, clear_accum=True)
                T.gemm(kd_s, ds_s, w_f)
                T.copy(w_f, du_s)
                T.fence_proxy_async()
                # dV = dW = Ag^T dU (into ke_s, whose ke is read no more)
                T.gemm(ag_s, du_s, x_f, transpose_A=True, clear_accum=True)
                rows_out(x_f, dv, 1.0, t0, n, i_h)
                T.copy(x_f, ke_s)
                T.fence_proxy_async()
                # dAqk = Tril(dO U^T), dAg = dU W^T
                T.gemm(do_s, u_s, c_f, transpose_B=True, clear_accum=True)
                for r, c in T.Parallel(C, C):
                    if r < n:
                        daqk[t0 + r, i_h, c] = T.if_then_else(c <= r, c_f[r, c], 0.0)
                T.gemm(du_s, v_s, c_f, transpose_B=True, clear_accum=True)
                rows_out(c_f, dag, 1.0, t0, n, i_h)
                # dqg = dO S^T, dke = -dW S^T, dkd = U dS'^T
                T.gemm(do_s, s_s, w_f, transpose_B=True, clear_accum=True)
                rows_out(w_f, dqg, 1.0, t0, n, i_h)
                T.gemm(ke_s, s_s, w_f, transpose_B=True, clear_accum=True)
                rows_out(w_f, dke, -1.0, t0, n, i_h)
                T.gemm(u_s, ds_s, w_f, transpose_B=True, clear_accum=True)
                rows_out(w_f, dkd, 1.0, t0, n, i_h)

        return state_grads

    return build()


def state_grads_hopper(
    h: Tensor, dh: Tensor, v: Tensor, do: Tensor, ag: Tensor, aqk: Tensor, ke: Tensor, kd: Tensor, gc: Tensor, *,
    varlen: tuple[Tensor, Tensor] | None = None, grads_dtype: torch.dtype = torch.float32,
) -> dict[str, Tensor]:  # fmt: skip
    """`state_products`' outputs on this kernel (fp32; dW bf16; dqg, dke, dkd in grads_dtype, fp32 or bf16): {"dW"
    (= dV), "dAqk", "dAg", "dqg", "dke", "dkd" `[N, HV, ..]`, "dGC" `[NT, HV, K]`} from h, dh `[NT, HV, K, V]`, v, do `[N, HV, V]`, ag, aqk `[N, HV, 64]`, ke, kd `[N, HV, K]`
    (bf16) and gc fp32 `[NT, HV, K]`: chunk c at rows 64 c (N = 64 NT), or with varlen (cu_seqlens, chunk_indices:
    `kernels.common.index.ChunkIndex`'s, int32 on the device) at the rows of its (sequence, chunk) pair, the rows past
    a sequence's end unwritten. Raises ValueError where `state_grads_refusal` gives a reason."""
    NT, HV, K, V = h.shape
    why = state_grads_refusal(K, V, ag.shape[-1], h.device)
    if why is not None:
        raise ValueError(why)
    N = v.shape[0]
    rows = {"do": (N, HV, V), "ag": (N, HV, 64), "aqk": (N, HV, 64), "ke": (N, HV, K), "kd": (N, HV, K)}
    given = {"dh": dh, "do": do, "ag": ag, "aqk": aqk, "ke": ke, "kd": kd, "gc": gc}
    want = {"dh": (NT, HV, K, V), "gc": (NT, HV, K), **rows}
    if varlen is not None:
        given["chunk_indices"], want["chunk_indices"] = varlen[1], (NT, 2)
    bad = [f"{n} {tuple(x.shape)}" for n, x in given.items() if tuple(x.shape) != want[n]]
    if (varlen is None and N != 64 * NT) or bad:
        raise ValueError(f"state_grads_hopper: with h [NT, HV, 128, 128] = {tuple(h.shape)} and v [N, HV, 128] = "
                         f"{tuple(v.shape)}, got {', '.join(bad) or 'N != 64 NT (dense rows)'}")  # fmt: skip
    xs = [t.to(torch.bfloat16).contiguous() for t in (h, dh, v, do, ag, aqk, ke, kd)]
    bounds = varlen if varlen is not None else (stand_in(h.device, torch.int32, 2), stand_in(h.device, torch.int32, NT, 2))
    # dW (= dV, a final gradient) in bf16 (session 31: its fp32 copy and the cast after cost 0.3 ms and 268 MB at
    # 1x64K on the H100); dAqk, dAg fp32 for the products kernel; dqg, dke, dkd as asked (session 32: bf16 halves
    # their 1.6 GB at 1x64K, written here and read by the products kernel)
    if grads_dtype not in (torch.float32, torch.bfloat16):
        raise ValueError(f"state_grads_hopper: grads_dtype is fp32 or bf16, got {grads_dtype}")
    dtypes = {"dW": torch.bfloat16, "dAqk": torch.float32, "dAg": torch.float32}
    outs = {name: xs[2].new_empty(N, HV, n, dtype=dtypes.get(name, grads_dtype))
            for name, n in (("dW", V), ("dAqk", 64), ("dAg", 64), ("dqg", K), ("dke", K), ("dkd", K))}  # fmt: skip
    outs["dGC"] = gc.new_empty(NT, HV, K, dtype=torch.float32)
    key = (HV, varlen is not None, grads_dtype == torch.bfloat16)
    # (in `compile_ahead`'s dry run the kernel builds beside the Triton compiles and does not launch)
    if NT and not build_beside(("kda_state_grads", *key), _build, *key):
        _build(*key)(*xs, gc.float().contiguous(), *(b.int().contiguous() for b in bounds), *outs.values())
    return outs
