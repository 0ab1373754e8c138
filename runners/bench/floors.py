"""The floors of the kernel benchmarks, defined once: the bytes each launcher (and a whole forward) must move and
the matmul flops it must issue, and the time they take at the H200's HBM rate and a matmul rate.

Bytes are unique bytes: every tensor a launcher reads or writes counted once, at its stored dtype (bf16 inputs
and intermediates at `el` bytes, the gate and its cumsum fp32; the workload's dtypes, `runners.workload`), per
token and value head (`HV`; q and k are read per value head, as the launchers do). Per-segment tensors of the
intra-device split (transition maps M [K, K] and states S [K, V], fp32) are counted per segment. Flops are the
chunked algorithm's matmuls at chunk size C = 64 (a triangular solve's C^3 terms and the elementwise work are left
out: a floor, not a model). A launcher's floor is the larger of its bytes at `HBM_TBPS` and its flops at the
matmul rate measured in the run (`measure_ceilings`).

| launcher (`profile_kernels`) | reads | writes | matmul flops per chunk and head |
|---|---|---|---|
| wy (GDN) | q, k, v, beta, g | w, u, gcum, Aqk | K K^T, Q K^T, w, u: 2 C^2 (3K + V) |
| wy (KDA) | q, k, v, beta, g [K] | w, u, k*g, q*g, Aqk, g per chunk [K] | the same |
| transition | k, w, u, gcum | M, S per segment | w M, k^T (w M), w S, k^T v: 4 C K (K + V) |
| chain | M, S per segment | h0 per segment | M S: 2 K^2 V per segment (no chunks) |
| state (plain, split) | k, w, u, q, Aqk, gcum (+ h0 per segment) | o | w S, q S, k^T v, Aqk v: 6 C K V + 2 C^2 V |
| forward (the whole op) | q, k, v, beta, g | o | the sum of wy and state |
| ag (two-kernel forward) | q (KDA), k, beta, g | Ag (+ Aqk: KDA), gcum (KDA [K]) | K K^T (+ Q K^T: KDA): 2 C^2 K each |
| fused (two-kernel forward) | q, k, v, Ag (+ Aqk), gcum | o | K S, Q S, K^T Vd, Ag W, P Vd (+ Q K^T: GDN): 6 C K V + 4 C^2 V |

The backward's gradient kernels (`bwd_launcher_bytes`, bytes only; h and dh [K, V] per chunk in the input dtype, the
gradient of g in g's dtype):

| launcher | reads | writes |
|---|---|---|
| dqk (`chunk_bwd_dqk`) | q, k, g, h, dh, v_new, dv_new, do | dq, dw, fp32 dk and dG partials [K] |
| wy_bwd | k, v, g, beta, T (C per token), w, u, dv_new, dw, the two partials | dk, dv, dbeta, dg |
| dqk_wy (`chunk_bwd_dqk_wy`, fused) | q, k, v, g, beta, T, h, dh, v_new, dv_new, do | dq, dk, dv, dbeta, dg |
| reverse (GDN's TileLang walk) | q, k, v, do, Ag, g, its cumsum, beta, h | dq, dk, dv, fp32 dg and dbeta |

The reverse walk's matmul flops per chunk and head (`reverse_walk_flops`, the products of
`kernels/ops/gdn/reverse_bwd.py`): 2 C^2 (5K + 5V) + 6 C^3 + 14 C K V.
"""

from __future__ import annotations

import math

__all__ = [
    "BWD_LAUNCHERS",
    "BYTES_PER_TOKEN_HEAD",
    "C",
    "HBM_TBPS",
    "LAUNCHERS",
    "bwd_launcher_bytes",
    "bytes_floor",
    "flops_floor",
    "floor_ms",
    "launcher_bytes",
    "launcher_flops",
    "reverse_walk_flops",
]

HBM_TBPS = 4.2  # the H200's measured device copy ceiling (kernels/NOTES.md), the issue's bytes rate
C = 64  # chunk size of the chunked algorithm
F32 = 4  # the gate and its cumsum, the split's per-segment maps and states
# FLA's forward+backward bytes per token-head (bf16, K=V=128; fla-h200.md): the training step's floor
BYTES_PER_TOKEN_HEAD = {"gdn": 2828, "kda": 3590}
LAUNCHERS = ("wy", "transition", "chain", "state_plain", "state_split", "forward", "ag", "fused")
# the backward's gradient kernels: the pair, the two fused, and the fused one with the reverse pass's last walk
BWD_LAUNCHERS = ("dqk", "wy_bwd", "dqk_wy", "reverse")


def _per_token_head(op: str, launcher: str, K: int, V: int, el: int) -> int:
    """Bytes per token and value head of `launcher` (the table of the module docstring, without per-segment terms)."""
    gate = F32 if op == "gdn" else F32 * K  # g: [.., HV] or [.., HV, K], fp32
    inputs = el * (2 * K + V + 1) + gate  # q, k, v, beta, g
    chunk_gate = F32 if op == "gdn" else F32 * K / C  # gcum per token (GDN) / the chunk's gate [K] (KDA)
    wy_out = el * (K + V + C) + chunk_gate + (el * 2 * K if op == "kda" else 0)  # w, u, Aqk (+ k*g, q*g), gates
    state_in = el * (3 * K + V + C) + chunk_gate  # k (k*g), w, q (q*g), u, Aqk, gates
    table = {
        "wy": inputs + wy_out,
        "transition": el * (2 * K + V) + chunk_gate,  # k, w, u, gates
        "chain": 0,
        "state_plain": state_in + el * V,
        "state_split": state_in + el * V,
        "forward": inputs + el * V,
        "ag": inputs - el * (V + (K if op == "gdn" else 0)) + el * C * (1 if op == "gdn" else 2) + gate,
        "fused": el * (2 * K + 2 * V + C * (1 if op == "gdn" else 2)) + gate,
    }
    if launcher not in table:
        raise ValueError(f"unknown launcher {launcher!r}; one of {', '.join(LAUNCHERS)}")
    return math.ceil(table[launcher])


