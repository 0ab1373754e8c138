#!/bin/bash
# Session 10, device call 1: issue 26 (GPU tests of the merged WY/warm-split kernels; timing of the gate-certified
# warm split against the exact maps), issue 27 (the rest of session 9's peers2-mini store: ours, FLA as dispatched,
# FlashQLA's training steps). The peers worker runs in the background and is paused (SIGSTOP) while our kernels are timed.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export CPBENCH_GIT_SHA=${SHA}
R=/tmp/r; mkdir -p $R; trap 'tar czf $OUT/s10c1.tgz -C /tmp r' EXIT
t0=$(date +%s); el() { echo $(( $(date +%s)-t0 )); }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
mkdir -p /tmp/peer && tar -xJf .xfer/peersite.tar.xz -C /tmp/peer || exit 1
export PYTHONPATH=/tmp/peer:/tmp/site:$PWD TILELANG_CACHE_DIR=/tmp/tilelang-cache
echo "installed $(el) s"; nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader
python3 -c "import torch, triton, flash_qla, tilelang, fla; print('torch', torch.__version__, 'triton', triton.__version__, 'flash_qla', getattr(flash_qla,'__version__','?'), 'tilelang', tilelang.__version__, 'fla', fla.__version__)"
cp devrun/peers2_s9.db $R/peers2.db; DB=sqlite:///$R/peers2.db; python3 -m bench_server db upgrade --db $DB > /dev/null
setsid bash -c "timeout 540 python3 -m bench_server worker --db $DB --once --devices 1 > $R/peers2_worker.log 2>&1" &
WPID=$!
FLA_DISABLE_BACKEND_DISPATCH=1 CPBENCH_TEST_GPU=1 timeout 170 python3 -m pytest -q -p no:cacheprovider -n 4 tests/kernels/common/test_warm_split.py tests/kernels/test_dispatch_triton.py tests/kernels/common/test_decay_gate_range.py tests/kernels/common/test_l2norm.py > $R/gpu_tests.log 2>&1; echo "gpu tests rc=$? $(el) s"; tail -3 $R/gpu_tests.log
kill -STOP -$WPID; echo "worker paused $(el) s"
FLA_DISABLE_BACKEND_DISPATCH=1 timeout 230 python3 -m runners.bench.kernels --ops gdn,kda --shapes 1x131072,1x32768 --profile --warm 0,2,4 --warm-splits 32 --lb -1 --no-fla --no-check --jobs 8 --deadline 150 --name kernels_warm_lb1_h200 --out $R > $R/kernels_warm.log 2>&1; echo "bench rc=$? $(el) s"; tail -5 $R/kernels_warm.log
kill -CONT -$WPID; echo "worker resumed $(el) s"
while kill -0 $WPID 2>/dev/null && [ $(el) -lt 560 ]; do sleep 5; done
kill -TERM -$WPID 2>/dev/null; sleep 2
python3 -m bench_server status --db $DB 2>&1 | tail -12
du -sh /tmp/tilelang-cache 2>/dev/null; ls /tmp/tilelang-cache | head; (cd /tmp && tar czf $OUT/tlcache.tgz tilelang-cache 2>/dev/null); ls -la $OUT/tlcache.tgz; [ $(stat -c %s $OUT/tlcache.tgz) -lt 15000000 ] || rm -f $OUT/tlcache.tgz
echo "end $(el) s"
