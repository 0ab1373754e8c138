"""KDA's gated Ag form in torch, for the forward walk's tests (`kernels.common.fwd_walk_torch`, the TileLang walk's
gated build): what `kernels.ops.kda.wy_ag.wy_kda_ag` stores with its `gated` variant (`GatedKeys`), formed from the
chunked torch path's per-chunk quantities (`kernels.common.chunk_torch.chunk_prepare`) in the inputs' compute dtype,
and the chunk states entering each chunk (`chunk_fwd_torch`'s)."""

from __future__ import annotations

import torch
from torch import Tensor

from kernels.common.chunk_torch import chunk_fwd_torch, chunk_prepare, compute_dtype, from_chunks, to_chunks
from kernels.common.decay import floor_gate
from kernels.common.index import prepare_chunk_index

__all__ = ["gated_for_walk"]


def gated_for_walk(
    q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, h0: Tensor, cu: list[int], C: int, scale: float
) -> dict[str, Tensor | list[int]]:
    """For sequences bounded by cu (B = 1; q, k with Hk heads, v, g, beta with HV): "qg" = scale Q e^G, "ke" = K e^G,
    "kd" = K e^(G_C - G) `[1, T, HV, K]`, "gc" = G_C `[NT, HV, K]` (the chunk's last row in its sequence), "ag" =
    (I + A)^{-1} diag(beta) and "aqk" = scale (the decayed q-k gram) `[1, T, HV, C]` (zero above the diagonal), "h"
    the states entering each chunk `[NT, HV, K, V]` from h0, and "first" each sequence's first chunk."""
    T, hv = v.shape[1], v.shape[2]
    index = prepare_chunk_index(torch.tensor(cu, device=q.device), batch=1, seq_len=T, chunk_size=C, device=q.device)
    cd = compute_dtype(q)
    qr, kr = (x.repeat_interleave(hv // x.shape[2], 2) for x in (q, k))
    qc, kc, vc, gch, bc = (to_chunks(x, index, cd) for x in (qr, kr, v, g, beta))
    prep = chunk_prepare(kc, vc, gch, bc, q=qc)
    assert prep.akk is not None and prep.aqk is not None and prep.qg is not None
    G = floor_gate(gch).cumsum(2)  # [NT, HV, C, K] (padded rows repeat the last valid row's)
    eye = torch.eye(C, dtype=cd, device=q.device)
    ag = torch.linalg.solve_triangular(prep.akk + eye, torch.diag_embed(bc), upper=False, unitriangular=True)
    states: list[Tensor] = []
    chunk_fwd_torch(qr, kr, v, g, beta, scale=scale, initial_state=h0.to(cd), output_final_state=False, index=index,
                    states=states)  # fmt: skip
    first = [sum(-(-(cu[i + 1] - cu[i]) // C) for i in range(n)) for n in range(len(cu) - 1)]
    tok = {"qg": scale * prep.qg, "ke": kc * G.exp(), "kd": prep.kt, "ag": ag, "aqk": scale * prep.aqk}
    return {**{name: from_chunks(x, index, 1, T) for name, x in tok.items()}, "gc": G[:, :, -1].contiguous(),
            "h": states[0], "first": first}  # fmt: skip
