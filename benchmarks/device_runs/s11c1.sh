#!/bin/bash
# Session 11, device call 1. Issue 26: our cold first call (KDA's runtime diagonal loop, not yet on the H200); GPU
# tests of the warm split on the fused path; KDA's diagonal paths' speed; the warm split on the fused path timed
# (fused_fwd_lab --warm 0,2,4). Issue 27: FlashQLA's coefficients refit vs shipped (flash_qla_coefs.py); the FlashKDA
# probe. FlashQLA's TileLang kernels compile in the background while the GPU tests run.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export CPBENCH_GIT_SHA=${SHA} FLA_DISABLE_BACKEND_DISPATCH=1
R=/tmp/r; mkdir -p $R; trap 'tar czf $OUT/s11c1.tgz -C /tmp r' EXIT
t0=$(date +%s); el() { echo $(( $(date +%s)-t0 )); }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
mkdir -p /tmp/peer && tar -xJf .xfer/peersite.tar.xz -C /tmp/peer || exit 1
export PYTHONPATH=/tmp/peer:/tmp/site:$PWD TILELANG_CACHE_DIR=/tmp/tilelang-cache
echo "installed $(el) s"; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
timeout 110 python3 benchmarks/first_call_ours.py 2>&1 | tee $R/first_call.log; echo "first call rc=$? $(el) s"
( timeout 260 python3 benchmarks/first_call_flash_qla.py > $R/qla_warm.log 2>&1; echo "qla warm rc=$? at $(el) s" >> $R/qla_warm.log ) &
QW=$!
mkdir -p /tmp/fkda && python3 -m pip install -q --no-index --no-deps --target /tmp/fkda .xfer/tokenspeed_flashkda-*.whl
( PYTHONPATH=/tmp/fkda:$PYTHONPATH timeout 200 python3 benchmarks/flashkda_probe.py --out $R --T 8192 > $R/flashkda.log 2>&1; echo "flashkda rc=$? at $(el) s" >> $R/flashkda.log ) &
FK=$!
CPBENCH_TEST_GPU=1 timeout 150 python3 -m pytest -q -p no:cacheprovider -n 6 tests/kernels/common/test_warm_certify.py tests/kernels/common/test_warm_split.py tests/kernels/ops/gdn/test_fused.py > $R/gpu_tests.log 2>&1; echo "gpu tests rc=$? $(el) s"; tail -4 $R/gpu_tests.log
wait $FK; tail -6 $R/flashkda.log
timeout 70 python3 benchmarks/kda_diag_path_speed.py --T 32768 > $R/kda_diag.log 2>&1; echo "kda diag rc=$? $(el) s"; cat $R/kda_diag.log | tail -6
timeout 130 python3 benchmarks/fused_fwd_lab.py --out $R --shapes 1x131072,1x32768 --lb -1 --warm 0,2,4 --no-flash-qla --deadline-s 110 > $R/fused_lab.log 2>&1; echo "fused lab rc=$? $(el) s"; tail -20 $R/fused_fwd_lab.md
wait $QW; tail -5 $R/qla_warm.log
timeout $(( 585 - $(el) )) python3 benchmarks/flash_qla_coefs.py --out $R --T 8192 32768 131072 --directions fwd fwd+bwd --deadline-s $(( 540 - $(el) )) > $R/coefs.log 2>&1; echo "coefs rc=$? $(el) s"; tail -25 $R/flash_qla_coefs.md
echo "end $(el) s"
