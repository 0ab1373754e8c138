#!/bin/bash
# Session 14 on (prepared in session 13, not run yet): s13c.sh plus caches that outlive the machine. At the end of each
# call the Triton autotune results (*.autotune.json: FLA's picks, a few KB) and, if it packs to <= 12 MiB, TileLang's
# kernel cache go back under $OUT; carried in devrun/ next time (cp $files_at/{autotune.tgz,tilelang.tar.xz} devrun/),
# they are unpacked first, so a fresh machine skips FLA's autotune (its first calls drop from 80-130 s to a compile)
# and, with the TileLang pack, FlashQLA's compile. The points' `first_call_s` then measure the cached first call:
# the cold figures are part 2 and 3's (peers2_h200/README.md). Otherwise as s13c.sh:
# Session 13, every device call (issue 27): the peers2 part-3 sweep (runners/suites/peers2-h200-part3.yaml, the 58
# points of part 2 session 12 did not measure) through the engine, resumable. `carry: [".whl", ".xfer", "devrun"]`
# (`.xfer`: FlashQLA 0.1.3 + TileLang 0.1.15 from ../shared/tools/flashqla_bundle.sh; `devrun/peers2c.db`: the store
# the previous call returned, absent on the first). Packages, the TileLang cache and Triton's cache (autotune results
# included: TRITON_CACHE_AUTOTUNING=1, FLA_CACHE_RESULTS=1) live in .devcache/, which a warm machine keeps between
# calls, so a point cut by the call's limit does not pay FLA's autotune or FlashQLA's compile again. With KDA_WARM=1
# and 90 s left after the worker, issue 26's KDA warm-window check (benchmarks/kda_bwd_warm.py) runs too.
#   SHA=<git sha> LIMIT=570 [STORE=peers2-full] [GROUPED=1] [KDA_WARM=1] [DHFUSE=1] bash benchmarks/device_runs/s14c.sh
# Session 14 as run: STORE=peers2-full, the combined full-grid store of peers2_h200/README.md "One sweep" (sweep 1 of
# runners/suites/peers2-h200.yaml with the three parts' exports imported: 44 done, 44 queued), built here and carried
# in devrun/. With DHFUSE=1 and 150 s left after the worker, issue 26's fused_dh check runs: its GPU tests, then the
# training step at 1x64K with the default gradient kernel and with fused_dh (benchmarks/bwd_ag_lab.py).
# Session 15's first call (prepared in session 14): GROUPED=1, before the worker, about 250 s (issue 26): ours at HV
# 16 and 32 after session 14's bf16 grouped dq, dk partials through `cpbench run` (`s15_grouped.yaml`: gradients gated
# against the fp32 reference, peak memory) -> $OUT/s15_grouped.csv, its log and then what the GDN step holds at
# HV=32 64K, ours beside FLA's Triton path with the allocator's peaks (`benchmarks/step_memory.py --fla`) ->
# $OUT/s15.txt. $OUT brings back at most 8 files: the sweep's 5, these 2, DHFUSE's 1 (not in the same call).
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export CPBENCH_GIT_SHA=${SHA}
LIMIT=${LIMIT:-570}
C=$PWD/.devcache; mkdir -p $C; R=$OUT
t0=$(date +%s); el() { echo $(( $(date +%s)-t0 )); }
STORE=${STORE:-peers2c}; DBF=/tmp/$STORE.db; DB=sqlite:///$DBF
pack() {
  cp -f $DBF $R/$STORE.db 2>/dev/null; python3 -m bench_server status --db $DB > $R/status.txt 2>&1
  (cd $C && find triton -name '*.autotune.json' | tar czf $R/autotune.tgz -T -) 2>/dev/null
  XZ_OPT=-T0 tar -cJf /tmp/tilelang.tar.xz -C $C tilelang 2>/dev/null && [ $(stat -c %s /tmp/tilelang.tar.xz) -le 12582912 ] \
    && cp /tmp/tilelang.tar.xz $R/; ls -la $R
}
trap pack EXIT
[ -f $C/site.ok ] || { python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target $C/site .whl/*.whl && touch $C/site.ok; } || exit 1
[ -f $C/peer.ok ] || { mkdir -p $C/peer && tar -xJf .xfer/peersite.tar.xz -C $C/peer && touch $C/peer.ok; } || exit 1
[ -f devrun/autotune.tgz ] && [ ! -d $C/triton ] && mkdir -p $C/triton && tar -xzf devrun/autotune.tgz -C $C
[ -f devrun/tilelang.tar.xz ] && [ ! -d $C/tilelang ] && tar -xJf devrun/tilelang.tar.xz -C $C
export PYTHONPATH=$C/peer:$C/site:$PWD TILELANG_CACHE_DIR=$C/tilelang TRITON_CACHE_DIR=$C/triton TRITON_CACHE_AUTOTUNING=1 FLA_CACHE_RESULTS=1
echo "ready $(el) s"; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
python3 -c "import torch, triton, fla, flash_qla, tilelang; print(torch.__version__, triton.__version__, fla.__version__, getattr(flash_qla,'__version__','?'), tilelang.__version__)"
if [ -n "$GROUPED" ]; then
  G=sqlite:////tmp/s15g.db
  python3 -m bench_server db upgrade --db $G > /dev/null
  timeout 200 python3 -m bench_server run benchmarks/device_runs/s15_grouped.yaml --db $G --devices 1 -f csv \
    > $R/s15_grouped.csv 2> $R/s15.txt; echo "grouped rc=$? $(el) s"
  FLA_DISABLE_BACKEND_DISPATCH=1 timeout 200 python3 benchmarks/step_memory.py --op gdn --T 65536 --H 16 --HV 32 \
    --fla --device cuda > /tmp/step_memory.txt 2>&1; echo "step_memory rc=$? $(el) s"
  cat /tmp/step_memory.txt >> $R/s15.txt; grep -E 'peak|ours / FLA' /tmp/step_memory.txt
fi
# the sweep: FLA as dispatched must see FlashQLA (no FLA_DISABLE_BACKEND_DISPATCH; the fla backend pins it itself)
[ -f devrun/$STORE.db ] && cp devrun/$STORE.db $DBF
python3 -m bench_server db upgrade --db $DB >> $R/sweep.log 2>&1
[ -f devrun/$STORE.db ] || python3 -m bench_server submit runners/suites/peers2-h200-part3.yaml --db $DB >> $R/sweep.log 2>&1
RES=0; [ -n "$KDA_WARM" ] && RES=90; [ -n "$DHFUSE" ] && RES=$(( RES + 150 ))
W=$(( LIMIT - $(el) - RES ))
timeout -s TERM $W python3 -m bench_server worker --devices 1 --once --db $DB >> $R/sweep.log 2>&1; echo "worker rc=$? $(el) s"
if [ -n "$KDA_WARM" ] && [ $(( LIMIT - $(el) )) -ge 60 ]; then
  FLA_DISABLE_BACKEND_DISPATCH=1 timeout $(( LIMIT - $(el) - 5 )) python3 benchmarks/kda_bwd_warm.py --T 32768 --warm 4 > $R/kda_bwd_warm.log 2>&1
  echo "kda warm rc=$? $(el) s"; tail -3 $R/kda_bwd_warm.log
fi
if [ -n "$DHFUSE" ] && [ $(( LIMIT - $(el) )) -ge 120 ]; then
  # one file back ($OUT holds at most 8): the tests' log, the lab's log and its table
  CPBENCH_TEST_GPU=1 timeout 100 python3 -m pytest -q -p no:cacheprovider tests/kernels/common/test_dh_grads_bwd.py \
    > $R/dh_check.txt 2>&1; echo "dh gpu tests rc=$? $(el) s"; tail -2 $R/dh_check.txt
  timeout $(( LIMIT - $(el) - 5 )) python3 benchmarks/bwd_ag_lab.py --out /tmp/bwd --shapes 1x65536 --lb -1 --no-fla \
    --bwd-warm 4 --variants inputs:fused:warm,inputs:fused_dh:warm --deadline-s $(( LIMIT - $(el) - 20 )) \
    >> $R/dh_check.txt 2>&1; echo "bwd lab rc=$? $(el) s"; cat /tmp/bwd/bwd_ag_lab.md >> $R/dh_check.txt 2>/dev/null
  cat /tmp/bwd/bwd_ag_lab.md 2>/dev/null
fi
python3 -m bench_server status --db $DB 2>&1 | tail -12
echo "end $(el) s"
