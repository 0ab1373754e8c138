#!/bin/bash
# Session 12, device call 1 (issue 27): FlashQLA's auto-CP coefficients refit on the H200 vs the shipped sm90.csv
# (flash_qla_coefs.py, forward, T 32K/128K); then the peers2 part-2 sweep (runners/suites/peers2-h200-part2.yaml)
# through the engine, into a store that travels back ($OUT) so a later call resumes it.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export CPBENCH_GIT_SHA=${SHA}
R=/tmp/r; mkdir -p $R; trap 'cp -f /tmp/peers2b.db $R/ 2>/dev/null; tar czf $OUT/s12c1.tgz -C /tmp r' EXIT
t0=$(date +%s); el() { echo $(( $(date +%s)-t0 )); }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
mkdir -p /tmp/peer && tar -xJf .xfer/peersite.tar.xz -C /tmp/peer || exit 1
export PYTHONPATH=/tmp/peer:/tmp/site:$PWD TILELANG_CACHE_DIR=/tmp/tilelang-cache
echo "installed $(el) s"; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
python3 -c "import torch, triton, fla, flash_qla, tilelang; print(torch.__version__, triton.__version__, fla.__version__, getattr(flash_qla,'__version__','?'), tilelang.__version__)"
FLA_DISABLE_BACKEND_DISPATCH=1 timeout 285 python3 benchmarks/flash_qla_coefs.py --out $R --T 32768 131072 --directions fwd --deadline-s 255 --pack-cache $R/tilelang_cache.tar.xz > $R/coefs.log 2>&1; echo "coefs rc=$? $(el) s"; tail -30 $R/flash_qla_coefs.md
# the sweep: FLA as dispatched must see FlashQLA (no FLA_DISABLE_BACKEND_DISPATCH here; the fla backend pins it itself)
DB=sqlite:////tmp/peers2b.db
if [ -f devrun/peers2b.db ]; then cp devrun/peers2b.db /tmp/peers2b.db; fi
python3 -m bench_server db upgrade --db $DB > $R/sweep.log 2>&1
[ -f devrun/peers2b.db ] || python3 -m bench_server submit runners/suites/peers2-h200-part2.yaml --db $DB >> $R/sweep.log 2>&1
timeout -s TERM $(( 575 - $(el) )) python3 -m bench_server worker --devices 1 --once --db $DB >> $R/sweep.log 2>&1; echo "worker rc=$? $(el) s"
sleep 2; python3 -m bench_server status --db $DB 2>&1 | tail -15
echo "end $(el) s"
