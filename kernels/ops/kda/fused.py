"""KDA's two-kernel forward (GDN's since session 10, `kernels.ops.gdn.fused`): the Ag pass `wy_kda_ag` (Ag, Aqk and
the per-key gate cumsum G `[B, T, HV, K]` fp32), then the fused state+output pass, GDN's kernel with the per-key gate
(its constexpr GATE_VECTOR, set by gcum's shape; spec `kda_fused_state_output_fwd`):

    Vd = Ag (V - (K (x) exp(G)) S)                      (= u - w S of the WY form)
    O  = (scale Q (x) exp(G)) S + Aqk Vd
    S  = diag(exp(G_last)) S + (K (x) exp(G_last - G))^T Vd

per chunk (exp(G) and exp(G_last - G) per key column; every exponent <= 0 for any g <= 0, -1000 and -inf masks
floored at the load, `kernels.common.decay`). With the Ag pass's `gated` variant (`kernels.ops.kda.wy_ag.KDA_AG_VARIANTS`,
WY_KDA_AG_FWD's VARIANT; not the default) the Ag pass stores the gated qg, ke, kd and G_C instead of G and the fused
pass (its PRE_GATED) reads them: only dots and the diagonal decay diag(exp(G_C)) per chunk, where the default form
loads the fp32 [BT, K] G and exponentiates two [BT, K] tiles in every V-block program. Under `LaunchPlan.fwd_pass`
"tilelang" (session 28), and "auto" in bf16 where it runs (session 29, `kernels.ops.gdn.fwd_walk.KDA_WALK_AUTO`), the output pass is the
TileLang walk's gated build (`kernels.ops.gdn.fwd_walk`, gate "vector"), and the Ag pass is asked for the gated variant
(its explicit config kept, the bit set). The same modes as GDN's: output, state only, the TRANSITION maps of the
intra-device split (`kernels.common.seqsplit`), the warm split's windows (`kernels.common.warm_split`: the Ag pass
sums the decay bound), grouped value heads read in place, varlen, initial and final states.
The op table runs `kda_fused_fwd` as KDA's `fused_fwd` (`kernels.common.chunk_fwd`'s fwd_path "auto" where the walk
runs: `kernels.vocabulary.AUTO_FWD_PATH` "walk"; elsewhere its Triton pass is no faster than the WY path).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from torch import Tensor

from kernels.common.index import ChunkIndex
from kernels.common.warm_split import WarmInputs
from kernels.ops.gdn.fused import forward_splits, fused_state_output_fwd
from kernels.ops.gdn.fwd_walk import fwd_walk_wanted
from kernels.ops.kda.wy_ag import KDA_AG_VARIANTS, WY_KDA_AG_FWD, GatedKeys, gated_ag_plan, wy_kda_ag
from kernels.plan import LaunchPlan

__all__ = ["kda_fused_fwd"]


def kda_fused_fwd(
    q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, *, scale: float, index: ChunkIndex, launch: LaunchPlan,
    initial_state: Tensor | None = None, output_final_state: bool = False, split_chunks: int | None = None,
    warm: WarmInputs | None = None, keep: dict[str, Tensor] | None = None, keep_states: bool = False,
    seg_states: dict[str, Any] | None = None,
) -> tuple[Tensor, Tensor | None]:  # fmt: skip
    """KDA's forward on the fused pass: (o `[B, T, HV, V]` in q's dtype, final state `[N, HV, K, V]` fp32 or None).

    q, k `[B, T, H, K]`, v `[B, T, HV, V]`, g `[B, T, HV, K]`, beta `[B, T, HV]` (contiguous). split_chunks: as
    `kernels.common.seqsplit.resolve_split` (None automatic, 0 never, n chunks per segment). warm: the split's
    gate-certified warmup (`kernels.common.warm_split`, its `chunk_bound` for the Ag pass to fill), or None. keep
    (the "ag" / "ag+states" recompute policies): a dict that receives the Ag pass's gated outputs for KDA's backward
    from Ag (`kernels.ops.kda.ag_bwd.KEPT_GATED`; the Ag pass then runs its gated variant); keep_states ("ag+states")
    is taken as "ag" (KDA's walk keeps no chunk states yet: the backward recomputes them). seg_states: a dict that
    receives the split's segment states for the backward (`kernels.common.seqsplit.keep_segment_states`), or None.
    """
    # (session 33) no warm window where the forward cannot split (the walk's one-wave rule, as at 8x8K on an H200):
    # the Ag pass then sums no decay bound (it reads v for nothing else)
    warm = warm if forward_splits(index, k, v, launch, split_chunks, gated=True) else None
    bnd = warm.chunk_bound if warm is not None else None
    # the TileLang walk reads the gated form (`fwd_walk_wanted` refuses in one line where it cannot run), and so does
    # the backward from Ag
    walk = fwd_walk_wanted(k, v, index.chunk_size, launch, gated=True)
    gated = walk or keep is not None
    ag, aqk, gates = wy_kda_ag(q, k, g, beta, scale=scale, index=index, launch=_gated_ag(launch) if gated else launch,
                               bnd=bnd, v=v if bnd is not None else None, store_t=keep is not None)  # fmt: skip
    if gated and not isinstance(gates, GatedKeys):
        raise ValueError("kda_fused_fwd: the TileLang walk and the backward from Ag read the Ag pass's gated form, "
                         "which returned G")  # fmt: skip
    if keep is not None:
        assert isinstance(gates, GatedKeys)
        keep.update(ag=ag, aqk=aqk, qg=gates.qg, ke=gates.ke, kd=gates.kd, gc=gates.gc)
        if gates.tt is not None:  # (the Ag pass's T: the backward runs no `wy_inverse`)
            keep["tt"] = gates.tt
    opts = {"scale": scale, "index": index, "launch": launch, "initial_state": initial_state,
            "output_final_state": output_final_state, "split_chunks": split_chunks, "warm": warm,
            "seg_states": seg_states}  # fmt: skip
    if isinstance(gates, GatedKeys):  # the Ag pass's gated variant: qg, ke, kd, G_C read, no exp on a [BT, K] tile
        return fused_state_output_fwd(gates.qg, gates.ke, v, ag, gates.gc, aqk=aqk, kd=gates.kd, **opts)
    return fused_state_output_fwd(q, k, v, ag, gates, aqk=aqk, **opts)


def _gated_ag(launch: LaunchPlan) -> LaunchPlan:
    """`launch` with the Ag pass's `gated` variant on: its explicit config with the bit set, else `gated_ag_plan`'s."""
    cfg = launch.configs.get(WY_KDA_AG_FWD.name)
    if cfg is None:
        return gated_ag_plan(launch)
    bits = (cfg.VARIANT or 0) | KDA_AG_VARIANTS["gated"]
    return launch.with_configs({WY_KDA_AG_FWD.name: dataclasses.replace(cfg, VARIANT=bits)})
