"""`cpbench bench train`'s steps under every kept recompute policy (`runners.bench.kernels_train.ours_step`, the
policies of `POLICIES`) run for both ops and give the default policy's gradients (relative L2 1e-5 on the CPU
interpreter, random inputs): KDA under "ag" / "ag+states" keeps nothing and its backward recomputes (it once got the
empty kept dict as WY factors, a KeyError)."""

from __future__ import annotations

import pytest
import torch

from runners.bench.kernels_train import POLICIES, ours_step
from tests.utils import assert_rel_close, make_inputs


@pytest.mark.parametrize("op", ["gdn", "kda"])
@pytest.mark.parametrize("policy", POLICIES)
def test_every_kept_policy_gives_the_default_gradients(op: str, policy: str) -> None:
    q, k, v, g, beta, _ = make_inputs(op, None, B=1, T=64, H=1, K=32, V=32, lb=-0.05, dtype=torch.float32, device="cpu")
    do = torch.randn(v.shape, generator=torch.Generator().manual_seed(4))
    o_ref, ref = ours_step(op)(q, k, v, g, beta, do)
    o, got = ours_step(op, policy=policy)(q, k, v, g, beta, do)
    assert_rel_close("o", o_ref, o, 1e-5)
    for name, a, b in zip(("dq", "dk", "dv", "dg", "dbeta"), got, ref, strict=False):
        assert_rel_close(name, b, a, 1e-5)
