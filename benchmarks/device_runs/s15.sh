#!/bin/bash
# Session 15 (prepared in session 14, not run yet): one H200, `carry: [".whl", ".xfer", "devrun"]`, timeout_s 600.
# First call only (a marker in .devcache, which a warm machine keeps), about 250 s, issue 26:
#  1. ours at HV=32 after session 14's bf16 dq, dk partials (`s15_grouped.yaml`: GDN and KDA fwd+bwd at 8K and 64K, HV 16 and 32,
#     gradients gated against the fp32 reference, peak memory) -> $OUT/s15_grouped.csv (its log: $OUT/s15.txt);
#  2. what the GDN step holds at HV=32 64K, ours beside FLA's Triton path, with the allocator's peaks
#     (`benchmarks/step_memory.py --fla --device cuda`) -> appended to $OUT/s15.txt.
# $OUT brings back at most 8 files: these 2 and s14c.sh's 5 (6 with DHFUSE=1: dh_check.txt; not in the first call).
# Then, every call: the peers2 sweep on the carried store (`s14c.sh` with STORE=peers2-full: 18 KDA HV=32 points
# were left by session 14) in the time left; DHFUSE=1 passes on to s14c.sh (issue 26's fused_dh check).
#   SHA=<git sha> LIMIT=570 [DHFUSE=1] bash benchmarks/device_runs/s15.sh
# Between calls: cp $files_at/{peers2-full.db,autotune.tgz,tilelang.tar.xz} devrun/ (what came back).
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export CPBENCH_GIT_SHA=${SHA}
LIMIT=${LIMIT:-570}
C=$PWD/.devcache; mkdir -p $C
t0=$(date +%s); el() { echo $(( $(date +%s)-t0 )); }
[ -f $C/site.ok ] || { python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target $C/site .whl/*.whl && touch $C/site.ok; } || exit 1
[ -f $C/peer.ok ] || { mkdir -p $C/peer && tar -xJf .xfer/peersite.tar.xz -C $C/peer && touch $C/peer.ok; } || exit 1
[ -f devrun/autotune.tgz ] && [ ! -d $C/triton ] && mkdir -p $C/triton && tar -xzf devrun/autotune.tgz -C $C
if [ ! -f $C/s15pre.ok ]; then
  (
    export PYTHONPATH=$C/peer:$C/site:$PWD TRITON_CACHE_DIR=$C/triton TRITON_CACHE_AUTOTUNING=1 FLA_CACHE_RESULTS=1
    G=sqlite:////tmp/s15g.db
    python3 -m bench_server db upgrade --db $G > /dev/null
    timeout 200 python3 -m bench_server run benchmarks/device_runs/s15_grouped.yaml --db $G --devices 1 -f csv \
      > $OUT/s15_grouped.csv 2> $OUT/s15.txt
    echo "grouped rc=$? $(el) s"
    FLA_DISABLE_BACKEND_DISPATCH=1 timeout 200 python3 benchmarks/step_memory.py --op gdn --T 65536 --H 16 --HV 32 \
      --fla --device cuda > /tmp/step_memory.txt 2>&1
    echo "step_memory rc=$? $(el) s"; cat /tmp/step_memory.txt >> $OUT/s15.txt; grep -E 'peak|ours / FLA' /tmp/step_memory.txt
  )
  touch $C/s15pre.ok
fi
LIMIT=$(( LIMIT - $(el) )) STORE=peers2-full bash benchmarks/device_runs/s14c.sh