def _per_segment(launcher: str, K: int, V: int) -> int:
    """Bytes per split segment and value head: M [K, K] and S [K, V] written (transition), read with h0 written
    (chain), h0 read (state_split)."""
    return {"transition": F32 * (K * K + K * V), "chain": F32 * (K * K + 2 * K * V), "state_split": F32 * K * V}.get(
        launcher, 0
    )


def launcher_bytes(
    op: str, launcher: str, B: int, T: int, HV: int, K: int = 128, V: int = 128, *, segments: int = 0, el: int = 2
) -> int:
    """Unique bytes `launcher` of `op`'s forward moves at B x T tokens and HV value heads (`segments`: the split's
    segments in the batch, for the per-segment terms; the transition pass skips each sequence's last segment)."""
    tokens = B * T * (1 - B / segments if launcher == "transition" and segments else 1)
    per_token = _per_token_head(op, launcher, K, V, el)
    return math.ceil(HV * (tokens * per_token + segments * _per_segment(launcher, K, V)))


def bwd_launcher_bytes(op: str, launcher: str, B: int, T: int, HV: int, K: int = 128, V: int = 128, el: int = 2) -> int:
    """Unique bytes a gradient kernel of `op`'s backward moves (the table of the module docstring) at B x T tokens and
    HV value heads."""
    if launcher not in BWD_LAUNCHERS:
        raise ValueError(f"unknown backward launcher {launcher!r}; one of {', '.join(BWD_LAUNCHERS)}")
    gate = F32 if op == "gdn" else F32 * K  # g in, dg out
    states = 2 * el * K * V / C  # h and dh, once per chunk
    partials = 2 * F32 * K  # dk and dG, fp32
    per_token = {
        "dqk": el * (2 * K + 3 * V) + gate + states + el * 2 * K + partials,
        "wy_bwd": el * (K + V + 1 + C + K + 2 * V + K) + gate + partials + el * (K + V + 1) + gate,
        "dqk_wy": el * (2 * K + V + 1 + C + 3 * V) + gate + states + el * (2 * K + V + 1) + gate,
        "reverse": el * (2 * K + 2 * V + C + 1) + 2 * gate + el * K * V / C + el * (2 * K + V) + 2 * F32,
    }[launcher]
    return math.ceil(B * T * HV * per_token)


def launcher_flops(op: str, launcher: str, B: int, T: int, HV: int, K: int = 128, V: int = 128, *, segments: int = 0) -> float:
    """Matmul flops of `launcher` (the module table; the same count for GDN and KDA, whose gates fold into q, k)."""
    if launcher not in LAUNCHERS:
        raise ValueError(f"unknown launcher {launcher!r}; one of {', '.join(LAUNCHERS)}")
    chunks = B * math.ceil(T / C) * HV * (1 - B / segments if launcher == "transition" and segments else 1)
    wy = 2 * C * C * (3 * K + V)
    state = 6 * C * K * V + 2 * C * C * V
    per_chunk = {
        "wy": wy,
        "transition": 4 * C * K * (K + V),
        "chain": 0,
        "state_plain": state,
        "state_split": state,
        "forward": wy + state,
        "ag": 2 * C * C * K * (1 if op == "gdn" else 2),
        "fused": 6 * C * K * V + 4 * C * C * V + (2 * C * C * K if op == "gdn" else 0),
    }[launcher]
    return float(chunks * per_chunk + (HV * segments * 2 * K * K * V if launcher == "chain" else 0))


def reverse_walk_flops(B: int, T: int, HV: int, K: int = 128, V: int = 128) -> float:
    """Matmul flops of GDN's reverse-walk backward (the module docstring's count) at B x T tokens, HV value heads."""
    return float(B * math.ceil(T / C) * HV * (2 * C * C * (5 * K + 5 * V) + 6 * C**3 + 14 * C * K * V))


def bytes_floor(op: str, B: int, T: int, H: int, K: int = 128, V: int = 128, el: int = 2) -> int:
    """The whole forward's unique bytes (inputs read once, o written once), H value heads."""
    return launcher_bytes(op, "forward", B, T, H, K, V, el=el)


def flops_floor(B: int, T: int, H: int, K: int = 128, V: int = 128) -> float:
    """The whole forward's matmul flops, H value heads."""
    return launcher_flops("gdn", "forward", B, T, H, K, V)


def floor_ms(nbytes: float, flops: float, matmul_tflops: float) -> dict[str, float]:
    """bytes_ms (at HBM_TBPS), flops_ms (at `matmul_tflops`, NaN when not measured) and floor_ms, their max."""
    b = nbytes / (HBM_TBPS * 1e12) * 1e3
    f = flops / (matmul_tflops * 1e12) * 1e3 if matmul_tflops == matmul_tflops and matmul_tflops > 0 else float("nan")
    return {"bytes_ms": b, "flops_ms": f, "floor_ms": b if f != f else max(b, f)}
