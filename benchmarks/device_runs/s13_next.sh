#!/bin/bash
# Prepared in session 12 for the next session's first device call (not run yet). One H200, `carry: [".whl", ".xfer",
# "devrun"]` (`.xfer`: FlashQLA 0.1.3 + TileLang 0.1.15 from ../shared/tools/flashqla_bundle.sh; `devrun/peers2b.db`:
# the peers2 part-2 store of session 12). About 560 s:
#  1. issue 26: KDA's training step with and without the reverse warm window (decides AUTO_BWD_WARM["kda"]), ~40 s;
#  2. issue 26: `cpbench bench train` for GDN with FLA's Triton path and FlashQLA in one process at 1x64K (step, peak
#     memory against FLA's; --no-grads: its FlashQLA gradient check compiles a second set of TileLang kernels), ~300 s;
#  3. issue 27: the peers2 part-2 sweep resumed from the carried store with the time left.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export CPBENCH_GIT_SHA=${SHA}
R=$OUT/r; mkdir -p $R
t0=$(date +%s); el() { echo $(( $(date +%s)-t0 )); }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
mkdir -p /tmp/peer && tar -xJf .xfer/peersite.tar.xz -C /tmp/peer || exit 1
export PYTHONPATH=/tmp/peer:/tmp/site:$PWD TILELANG_CACHE_DIR=/tmp/tilelang-cache
FLA_DISABLE_BACKEND_DISPATCH=1 timeout 60 python3 benchmarks/kda_bwd_warm.py --T 32768 --warm 4 > $R/kda_bwd_warm.log 2>&1
echo "kda warm rc=$? $(el) s"; tail -1 $R/kda_bwd_warm.log
FLA_DISABLE_BACKEND_DISPATCH=1 timeout 330 python3 -m runners.bench.kernels_train --ops gdn --shapes 1x65536 \
  --peers fla,flash_qla --lb=-1 --no-grads --deadline 300 --out $R/ --stem kernels_train_issue26_h200 --sha $SHA > $R/train.log 2>&1
echo "train rc=$? $(el) s"; sed -n '/^| op/,/^$/p' $R/kernels_train_issue26_h200.md
DB=sqlite:////tmp/peers2b.db; cp devrun/peers2b.db /tmp/peers2b.db
timeout -s TERM $(( 570 - $(el) )) python3 -m bench_server worker --devices 1 --once --db $DB > $R/sweep.log 2>&1
echo "worker rc=$? $(el) s"; cp /tmp/peers2b.db $R/; python3 -m bench_server status --db $DB 2>&1 | tail -8
