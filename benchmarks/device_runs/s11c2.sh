#!/bin/bash
# Session 11, device call 2 (issue 26): GPU tests of the warm split as the fused path's default (WARM_DEFAULT fused=4);
# GDN's training step against FLA 0.6.0 (Triton path, guard bypassed) and FlashQLA 0.1.3 (both columns) with peak
# memory, per-kernel times and gradient errors (`cpbench bench train`); then GDN's forward on issue 26's preset
# grid against FlashQLA (`cpbench bench kernels --preset issue26`, to the deadline). FlashQLA's TileLang kernels
# compile in the background while the tests run.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export CPBENCH_GIT_SHA=${SHA} FLA_DISABLE_BACKEND_DISPATCH=1
R=/tmp/r; mkdir -p $R; trap 'tar czf $OUT/s11c2.tgz -C /tmp r' EXIT
t0=$(date +%s); el() { echo $(( $(date +%s)-t0 )); }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
mkdir -p /tmp/peer && tar -xJf .xfer/peersite.tar.xz -C /tmp/peer || exit 1
export PYTHONPATH=/tmp/peer:/tmp/site:$PWD TILELANG_CACHE_DIR=/tmp/tilelang-cache
echo "installed $(el) s"
( timeout 250 python3 benchmarks/first_call_flash_qla.py > $R/qla_warm.log 2>&1; echo "qla warm rc=$? at $(el) s" >> $R/qla_warm.log ) &
QW=$!
CPBENCH_TEST_GPU=1 timeout 150 python3 -m pytest -q -p no:cacheprovider -n 6 tests/kernels/ops/gdn/test_fused.py tests/kernels/common/test_warm_split.py tests/kernels/test_dispatch_triton.py > $R/gpu_tests.log 2>&1; echo "gpu tests rc=$? $(el) s"; tail -4 $R/gpu_tests.log
wait $QW; grep -v Warning $R/qla_warm.log | grep -v TileLang | tail -6
timeout $(( 430 - $(el) )) python3 -m runners.bench.kernels_train --ops gdn --shapes 1x65536,1x8192,1x131072,8x8192,1x32768 --hv 16 --lb=-1 --peers fla,flash_qla --deadline $(( 400 - $(el) )) --out $R --stem train_gdn_s11 --sha ${SHA} > $R/train.log 2>&1; echo "bench train rc=$? $(el) s"; tail -40 $R/train_gdn_s11.md
timeout $(( 570 - $(el) )) python3 -m runners.bench.kernels --ops gdn --preset issue26 --peers flash_qla --no-fla --jobs 0 --deadline $(( 540 - $(el) )) --out $R --name fwd_gdn_s11 > $R/fwd.log 2>&1; echo "bench kernels rc=$? $(el) s"; tail -30 $R/fwd_gdn_s11.md
echo "end $(el) s"
