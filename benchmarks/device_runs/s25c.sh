#!/bin/bash
# Session 25 (issue 26): s16c.sh's setup, lean (carry: [".whl", ".xfer", "devrun/tilelang.tar.xz"] and, when a call
# brought them back, "devrun/autotune.tgz"; .whl holds fla-core 0.6.0 only: nothing timed here imports the service),
# then the parts asked for, in this order:
#   GPUTEST="tests/.." [GPUTEST_S=150] [GPUTEST_N=6]   those tests on the GPU (CPBENCH_TEST_GPU=1), all of them -> gputest.txt
#   LAB="cmd" [LAB_S=200]                              any command, R=$OUT in its environment -> lab.txt
#   TRAIN="args"                                       python -m runners.bench.kernels_train --ops gdn <args> (name
#                                                      --peers there; its --deadline is what is left) -> train.log + its files
#   H200_TUNED=1                                       TRAIN gets --autotune benchmarks/results/autotune_h200.json on an H200
#   SHA=<git sha> LIMIT=570 bash benchmarks/device_runs/s25c.sh
# On exit FLA's autotune results (autotune.tgz) and TileLang's cache (tilelang.tar.xz: ours and FlashQLA's compiled
# kernels, <= 12 MiB) come back under $OUT: copy them into devrun/ for the next cold machine.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
export CPBENCH_GIT_SHA=${SHA}
LIMIT=${LIMIT:-570}
C=$PWD/.devcache; mkdir -p $C; R=$OUT
t0=$(date +%s); el() { echo $(( $(date +%s)-t0 )); }
[ -f $C/site.ok ] || { python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target $C/site .whl/*.whl && touch $C/site.ok; } || exit 1
[ -f $C/peer.ok ] || { mkdir -p $C/peer && tar -xJf .xfer/peersite.tar.xz -C $C/peer && touch $C/peer.ok; } || exit 1
pack() {
  (cd $C && find triton -name '*.autotune.json' | tar czf $R/autotune.tgz -T -) 2>/dev/null
  XZ_OPT=-T0 tar -cJf /tmp/tilelang.tar.xz -C $C tilelang 2>/dev/null && [ $(stat -c %s /tmp/tilelang.tar.xz) -le 12582912 ] \
    && cp /tmp/tilelang.tar.xz $R/
}
trap pack EXIT; trap 'exit 143' TERM
[ -f devrun/autotune.tgz ] && [ ! -d $C/triton ] && mkdir -p $C/triton && tar -xzf devrun/autotune.tgz -C $C
[ -f devrun/tilelang.tar.xz ] && [ ! -d $C/tilelang ] && tar -xJf devrun/tilelang.tar.xz -C $C
export PYTHONPATH=$C/peer:$C/site:$PWD TILELANG_CACHE_DIR=$C/tilelang TRITON_CACHE_DIR=$C/triton TRITON_CACHE_AUTOTUNING=1 FLA_CACHE_RESULTS=1
echo "ready $(el) s"; nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
# H200_TUNED=1: the H200 autotune file goes into TRAIN on an H200 only (it refuses other cards)
[ -n "$H200_TUNED" ] && nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200 \
  && TRAIN="$TRAIN --autotune benchmarks/results/autotune_h200.json" && echo "TRAIN with the H200 autotune file"
python3 -c "import torch, triton, fla, flash_qla, tilelang; print(torch.__version__, triton.__version__, fla.__version__, getattr(flash_qla,'__version__','?'), tilelang.__version__)"
if [ -n "$GPUTEST" ]; then
  CPBENCH_TEST_GPU=1 timeout ${GPUTEST_S:-150} python3 -m pytest -q ${GPUTEST_N:+-n $GPUTEST_N} -p no:cacheprovider $GPUTEST \
    > $R/gputest.txt 2>&1
  echo "gpu tests rc=$? $(el) s"; grep -E "^(FAILED|ERROR)" $R/gputest.txt; tail -4 $R/gputest.txt
fi
if [ -n "$LAB" ]; then
  R=$R timeout ${LAB_S:-200} bash -c "$LAB" > $R/lab.txt 2>&1; echo "lab rc=$? $(el) s"; tail -30 $R/lab.txt
fi
if [ -n "$TRAIN" ]; then
  D=$(( LIMIT - $(el) - 40 ))
  FLA_DISABLE_BACKEND_DISPATCH=1 timeout $(( D + 30 )) python3 -m runners.bench.kernels_train --ops gdn $TRAIN \
    --deadline $D --out $R/ --stem kernels_train_issue26_h200 --sha $SHA > $R/train.log 2>&1
  echo "train rc=$? $(el) s"; tail -40 $R/kernels_train_issue26_h200.md
fi
echo "end $(el) s"
