"""Compile FlashQLA's TileLang kernels into TILELANG_CACHE_DIR before the timed runs (session 10, call 3): forward and
fwd+bwd, auto_cp False and True, B=1 T=16K H=16 K=V=128 bf16; prints each first call's seconds."""

import time

import flash_qla
import torch
import torch.nn.functional as F

T, H, D = 16384, 16, 128
dev = "cuda"
for auto_cp in (False, True):
    for train in (False, True):
        q = F.normalize(torch.randn(1, T, H, D, device=dev), dim=-1).bfloat16().requires_grad_(train)
        k = F.normalize(torch.randn(1, T, H, D, device=dev), dim=-1).bfloat16().requires_grad_(train)
        v = torch.randn(1, T, H, D, device=dev).bfloat16().requires_grad_(train)
        g = (-torch.sigmoid(torch.randn(1, T, H, device=dev))).requires_grad_(train)
        beta = torch.sigmoid(torch.randn(1, T, H, device=dev)).bfloat16().requires_grad_(train)
        cu = torch.tensor([0, T], dtype=torch.int32, device=dev)
        t0 = time.time()
        with torch.set_grad_enabled(train):
            o, _ = flash_qla.chunk_gated_delta_rule(q, k, v, g, beta, cu_seqlens=cu, auto_cp=auto_cp)
            if train:
                o.float().square().sum().backward()
        torch.cuda.synchronize()
        print(f"flash_qla first call auto_cp={auto_cp} train={train}: {time.time() - t0:.1f} s", flush=True)
