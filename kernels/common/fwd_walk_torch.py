"""TORCH MIRROR of the TileLang forward walk (`kernels.ops.gdn.fwd_walk`), GDN's and KDA's gated form: the kernel's
arguments (flattened tokens, range bounds, chunk offsets, program map, final_idx) and its per-chunk steps, in plain
PyTorch (fp32, or fp64 for fp64 inputs). CI tests it against the per-token references over split varlen ranges; the
GPU tests check the kernel against it.

Per program p (range pmap[p], tokens [bos, eos)), per chunk of C rows from S = h0[p] (or zeros), rows past eos cut as
the kernel cuts them. GDN (W and eR zero past eos, the gate cumsum repeating the last row's):

    U = K S,  W = V - eG o U,  Vd = Ag W,  o = scale (eG o (Q S) + Tril(Q K^T o Gam) Vd),  S = gl S + K^T (eR o Vd)

KDA's gated form (kd given: q, k, kd are the Ag pass's qg, ke, kd at the value heads, gs its G_C per chunk at the
range's chunk offsets, aqk its Aqk, scale included; W and Vd zero past eos):

    W = V - ke S,  Vd = Ag W,  o = qg S + Tril(Aqk) Vd,  S = diag(e^(G_C)) S + kd^T Vd

and h[co[range] + chunk] = S entering each chunk (store_h), ht[fin[p]] = S leaving the range where fin[p] >= 0.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["fwd_walk"]


def fwd_walk(
    q: Tensor | None, k: Tensor, v: Tensor, ag: Tensor, gs: Tensor, *, cu: Tensor, co: Tensor, pmap: Tensor,
    fin: Tensor, scale: float, h0: Tensor | None = None, num_states: int = 0, num_chunks: int | None = None,
    aqk: Tensor | None = None, kd: Tensor | None = None,
) -> tuple[Tensor | None, Tensor | None, Tensor | None]:  # fmt: skip
    """(o `[N, HV, V]` or None without q, ht `[num_states, HV, K, V]` or None at num_states 0, h `[num_chunks, HV, K,
    V]` or None), in fp64 for fp64 inputs, else in fp32 from the inputs as given. q, k `[N, Hk, K]`, v `[N, HV, V]`,
    ag `[N, HV, C]`, gs `[N, HV]` (flattened tokens); cu `[R + 1]`, co `[R]`, pmap, fin `[P]` int; h0 `[P, HV, K, V]`
    or None. kd `[N, HV, K]`: the gated form (module docstring; q, k `[N, HV, K]`, gs `[NT, HV, K]`, aqk `[N, HV, C]`
    with q, scale unused). Rows past the last token read as zeros."""
    N, Hk, K = k.shape
    HV, V, C = v.shape[1], v.shape[2], ag.shape[-1]
    G = HV // Hk
    dt = torch.float64 if k.dtype == torch.float64 else torch.float32
    zero = torch.zeros((), dtype=dt)
    o = torch.zeros(N, HV, V, dtype=dt) if q is not None else None
    ht = torch.zeros(num_states, HV, K, V, dtype=dt) if num_states else None
    hs = torch.zeros(num_chunks, HV, K, V, dtype=dt) if num_chunks is not None else None

    def rows(x: Tensor, t0: int, h: int) -> Tensor:  # [C, D] of head h from token t0, zeros past the tensor
        out = torch.zeros(C, x.shape[-1], dtype=dt)
        n = max(0, min(C, N - t0))
        out[:n] = x[t0 : t0 + n, h].to(dt)
        return out

    for p in range(pmap.numel()):
        r = int(pmap[p])
        bos, eos, boc = int(cu[r]), int(cu[r + 1]), int(co[r])
        for h in range(HV):
            hk = h // G
            S = h0[p, h].to(dt).clone() if h0 is not None else torch.zeros(K, V, dtype=dt)
            for i in range((eos - bos + C - 1) // C):
                t0 = bos + i * C
                live = (torch.arange(C) + t0 < eos)[:, None]
                kc, vc, ac = rows(k, t0, hk), rows(v, t0, h), rows(ag, t0, h)
                if hs is not None:
                    hs[boc + i, h] = S
                if kd is not None:  # KDA's gated form
                    Vd = torch.where(live, ac @ torch.where(live, vc - kc @ S, zero), zero)
                    if o is not None:
                        assert q is not None and aqk is not None
                        oc = rows(q, t0, hk) @ S + torch.tril(rows(aqk, t0, h)) @ Vd
                    S = gs[boc + i, h].to(dt).exp()[:, None] * S + rows(kd, t0, h).T @ Vd
                else:
                    g = gs[torch.clamp(torch.arange(C) + t0, max=eos - 1), h].to(dt)
                    eg, gl = g.exp(), g[-1].exp()
                    er = torch.where(live[:, 0], (g[-1] - g).exp(), zero)
                    Vd = ac @ torch.where(live, vc - eg[:, None] * (kc @ S), zero)
                    if o is not None:
                        assert q is not None
                        qc = rows(q, t0, hk)
                        gam = torch.tril((g[:, None] - g[None, :]).exp())
                        oc = scale * (eg[:, None] * (qc @ S) + ((qc @ kc.T) * gam) @ Vd)
                    S = gl * S + kc.T @ (er[:, None] * Vd)
                if o is not None:
                    n = int(live.sum())
                    o[t0 : t0 + n, h] = oc[:n]
            if ht is not None and int(fin[p]) >= 0:
                ht[int(fin[p]), h] = S
    return o, ht, hs
