"""The gate floor: how every chunked path takes gates of any strength, -1000 and -inf masks included.

A log gate g <= 0 enters the chunk algorithm through its in-chunk cumulative sum G and the decays
exp(G_i - G_j) (i after j), exp(G), exp(G_C - G). Two things go wrong with very negative gates:

- a -inf gate makes G = -inf from that token on, and G_i - G_j = -inf - (-inf) = NaN;
- a -1000 gate (the usual mask of a packed batch) puts later G near -1000 k (k masks in the chunk), and every
  difference G_i - G_j of two later tokens loses the low bits of their gates (ulp(64000) = 2^-7 in fp32).

The rule, applied once where each path forms G (`floor_gate` on the torch path, `tl.maximum(g, GATE_FLOOR)`
where the Triton kernels load the gate for its cumsum): g is clamped at GATE_FLOOR = -112.

Why -112: exp(-112) = 2.3e-49 is below half of fp32's smallest subnormal (2^-149 = 1.4e-45), so it rounds to
exactly 0, and so does exp(-112 + x) for every x <= 0 and every product of factors one of which is <= exp(-112)
(fp32 products underflow the same way). Every decay that spans a clamped token is such a factor or product (the
kernels only form exp(G_a - G_b) for b <= a, and a product of two such factors whose spans join), so a
clamped token is a perfect reset in fp32: the decays across it are 0, as exp(g) is 0 in fp32 for every
g <= -104. Hence, in fp32 terms:

- -inf and any g <= -112 give bit-for-bit the decays of exp(g) = 0 that the exact result has;
- -112 < g < -104: unchanged (no clamp);
- the clamp keeps |G| <= 112 * 64 = 7168 in a 64-token chunk, so G stays finite (no inf - inf) and a gate after
  k clamped tokens is rounded to ulp(112 k); for one mask in a chunk that is ulp(112) = 2^-17 = 7.6e-6, a
  relative error of at most that size in the decays between the tokens after it (FLA's -1000 mask: 2^-14).

The per-token references (`kernels.ops.kda.naive`, `kernels.ops.gdn.naive`) need no floor: they multiply by exp(g_t)
token by token (0 for g_t = -inf) and never subtract cumulative sums. `kernels.common.decay_bound` clamps its per-token
log map bound at the same floor (a larger log bound is still an upper bound; its cumsum is fp64).

Gradient w.r.t. a clamped gate: 0, the exact value (d/dg of exp(g) S is exp(g) S = 0 in fp32 for g <= -104),
which is also what autograd of the reference gives. The torch backward zeroes it with the clamp's own mask; the
Triton backward stores 0 for it.
"""

from __future__ import annotations

from torch import Tensor

__all__ = ["GATE_FLOOR", "floor_gate"]

GATE_FLOOR = -112.0


def floor_gate(g: Tensor) -> Tensor:
    """g clamped below at GATE_FLOOR (same dtype; -inf becomes the floor)."""
    return g.clamp_min(GATE_FLOOR)
