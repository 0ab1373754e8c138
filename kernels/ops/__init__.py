"""The ops, in FLA's per-op layout: `kernels/ops/<op>/` holds `naive.py` (the per-token fp32 reference) and `chunk.py`
(the Triton forward and backward, the op-table entry and the public op). What both ops launch unchanged is in
`kernels/common/`; the dispatch path (validate -> backend -> op table) is `kernels.dispatch`."""
