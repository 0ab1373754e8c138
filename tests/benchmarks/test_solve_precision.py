"""`benchmarks/solve_precision.py`: the WY block solve's error with the tf32 product-form diagonal inverse against the
fp32 substitution, tf32 emulated on the CPU. The emulation rounds to 10 mantissa bits; both inverses invert I + A; with
unit-norm keys the two solves err alike (the tf32 merges below the diagonal dominate), with |k| = 4 the product form
errs more (session 20's reading)."""

from __future__ import annotations

import torch

from tests.utils.scripts import load_script

sp = load_script("solve_precision")


def test_tf32_keeps_ten_mantissa_bits() -> None:
    x = torch.randn(4096) * 100
    y = sp.tf32(x)
    assert bool(((y.view(torch.int32) & 0x1FFF) == 0).all())
    assert float(((y - x).abs() / x.abs()).max()) <= 2.0**-11
    assert float(sp.tf32(torch.tensor([1.0 + 2.0**-12])).item()) == 1.0  # below half an ulp: down


def test_both_inverses_invert_i_plus_a() -> None:
    gen = torch.Generator().manual_seed(1)
    A = torch.tril(0.3 * torch.randn(16, 16, generator=gen), -1)
    ref = torch.linalg.inv(torch.eye(16, dtype=torch.float64) + A.double())
    for inv in (sp.inv_product_form, sp.inv_substitution):
        assert float((inv(A).double() - ref).abs().max()) < 1e-3
    assert float((sp.inv_substitution(A).double() - ref).abs().max()) < 1e-5  # fp32: far closer than tf32


def test_unit_keys_err_alike_and_large_keys_favour_the_substitution() -> None:
    unit = sp.errors(1.0, 1.0, -0.05, cases=4)
    assert max(unit["product_form"]) < 1e-4 and max(unit["substitution"]) < 1e-4
    assert abs(sum(unit["product_form"]) / sum(unit["substitution"]) - 1) < 0.2
    large = sp.errors(4.0, 1.0, -0.05, cases=8)
    assert sum(large["product_form"]) > sum(large["substitution"])


def test_the_block_form_inverts_i_plus_a_as_closely_as_the_triton_solve() -> None:
    """The TileLang Ag pass's block form (session 27) in tf32: within 1e-4 of fp64's inverse at strong decay and as
    close as the Triton solve (within 1.5x of its error) with unit keys."""
    gen = torch.Generator().manual_seed(2)
    k = torch.nn.functional.normalize(torch.randn(64, 128, generator=gen), dim=-1)
    G = torch.cumsum(-torch.rand(64, generator=gen), 0)
    A = torch.tril(torch.rand(64, generator=gen)[:, None] * (k @ k.T) * torch.exp(G[:, None] - G[None, :]), -1)
    ref = torch.linalg.inv(torch.eye(64, dtype=torch.float64) + A.double())
    assert float((sp.solve_block_form(A).double() - ref).norm() / ref.norm()) < 1e-4
    unit = sp.errors(1.0, 1.0, -0.05, cases=4)
    assert max(unit["block_form"]) < 1e-4
    assert sum(unit["block_form"]) < 1.5 * sum(unit["substitution"])
