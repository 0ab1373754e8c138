"""Our first call on a cold Triton cache (issue 26's target: <= 20 s): chunk_gdn and chunk_kda fwd+bwd at B=1 T=8192
H=16 K=V=128 bf16, each in this fresh process; prints the seconds and the peak memory of the step."""

import time

import torch
import torch.nn.functional as F

import kernels

T, H, D = 8192, 16, 128
dev = "cuda"
for op in ("gdn", "kda"):
    q = F.normalize(torch.randn(1, T, H, D, device=dev), dim=-1).bfloat16().requires_grad_()
    k = F.normalize(torch.randn(1, T, H, D, device=dev), dim=-1).bfloat16().requires_grad_()
    v = torch.randn(1, T, H, D, device=dev).bfloat16().requires_grad_()
    gshape = (1, T, H) if op == "gdn" else (1, T, H, D)
    g = (-torch.sigmoid(torch.randn(*gshape, device=dev))).requires_grad_()
    beta = torch.sigmoid(torch.randn(1, T, H, device=dev)).bfloat16().requires_grad_()
    fn = kernels.chunk_gdn if op == "gdn" else kernels.chunk_kda
    torch.cuda.reset_peak_memory_stats()
    t0 = time.time()
    o, _ = fn(q, k, v, g, beta)
    o.float().square().sum().backward()
    torch.cuda.synchronize()
    print(
        f"ours first call {op} fwd+bwd 1x{T}: {time.time() - t0:.1f} s, peak {torch.cuda.max_memory_allocated() / 2**20:.0f} MiB",
        flush=True,
    )
