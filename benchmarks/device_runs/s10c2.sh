#!/bin/bash
# Session 10, device call 2: issue 26 (the gate-range kernel tests on the GPU; timing of the gate-certified warm split
# against the exact maps, our kernels alone), issue 27 (session 9's peers2-mini sweep taken over with
# `cpbench run --resume 1`: ours, FLA as dispatched, FlashQLA's training steps; the FlashKDA probe). The sweep runs in
# the background and is paused (SIGSTOP) while our kernels are timed.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export CPBENCH_GIT_SHA=${SHA}
R=/tmp/r; mkdir -p $R; trap 'tar czf $OUT/s10c2.tgz -C /tmp r' EXIT
t0=$(date +%s); el() { echo $(( $(date +%s)-t0 )); }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
mkdir -p /tmp/peer && tar -xJf .xfer/peersite.tar.xz -C /tmp/peer || exit 1
export PYTHONPATH=/tmp/peer:/tmp/site:$PWD TILELANG_CACHE_DIR=/tmp/tilelang-cache
echo "installed $(el) s"
cp devrun/peers2_s9.db $R/peers2.db; DB=sqlite:///$R/peers2.db; python3 -m bench_server db upgrade --db $DB > /dev/null
setsid bash -c "timeout 560 python3 -m bench_server run --resume 1 --db $DB --devices 1 -f csv > $R/peers2.csv 2> $R/peers2.err" &
sleep 1; WPG=$(ps -o pgid= -p $! | tr -d ' '); echo "sweep pgid $WPG"
FLA_DISABLE_BACKEND_DISPATCH=1 CPBENCH_TEST_GPU=1 timeout 120 python3 -m pytest -q -p no:cacheprovider -n 4 tests/kernels/common/test_decay_gate_range.py > $R/gpu_tests.log 2>&1; echo "gpu tests rc=$? $(el) s"; tail -3 $R/gpu_tests.log
kill -STOP -$WPG; echo "sweep paused $(el) s"
FLA_DISABLE_BACKEND_DISPATCH=1 timeout 290 python3 -m runners.bench.kernels --ops gdn,kda --shapes 1x131072,1x32768 --profile --warm 0,2,4 --warm-splits 32 --lb -1 --no-fla --no-check --jobs 0 --deadline 230 --name kernels_warm_lb1_h200 --out $R > $R/kernels_warm.log 2>&1; echo "bench rc=$? $(el) s"; grep -c VARIANT $R/kernels_warm.log
kill -CONT -$WPG; echo "sweep resumed $(el) s"
mkdir -p /tmp/fkda && python3 -m pip install -q --no-index --no-deps --target /tmp/fkda .xfer/tokenspeed_flashkda-*.whl && PYTHONPATH=/tmp/fkda:$PYTHONPATH timeout 90 python3 benchmarks/flashkda_probe.py --out $R --T 8192 > $R/flashkda.log 2>&1; echo "flashkda rc=$? $(el) s"; tail -4 $R/flashkda.log
while kill -0 -$WPG 2>/dev/null && [ $(el) -lt 575 ]; do sleep 5; done
kill -TERM -$WPG 2>/dev/null; sleep 2
python3 -m bench_server status --db $DB 2>&1 | tail -8
echo "end $(el) s"
