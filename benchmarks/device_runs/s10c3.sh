#!/bin/bash
# Session 10, device call 3 (issue 26): our cold first call; GPU tests of the new kernels (the Ag pass, the fused
# state+output pass, grouped heads); the two-kernel GDN forward against the WY forward and FlashQLA in one process
# (benchmarks/fused_fwd_lab.py); grouped heads read in place vs expanded (benchmarks/grouped_heads_lab.py).
# FlashQLA's TileLang kernels compile in the background (benchmarks/first_call_flash_qla.py) while the tests run.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export CPBENCH_GIT_SHA=${SHA} FLA_DISABLE_BACKEND_DISPATCH=1
R=/tmp/r; mkdir -p $R; trap 'tar czf $OUT/s10c3.tgz -C /tmp r' EXIT
t0=$(date +%s); el() { echo $(( $(date +%s)-t0 )); }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
mkdir -p /tmp/peer && tar -xJf .xfer/peersite.tar.xz -C /tmp/peer || exit 1
export PYTHONPATH=/tmp/peer:/tmp/site:$PWD TILELANG_CACHE_DIR=/tmp/tilelang-cache
echo "installed $(el) s"
timeout 90 python3 benchmarks/first_call_ours.py 2>&1 | tee $R/first_call.log; echo "first call rc=$? $(el) s"
( timeout 300 python3 benchmarks/first_call_flash_qla.py > $R/qla_warm.log 2>&1; echo "qla warm rc=$? at $(el) s" >> $R/qla_warm.log ) &
QW=$!
CPBENCH_TEST_GPU=1 timeout 190 python3 -m pytest -q -p no:cacheprovider -n 8 tests/kernels/common/test_gdn_fused_state_output.py tests/kernels/test_dispatch_triton.py tests/kernels/ops/gdn/test_wy_ag.py tests/kernels/common/test_ag_torch.py tests/kernels/test_dispatch_grouped.py tests/kernels/common/test_decay_gate_range.py > $R/gpu_tests.log 2>&1; echo "gpu tests rc=$? $(el) s"; tail -4 $R/gpu_tests.log
timeout 60 python3 benchmarks/grouped_heads_lab.py --out $R --T 8192 32768 > $R/grouped.log 2>&1; echo "grouped lab rc=$? $(el) s"; tail -12 $R/grouped_heads_lab.md
wait $QW; tail -5 $R/qla_warm.log
timeout $(( 520 - $(el) )) python3 benchmarks/fused_fwd_lab.py --out $R --shapes 1x131072,1x32768,8x8192 --lb -1 --splits 16,32 --configs 64:4:2,64:8:2,128:8:2 --deadline-s $(( 480 - $(el) )) > $R/fused_lab.log 2>&1; echo "fused lab rc=$? $(el) s"; tail -30 $R/fused_fwd_lab.md
echo "end $(el) s"
