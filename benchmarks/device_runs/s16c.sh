#!/bin/bash
# Session 16 (issue 26), every call on one warm machine; s14c.sh's setup (packages, FlashQLA + TileLang, the caches
# in .devcache/ that a warm machine keeps between calls, FLA's autotune results carried in devrun/autotune.tgz), then
# the parts asked for (`carry: [".whl", ".xfer", "devrun"]`; at most 8 files come back):
#   TRAIN=1   `cpbench bench train` for GDN with FLA's Triton path and FlashQLA in one process, issue 26's grid
#             (--preset issue26, rows by importance, cut cleanly at the deadline) -> kernels_train_issue26_h200.{md,json}
#   TUNE=1    re-tune the launch configs of the kernels as they are now (benchmarks/autotune_h200.py: the forward at
#             its three shapes, then the step's own kernels at 1x64K) -> tune_fwd.json, tune_bwd.json, tune.log
#   DHSPILL=1 the check of s13_dhspill.sh (removed with fused_dh in session 16, after this ran): the fused dh kernel's ds_mem variant against its register default and against
#             what it replaces (dh walk + fused gradients) at 1x64K -> dhspill.txt
#   HOSTLAB=1 [HOSTLAB_ARGS="--profile 20 --shapes .."] (first run in session 17) the short steps host-bound? benchmarks/host_bound_lab.py at 1x8K,
#             1x16K, 1x32K: default / no split / wy+states, step and kernel ms beside the host's issue time and the
#             launch counts -> host_bound_lab.md; run it first in a call (about 60 s with the compiles)
#   TUNE=bwd  (session 19) only the step's own GDN kernels at 1x64K -> tune_bwd.json, tune.log [TUNE_BUDGET=6]
#             [TRAIN_S=s: seconds left for TRAIN after it]
#   SHA=<git sha> LIMIT=570 [TRAIN=1 [TRAIN_ARGS="--shapes .. --hv .."]] [TUNE=1] [DHSPILL=1] bash benchmarks/device_runs/s16c.sh
#   GPUTEST="tests/.. tests/.." [GPUTEST_S=150] [GPUTEST_X=]  (session 17) those tests on the GPU first -> gputest.txt
#             (stops at the first failure; GPUTEST_X= (empty, session 20) runs them all; GPUTEST_N=6 (session 20):
#             in 6 pytest-xdist processes, the image's, so the compiles run side by side on the host's 16 cores)
#   OLDTEST="tests/..::case" (session 20) that test on the GPU in an older tree, devrun/old.tar (`git archive -o
#             devrun/old.tar <sha> kernels tests runners pyproject.toml`) -> oldtest.txt: was a GPU failure there before?
#   LAB="cmd" [LAB_S=200] (session 20) any command (a lab: `python3 benchmarks/wy_ag_lab.py --out $R/ag ..`), its
#             output -> lab.txt; run after OLDTEST
# (the parts run in the order GPUTEST, OLDTEST, LAB, HOSTLAB, TUNE, DHSPILL, TRAIN; TRAIN's deadline is what is left)
# (session 21) keep devrun/ to what this script reads (autotune.tgz, tilelang.tar.xz, old.tar): with earlier calls'
# outputs in it the carry passed 64 MiB and was refused; or carry those files by name.
# On exit (session 17) FLA's autotune results (autotune.tgz) and TileLang's cache (tilelang.tar.xz, FlashQLA's compiled
# kernels, <= 12 MiB) come back under $OUT: copy both into devrun/ so the next cold machine skips FLA's autotune and
# FlashQLA's compiles (sessions 16-17 lost three train calls to them: 106-151 s per library on a cold machine).
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export CPBENCH_GIT_SHA=${SHA}
LIMIT=${LIMIT:-570}
C=$PWD/.devcache; mkdir -p $C; R=$OUT
t0=$(date +%s); el() { echo $(( $(date +%s)-t0 )); }
[ -f $C/site.ok ] || { python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target $C/site .whl/*.whl && touch $C/site.ok; } || exit 1
[ -f $C/peer.ok ] || { mkdir -p $C/peer && tar -xJf .xfer/peersite.tar.xz -C $C/peer && touch $C/peer.ok; } || exit 1
pack() {  # (session 17) FLA's autotune results and TileLang's compiled FlashQLA kernels back under $OUT, for devrun/
  (cd $C && find triton -name '*.autotune.json' | tar czf $R/autotune.tgz -T -) 2>/dev/null
  XZ_OPT=-T0 tar -cJf /tmp/tilelang.tar.xz -C $C tilelang 2>/dev/null && [ $(stat -c %s /tmp/tilelang.tar.xz) -le 12582912 ] \
    && cp /tmp/tilelang.tar.xz $R/
}
trap pack EXIT; trap 'exit 143' TERM
[ -f devrun/autotune.tgz ] && [ ! -d $C/triton ] && mkdir -p $C/triton && tar -xzf devrun/autotune.tgz -C $C
[ -f devrun/tilelang.tar.xz ] && [ ! -d $C/tilelang ] && tar -xJf devrun/tilelang.tar.xz -C $C
export PYTHONPATH=$C/peer:$C/site:$PWD TILELANG_CACHE_DIR=$C/tilelang TRITON_CACHE_DIR=$C/triton TRITON_CACHE_AUTOTUNING=1 FLA_CACHE_RESULTS=1
echo "ready $(el) s"; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
python3 -c "import torch, triton, fla, flash_qla, tilelang; print(torch.__version__, triton.__version__, fla.__version__, getattr(flash_qla,'__version__','?'), tilelang.__version__)"
if [ -n "$GPUTEST" ]; then  # GPUTEST="tests/... tests/...": those tests on the GPU (CPBENCH_TEST_GPU=1, bf16)
  CPBENCH_TEST_GPU=1 timeout ${GPUTEST_S:-150} python3 -m pytest -q ${GPUTEST_X--x} ${GPUTEST_N:+-n $GPUTEST_N} \
    -p no:cacheprovider $GPUTEST \
    > $R/gputest.txt 2>&1
  echo "gpu tests rc=$? $(el) s"; grep -E "^(FAILED|ERROR)" $R/gputest.txt; tail -4 $R/gputest.txt
fi
if [ -n "$OLDTEST" ]; then
  rm -rf /tmp/old && mkdir -p /tmp/old && tar -xf devrun/old.tar -C /tmp/old
  (cd /tmp/old && PYTHONPATH=$C/peer:$C/site:/tmp/old CPBENCH_TEST_GPU=1 timeout 120 python3 -m pytest -q \
    -p no:cacheprovider $OLDTEST) > $R/oldtest.txt 2>&1
  echo "old test rc=$? $(el) s"; grep -E "rel|^(FAILED|ERROR)" $R/oldtest.txt | head; tail -3 $R/oldtest.txt
fi
if [ -n "$LAB" ]; then
  R=$R timeout ${LAB_S:-200} bash -c "$LAB" > $R/lab.txt 2>&1; echo "lab rc=$? $(el) s"; tail -40 $R/lab.txt
fi
if [ -n "$HOSTLAB" ]; then
  timeout 240 python3 benchmarks/host_bound_lab.py --out /tmp/hb ${HOSTLAB_ARGS} > $R/host_bound_lab.log 2>&1
  echo "host lab rc=$? $(el) s"; cp /tmp/hb/host_bound_lab.md /tmp/hb/host_profile.txt $R/ 2>/dev/null; cat /tmp/hb/host_bound_lab.md
  [ -f /tmp/hb/host_profile.txt ] && head -3 /tmp/hb/host_profile.txt
fi
if [ -n "$TUNE" ]; then  # TUNE=bwd (session 19): only the step's own GDN kernels (wy_from_ag was never tuned)
  OPS="gdn kda"; [ "$TUNE" = bwd ] && OPS=gdn
  if [ "$TUNE" != bwd ]; then
    A=$(( (LIMIT - $(el) - 30) * 9 / 20 ))
    python3 benchmarks/autotune_h200.py run --ops $OPS --budget 6 --deadline-s $A --sha $SHA --out $R/tune_fwd.json \
      > $R/tune.log 2>&1; echo "tune fwd rc=$? $(el) s"
  fi
  B=$(( LIMIT - $(el) - 30 - ${TRAIN_S:-0} ))
  python3 benchmarks/autotune_h200.py run --ops $OPS --shapes 1x65536 --directions fwd+bwd --budget ${TUNE_BUDGET:-6} \
    --deadline-s $B --sha $SHA --out $R/tune_bwd.json >> $R/tune.log 2>&1; echo "tune bwd rc=$? $(el) s"
  grep -E "default .* tuned|crash|deadline|wrote" $R/tune.log
fi
if [ -n "$DHSPILL" ]; then
  CPBENCH_TEST_GPU=1 timeout 150 python3 -m pytest -q -p no:cacheprovider tests/kernels/common/test_dh_grads_bwd.py \
    > $R/dhspill.txt 2>&1; echo "gpu tests rc=$? $(el) s"; tail -3 $R/dhspill.txt
  timeout ${DH_S:-230} python3 benchmarks/dqk_wy_lab.py --out /tmp/dqk --ops gdn --shapes 1x65536 \
    --configs default --pair-configs none --no-split --no-step --dh-configs default mem_bk32_w8 mem_bk64_w8 mem_bk32_w4 \
    mem_bk16_w4 --deadline-s $(( ${DH_S:-230} - 30 )) >> $R/dhspill.txt 2>&1
  echo "dqk lab rc=$? $(el) s"; cat /tmp/dqk/dqk_wy_lab.md >> $R/dhspill.txt; cat /tmp/dqk/dqk_wy_lab.md
fi
if [ -n "$TRAIN" ]; then
  D=$(( LIMIT - $(el) - 40 ))
  FLA_DISABLE_BACKEND_DISPATCH=1 timeout $(( D + 30 )) python3 -m runners.bench.kernels_train --ops gdn ${TRAIN_ARGS:---preset issue26} \
    --peers fla,flash_qla --deadline $D --out $R/ --stem kernels_train_issue26_h200 --sha $SHA > $R/train.log 2>&1
  echo "train rc=$? $(el) s"; tail -30 $R/kernels_train_issue26_h200.md
fi
echo "end $(el) s"
