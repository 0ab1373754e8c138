#!/bin/bash
# Session 13 (issue 26, helper dhfuse), not run yet: GDN's backward with the reverse pass's last walk fused into the
# gradient kernel (`LaunchPlan(bwd_grads="fused_dh")`, kernels/common/dh_grads_bwd.py; kernels/NOTES.md "The reverse
# pass's last walk fused with the gradients"). One H200, no carry, ~400-500 s (timeout_s 600):
#  1. its GPU tests in bf16 (every gradient and dh0 against the fp32 reference and the default path, 5e-3), ~60 s;
#  2. the kernel alone at 1x64K at three warp counts beside what it replaces (`dh_walk+fused`: chunk_state_bwd storing
#     dh, dv_new, then chunk_bwd_dqk_wy) and its bytes floor, and the training step with pair / fused / fused_dh;
#  3. the training step per variant with its per-launcher split (default vs fused_dh, recompute and ag+states).
# Decision rule: AUTO_BWD_GRADS["gdn"] -> "fused_dh" (kernels/vocabulary.py, one line) if inputs:fused_dh:warm beats
# inputs:fused:warm by >= 5 % at 1x64K with its gradients' rel_l2 at the default's, and holds at 1x128K and 8x8K.
export PYTHONUNBUFFERED=1 CPBENCH_GIT_SHA=${SHA}
R=$OUT/r; mkdir -p $R
t0=$(date +%s); el() { echo $(( $(date +%s)-t0 )); }
export PYTHONPATH=$PWD
CPBENCH_TEST_GPU=1 timeout 120 python3 -m pytest -q -p no:cacheprovider tests/kernels/common/test_dh_grads_bwd.py \
  > $R/gpu_tests.log 2>&1
echo "gpu tests rc=$? $(el) s"; tail -3 $R/gpu_tests.log
timeout 200 python3 benchmarks/dqk_wy_lab.py --out $R/dqk --ops gdn --shapes 1x65536 --configs default \
  --pair-configs none --no-split --dh-configs default w4 w16 --deadline-s 150 > $R/dqk_wy_lab.log 2>&1
echo "dqk lab rc=$? $(el) s"; cat $R/dqk/dqk_wy_lab.md
timeout $(( 580 - $(el) )) python3 benchmarks/bwd_ag_lab.py --out $R/bwd --shapes 1x65536,1x131072,8x8192 --lb -1 \
  --no-fla --bwd-warm 4 --variants inputs:fused:warm,inputs:fused_dh:warm,ag+states:fused:warm,ag+states:fused_dh:warm \
  --deadline-s $(( 540 - $(el) )) > $R/bwd_ag_lab.log 2>&1
echo "bwd lab rc=$? $(el) s"; cat $R/bwd/bwd_ag_lab.md
