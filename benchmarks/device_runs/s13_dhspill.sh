#!/bin/bash
# Session 13 (issue 26, helper dhspill), not run yet: the fused_dh kernel's ds_mem variant (dS in a per-program
# L2-resident scratch, the key side in BK blocks; kernels/common/dh_grads_bwd.py `DH_VARIANTS`, kernels/NOTES.md
# "Spills") against its register default. One H200, no carry, ~250 s (timeout_s 400):
#  1. the GPU tests in bf16 (ds_mem in two key blocks and in one against the register kernel and the reference), ~60 s;
#  2. the kernel alone at 1x64K: default (registers, 2.3 KB spilled per thread) and four ds_mem configs (0.6-1.0 KB),
#     beside what it replaces (`dh_walk+fused`) and its bytes floor; gradients' rel_l2 against the pair.
# Decision rule: a ds_mem config becomes CHUNK_BWD_DH_GRADS' default (LaunchConfig(VARIANT=1, BK=..)) if it beats the
# default by >= 5 % at 1x64K with its max rel_l2 within the budget (ok), and holds at 1x128K (rerun with --shapes).
export PYTHONUNBUFFERED=1 CPBENCH_GIT_SHA=${SHA}
R=$OUT/r; mkdir -p $R
t0=$(date +%s); el() { echo $(( $(date +%s)-t0 )); }
export PYTHONPATH=$PWD
CPBENCH_TEST_GPU=1 timeout 150 python3 -m pytest -q -p no:cacheprovider tests/kernels/common/test_dh_grads_bwd.py \
  > $R/gpu_tests.log 2>&1
echo "gpu tests rc=$? $(el) s"; tail -3 $R/gpu_tests.log
timeout 220 python3 benchmarks/dqk_wy_lab.py --out $R/dqk --ops gdn --shapes 1x65536 --configs default \
  --pair-configs none --no-split --no-step --dh-configs default mem_bk32_w8 mem_bk64_w8 mem_bk32_w4 mem_bk16_w4 \
  --deadline-s 180 > $R/dqk_wy_lab.log 2>&1
echo "dqk lab rc=$? $(el) s"; cat $R/dqk/dqk_wy_lab.md
