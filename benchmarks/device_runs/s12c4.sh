#!/bin/bash
# Session 12, device call 4 (the machine still warm from call 3; issue 26): the GDN training step's two fastest
# variants of call 3 at 1x128K and 8x8K, to confirm before the default changed.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1 FLA_DISABLE_BACKEND_DISPATCH=1 CPBENCH_GIT_SHA=${SHA}
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD; mkdir -p $OUT/bwd2
timeout 110 python3 benchmarks/bwd_ag_lab.py --out $OUT/bwd2 --shapes 1x131072,8x8192 --lb -1 --no-fla --bwd-warm 4 \
  --variants inputs:fused,ag+states:fused:warm --deadline-s 75 > $OUT/bwd2/log.txt 2>&1
echo rc=$?; sed -n '/^| B/,/^Warm/p' $OUT/bwd2/bwd_ag_lab.md
