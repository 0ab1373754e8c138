#!/bin/bash
# Session 12, device call 3 (issue 26): the session's kernels timed on the H200, each lab with its correctness
# figures (gradients / outputs against the fp32 reference or the default code), most important first:
#  1. GDN training step at 1x64K: the reverse pass's warm window (bwd_warm) and the keep policy ag+states (bwd_ag_lab)
#  2. the fused gradient kernel's configs and code variants (dqk_wy_lab, GDN)
#  3. KDA's fused pass forms: inline vs gated (kda_fused_lab --forms)
#  4. KDA's Ag pass code variants (kdaag's lab, devrun/kda_ag_lab.py: --ag-configs)
# (4. ran kdaag's copy of the lab, devrun/kda_ag_lab.py from branch kdaag; main's benchmarks/kda_fused_lab.py has its
# --ag-configs / --ag-only since b2eb37b.) Each lab writes its md/json into $OUT/<lab>/ after every row, so a cut call keeps what it measured.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export CPBENCH_GIT_SHA=${SHA} FLA_DISABLE_BACKEND_DISPATCH=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD
t0=$(date +%s); el() { echo $(( $(date +%s)-t0 )); }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
mkdir -p $OUT/bwd $OUT/dqk $OUT/kdaforms $OUT/kdaag
timeout 120 python3 benchmarks/bwd_ag_lab.py --out $OUT/bwd --shapes 1x65536 --lb -1 --no-fla --bwd-warm 4 \
  --variants inputs:fused,inputs:fused:warm,ag+states:fused:warm,ag+states:fused --deadline-s 80 > $OUT/bwd/log.txt 2>&1
echo "bwd rc=$? $(el) s"; tail -30 $OUT/bwd/bwd_ag_lab.md
timeout 65 python3 benchmarks/dqk_wy_lab.py --out $OUT/dqk --ops gdn --shapes 1x65536 --pair-configs default --no-split --no-step \
  --precompile 14 --deadline-s 45 --configs default bk32_w8 bk32_w4_phased gdn:bk32_w4_phased_r168 gdn:bk32_phased_r128 > $OUT/dqk/log.txt 2>&1
echo "dqk rc=$? $(el) s"; tail -14 $OUT/dqk/dqk_wy_lab.md
timeout 80 python3 benchmarks/kda_fused_lab.py --out $OUT/kdaforms --shapes 1x131072 --lbs=-1 --no-fla --no-old \
  --forms inline,gated,gated_tma --deadline-s 50 > $OUT/kdaforms/log.txt 2>&1
echo "kda forms rc=$? $(el) s"; tail -12 $OUT/kdaforms/kda_fused_lab.md
timeout 75 python3 devrun/kda_ag_lab.py --out $OUT/kdaag --shapes 1x131072 --lbs=-1 --no-fla --ag-only \
  --ag-configs default,tiles64:16:8,tiles64+split_solve:16:8,tiles64+split_solve:32:8 --deadline-s 50 > $OUT/kdaag/log.txt 2>&1
echo "kda ag rc=$? $(el) s"; tail -8 $OUT/kdaag/kda_fused_lab.md
echo "end $(el) s"
