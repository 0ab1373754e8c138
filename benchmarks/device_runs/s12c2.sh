#!/bin/bash
# Session 12, device call 2 (issue 26's show): `cpbench bench train` for GDN with FLA's Triton path and FlashQLA in one
# process (step time, peak memory, per-kernel split, gradients), then the engine's `none` vs `warmup_correct` on one
# GPU (runners/suites/issue26-modes-h200-core.yaml: GDN and KDA, fwd and fwd+bwd, 32K and 128K).
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export CPBENCH_GIT_SHA=${SHA} FLA_DISABLE_BACKEND_DISPATCH=1
R=/tmp/r; mkdir -p $R; trap 'tar czf $OUT/s12c2.tgz -C /tmp r' EXIT
t0=$(date +%s); el() { echo $(( $(date +%s)-t0 )); }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
mkdir -p /tmp/peer && tar -xJf .xfer/peersite.tar.xz -C /tmp/peer || exit 1
export PYTHONPATH=/tmp/peer:/tmp/site:$PWD TILELANG_CACHE_DIR=/tmp/tilelang-cache
echo "installed $(el) s"
timeout 345 python3 -m runners.bench.kernels_train --ops gdn --shapes 1x65536,1x32768,8x8192 --peers fla,flash_qla --lb=-1 --deadline 320 --out $R/ --stem kernels_train_issue26_h200 --sha $SHA > $R/train.log 2>&1; echo "train rc=$? $(el) s"; tail -40 $R/kernels_train_issue26_h200.md
DB=sqlite:////tmp/r/modes.db
python3 -m bench_server db upgrade --db $DB > $R/modes.log 2>&1
timeout -s TERM $(( 560 - $(el) )) python3 -m bench_server run runners/suites/issue26-modes-h200-core.yaml --db $DB --devices 1 -f csv > $R/modes.csv 2>> $R/modes.log; echo "modes rc=$? $(el) s"
cut -d, -f5-9,16,19,25 $R/modes.csv | head -20
echo "end $(el) s"
