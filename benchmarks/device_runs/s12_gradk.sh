#!/bin/bash
# Session 12 (issue 26, helper gradk): the fused gradient kernel `chunk_bwd_dqk_wy` at its candidate launch configs
# and code variants (kernels/NOTES.md "The fused gradient kernel's registers and occupancy"): GDN's twelve and KDA's
# five at 1x64K (H=16, K=V=128), compiled in 14 worker processes first; per config the kernel ms, the bytes floor and
# the rel_l2 per gradient against the pair (`ok`: every one <= 5e-3). ~100-140 s (timeout_s 150).
# Results: $OUT/dqk_wy_lab.{md,json} (-> benchmarks/results/dqk_wy_configs_h200.*) and $OUT/s12_gradk.tgz (log).
export PYTHONUNBUFFERED=1 CPBENCH_GIT_SHA=${SHA}
R=/tmp/r; mkdir -p $R; trap 'tar czf $OUT/s12_gradk.tgz -C /tmp r' EXIT
t0=$(date +%s); el() { echo $(( $(date +%s)-t0 )); }
export PYTHONPATH=$PWD
timeout 140 python3 benchmarks/dqk_wy_lab.py --out $OUT --shapes 1x65536 --pair-configs default --no-split --no-step \
  --precompile 14 --deadline-s 110 --configs default phased bk32_w8 bk32_phased bk32_w4_phased gdn:phased_r128 \
  gdn:r128 gdn:bk32_phased_r128 gdn:bk32_w4 gdn:bk32_w4_phased_r168 \
  gdn:bk32_w4_phased_r128 gdn:w4 > $R/dqk_wy_lab.log 2>&1
echo "lab rc=$? $(el) s"; cat $OUT/dqk_wy_lab.md; grep -h '"skipped"\|precompile\|"error"' $R/dqk_wy_lab.log
echo "end $(el) s"
