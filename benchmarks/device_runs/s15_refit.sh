#!/bin/bash
# Session 15, last device call (issue 27, item 5): FlashQLA's coefficient refit in the training direction, which
# session 12's forward-only refit (flash_qla_coefs_h200.md) left out. fwd+bwd at T=32K (lb -5 and -1) and one
# two-sequence shape (16K:16K, for the correction rows), split sizes around FlashQLA's own decision, its gate passed
# to `decide`. Cold TileLang cache: the backward compiles about 150 s. `carry: [".whl", ".xfer"]`.
#   SHA=<git sha> DEADLINE=240 bash benchmarks/device_runs/s15_refit.sh
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export CPBENCH_GIT_SHA=${SHA}
t0=$(date +%s); el() { echo $(( $(date +%s)-t0 )); }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
mkdir -p /tmp/peer && tar -xJf .xfer/peersite.tar.xz -C /tmp/peer || exit 1
export PYTHONPATH=/tmp/peer:/tmp/site:$PWD TILELANG_CACHE_DIR=/tmp/tilelang-cache
echo "installed $(el) s"; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
FLA_DISABLE_BACKEND_DISPATCH=1 timeout $(( ${DEADLINE:-240} + 25 )) python3 benchmarks/flash_qla_coefs.py --out $OUT \
  --T 32768 --varlen 16384:16384 --lb -5 -1 --directions fwd+bwd --deadline-s ${DEADLINE:-240} > $OUT/coefs.log 2>&1
echo "coefs rc=$? $(el) s"; tail -40 $OUT/flash_qla_coefs.md
