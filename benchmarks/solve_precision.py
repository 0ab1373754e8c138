"""The WY block solve's precision with its diagonal inverses by the tf32 product form against fp32 substitution, on
the CPU: the tensor cores' tf32 products emulated (operands rounded to 10 mantissa bits, the sum in fp64 then fp32).

Why (issue 26, session 20): `kernels.common.wy._solve` now inverts its four diagonal 16x16 blocks by
(I - A)(I + A^2)(I + A^4)(I + A^8) in tf32 (`_inv_neumann`) instead of an exact fp32 forward substitution
(`_inv_diag4`, GDN's Ag variant `exact_inverse`); the merges below the diagonal were tf32 products already. This
measures what that costs against the fp64 inverse of I + A, A = StrictLower(beta_i k_i.k_j exp(G_i - G_j)) over one
64-token chunk, for unit-norm keys (what l2-normalized q, k give) and for larger keys.

    python benchmarks/solve_precision.py [--cases 50] [--json]

Prints, per (|k|, beta's range, per-token gate range), the median and largest relative Frobenius error of the whole
64x64 T with each diagonal inverse.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from kernels.common.ag_torch import block_inverse  # noqa: E402

CASES = (  # (|k|, largest beta, the per-token log decay's lower end)
    (1.0, 1.0, -1.0),
    (1.0, 1.0, -0.05),
    (1.0, 2.0, -0.05),  # allow_neg_eigval: beta in (0, 2)
    (2.0, 1.0, -0.05),
    (4.0, 1.0, -0.05),
)


def tf32(x: torch.Tensor) -> torch.Tensor:
    """x (fp32) rounded to tf32's 10 explicit mantissa bits, to nearest even."""
    i = x.float().contiguous().view(torch.int32)
    return ((i + 0x0FFF + ((i >> 13) & 1)) & ~0x1FFF).view(torch.float32)


def mm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """A tensor-core tf32 product: operands rounded to tf32, products and sums exact, the result rounded to fp32."""
    return (tf32(a).double() @ tf32(b).double()).float()


def inv_product_form(A: torch.Tensor) -> torch.Tensor:
    """`_inv_neumann`: (I + A)^{-1} = (I - A)(I + A^2)(I + A^4)(I + A^8) for a strictly lower 16x16 A, tf32 products."""
    A2 = mm(A, A)
    A4 = mm(A2, A2)
    A8 = mm(A4, A4)
    P = torch.eye(16) - A
    for Ap in (A2, A4, A8):
        P = mm(P, Ap) + P
    return P


def inv_substitution(A: torch.Tensor) -> torch.Tensor:
    """`_inv_diag4`'s steps for one block in fp32: row i of the strict part = -A_i - sum_k A_ik T_k."""
    T = -A.clone()
    for i in range(2, 16):
        a = -A[i]
        T[i] = a + (a[:, None] * T).sum(0)
    return T + torch.eye(16)


def solve(A: torch.Tensor, diag) -> torch.Tensor:  # noqa: ANN001
    """`_solve` on a 64x64 strictly lower A: the diagonal blocks by `diag`, the blocks below by tf32 products."""
    B = lambda i, j: A[16 * i : 16 * i + 16, 16 * j : 16 * j + 16]  # noqa: E731
    T = {(i, i): diag(B(i, i)) for i in range(4)}
    for i in range(1, 4):
        for j in range(i - 1, -1, -1):  # T_ij = -T_ii sum_{j <= m < i} A_im T_mj
            acc = sum(mm(B(i, m), T[m, j]) for m in range(j, i))
            T[i, j] = -mm(T[i, i], acc)
    out = torch.zeros(64, 64)
    for (i, j), t in T.items():
        out[16 * i : 16 * i + 16, 16 * j : 16 * j + 16] = t
    return out


def solve_block_form(A: torch.Tensor) -> torch.Tensor:
    """The TileLang Ag pass's solve (`kernels.ops.gdn.ag_hopper`, session 27; its mirror `ag_torch.block_inverse`) on a
    64x64 strictly lower fp32 A: the diagonal blocks' inverses by fp32 substitution, every product in tf32."""
    return block_inverse(A.float(), mm=mm)


def errors(knorm: float, beta_max: float, lb: float, cases: int, seed: int = 0) -> dict[str, list[float]]:
    """The relative Frobenius errors of T per diagonal inverse over `cases` random chunks (K = 128)."""
    gen = torch.Generator().manual_seed(seed)
    out: dict[str, list[float]] = {"product_form": [], "substitution": [], "block_form": []}
    for _ in range(cases):
        k = knorm * torch.nn.functional.normalize(torch.randn(64, 128, generator=gen), dim=-1)
        beta = beta_max * torch.rand(64, generator=gen)
        G = torch.cumsum(lb * torch.rand(64, generator=gen), 0)
        A = torch.tril(beta[:, None] * (k @ k.T) * torch.exp(G[:, None] - G[None, :]), -1).float()
        ref = torch.linalg.inv(torch.eye(64, dtype=torch.float64) + A.double())
        for name, diag in (("product_form", inv_product_form), ("substitution", inv_substitution)):
            out[name].append(float((solve(A, diag).double() - ref).norm() / ref.norm()))
        out["block_form"].append(float((solve_block_form(A).double() - ref).norm() / ref.norm()))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", type=int, default=50)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    if a.cases < 1:
        ap.error(f"--cases must be >= 1, got {a.cases}")
    rows = []
    for knorm, beta_max, lb in CASES:
        e = errors(knorm, beta_max, lb, a.cases)
        rows.append({"knorm": knorm, "beta_max": beta_max, "lb": lb, **{
            f"{n}_{s}": f(sorted(v)) for n, v in e.items() for s, f in (("median", lambda x: x[len(x) // 2]),
                                                                        ("max", lambda x: x[-1]))}})  # fmt: skip
    if a.json:
        print(json.dumps(rows))
        return 0
    print("| \\|k\\| | beta < | g > | product form median / max | substitution median / max | block form (TileLang) "
          "median / max |\n|---:|---:|---:|---|---|---|")  # fmt: skip
    for r in rows:
        print(f"| {r['knorm']} | {r['beta_max']} | {r['lb']} | {r['product_form_median']:.1e} / {r['product_form_max']:.1e} "
              f"| {r['substitution_median']:.1e} / {r['substitution_max']:.1e} "
              f"| {r['block_form_median']:.1e} / {r['block_form_max']:.1e} |")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
