"""The ops, in FLA's per-op layout. `kernels/ops/<op>/` holds

    naive.py   the per-token fp32 reference of the op (its recurrence step; the token loop is `kernels.common.per_token`)
    chunk.py   read top to bottom: the forward (the op's own pass, its WY prep, then `kernels.common.chunk_fwd`), the
               backward (`kernels.common.chunk_bwd` for the op), the op's entry of the op table (`kernels.dispatch.ChunkOp`,
               listed by `kernels.api.OPS`) and the public op (`kernels.dispatch.public_op`: FLA's signature, one for
               both ops, over `kernels.dispatch.run`: validate -> backend -> op table). The autograd Function is
               `kernels.dispatch.ChunkFunction`, one class for both ops (the op's entry travels with each call).

What both ops launch unchanged is in `kernels/common/`. A chunk.py imports no Triton module at import time: the Triton
passes load on the first Triton call, so the torch and reference backends run on machines without Triton.
"""
