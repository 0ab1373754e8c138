"""KDA's forward and training step on the H200 at gates that take each diagonal path of the WY prep and backward
(`kernels/common/wy.py`): lb=-2 per token (every 16-token span < FAST_SPAN: the tensor-core path) and g=-8 per token
(span 128: the elementwise `_diag_gram` / `_diag_rows` / `_diag_cols` path in every block). Run it at two commits to
see what a change to one path costs; prints do_bench medians in ms.

    python3 benchmarks/kda_diag_path_speed.py [--T 32768]
"""

import argparse

import torch
import torch.nn.functional as F
from triton.testing import do_bench

import kernels

ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
ap.add_argument("--T", type=int, default=32768)
T, H, D = ap.parse_args().T, 16, 128
q = F.normalize(torch.randn(1, T, H, D, device="cuda"), dim=-1).bfloat16().requires_grad_()
k = F.normalize(torch.randn(1, T, H, D, device="cuda"), dim=-1).bfloat16().requires_grad_()
v = torch.randn(1, T, H, D, device="cuda").bfloat16().requires_grad_()
beta = torch.sigmoid(torch.randn(1, T, H, device="cuda")).bfloat16().requires_grad_()
for name, g in (
    ("lb=-2 (tensor-core path)", -2 * torch.sigmoid(torch.randn(1, T, H, D, device="cuda"))),
    ("g=-8 (elementwise path)", torch.full((1, T, H, D), -8.0, device="cuda")),
):
    g.requires_grad_()
    fwd = do_bench(lambda g=g: kernels.chunk_kda(q, k, v, g, beta), warmup=5, rep=50)
    step = do_bench(lambda g=g: kernels.chunk_kda(q, k, v, g, beta)[0].float().square().sum().backward(), warmup=5, rep=50)
    print(f"KDA 1x{T} {name}: fwd {fwd:.3f} ms, fwd+bwd {step:.3f} ms", flush=True)
