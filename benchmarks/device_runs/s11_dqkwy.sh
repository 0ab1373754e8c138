#!/bin/bash
# Session 11 (issue 26, helper dqkwy): the backward's gradient kernels fused per chunk (`chunk_bwd_dqk_wy`,
# kernels/common/dqk_wy_bwd.py). GPU tests of the fused kernel and of the pair it replaces (bf16, against the fp32
# reference and each other), then benchmarks/dqk_wy_lab.py: the pair vs the fused kernel, GDN and KDA at 1x64K,
# 1x128K and 8x8K (H=16, K=V=128), each beside its bytes floor, the step time and peak memory with each.
# Results: $OUT/dqk_wy_lab.{md,json} (-> benchmarks/results/dqk_wy_lab_h200.*) and $OUT/s11_dqkwy.tgz (logs).
export PYTHONUNBUFFERED=1 CPBENCH_GIT_SHA=${SHA}
R=/tmp/r; mkdir -p $R; trap 'tar czf $OUT/s11_dqkwy.tgz -C /tmp r' EXIT
t0=$(date +%s); el() { echo $(( $(date +%s)-t0 )); }
if ls .whl/*.whl > /dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site:$PWD
else
  export PYTHONPATH=$PWD
fi
echo "installed $(el) s"
CPBENCH_TEST_GPU=1 timeout 150 python3 -m pytest -q -p no:cacheprovider -n 4 tests/kernels/common/test_dqk_wy_bwd.py tests/kernels/common/test_chunk_bwd.py > $R/gpu_tests.log 2>&1; echo "gpu tests rc=$? $(el) s"; tail -4 $R/gpu_tests.log
timeout $(( 570 - $(el) )) python3 benchmarks/dqk_wy_lab.py --out $OUT > $R/dqk_wy_lab.log 2>&1; echo "lab rc=$? $(el) s"; cat $OUT/dqk_wy_lab.md
echo "end $(el) s"
