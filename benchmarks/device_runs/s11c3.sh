#!/bin/bash
# Session 11, device call 3 (issue 26): the helpers' kernels on the H200, ours alone (no peers: no time for their
# compiles), each step with its own limit inside ~265 s: the parallel first call (kernels.parallel_compile); KDA's
# two-kernel forward against its WY path (kda_fused_lab); GDN's training step with the backward from Ag and the fused
# gradient kernels (bwd_ag_lab --variants); the fused pass's code variants (fused_fwd_lab --variants); KDA's fused
# gradient kernel (dqk_wy_lab) if time is left.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export CPBENCH_GIT_SHA=${SHA} FLA_DISABLE_BACKEND_DISPATCH=1
R=/tmp/r; mkdir -p $R; trap 'tar czf $OUT/s11c3.tgz -C /tmp r' EXIT
t0=$(date +%s); el() { echo $(( $(date +%s)-t0 )); }
left() { echo $(( $1 - $(date +%s) + t0 )); }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD
echo "installed $(el) s"
timeout 45 python3 benchmarks/first_call_ours.py --modes parallel 2>&1 | tee $R/first_call.log | grep -v Warn; echo "first call rc=$? $(el) s"
timeout 70 python3 benchmarks/kda_fused_lab.py --out $R --shapes 1x131072,1x32768 --lbs=-1 --no-fla --deadline-s 35 > $R/kda_lab.log 2>&1; echo "kda lab rc=$? $(el) s"; tail -25 $R/kda_fused_lab.md
timeout $(left 190) python3 benchmarks/bwd_ag_lab.py --out $R --shapes 1x65536 --no-fla --variants inputs,ag,inputs:fused,ag:fused > $R/bwd_lab.log 2>&1; echo "bwd lab rc=$? $(el) s"; head -14 $R/bwd_ag_lab.md | tail -6; tail -8 $R/bwd_ag_lab.md
timeout $(left 250) python3 benchmarks/fused_fwd_lab.py --out $R --shapes 1x131072 --lb=-1 --no-flash-qla --variants tma,exp2+tma,tma+ws,ag:base@32:4:2,ag:two_chunks@32:4:2 --deadline-s 5 > $R/variants.log 2>&1; echo "variants rc=$? $(el) s"; grep -v Warn $R/variants.log | tail -22
L=$(left 262); if [ $L -gt 15 ]; then timeout $L python3 benchmarks/dqk_wy_lab.py --out $R --ops kda --shapes 1x65536 > $R/dqk_kda.log 2>&1; echo "dqk kda rc=$? $(el) s"; tail -12 $R/dqk_wy_lab.md; fi
echo "end $(el) s"
