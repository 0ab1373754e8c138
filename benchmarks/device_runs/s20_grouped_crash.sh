#!/bin/bash
# Session 20 (issue 26): where does tests/kernels/test_dispatch_grouped.py's KDA case hit an illegal memory access on
# the H200 (call 2, git 25f59e1: `test_grouped_heads_forward_and_backward[dense-HV=2H-kda]`, K = V = 16)? The case with
# CUDA_LAUNCH_BLOCKING=1 (the failing launch raises at its own call), here and in an older tree (devrun/old.tar, as
# s16c.sh's OLDTEST) to tell a regression from an old fault. Run by s16c.sh's LAB:
#   LAB='bash benchmarks/device_runs/s20_grouped_crash.sh' bash benchmarks/device_runs/s16c.sh
CASE="tests/kernels/test_dispatch_grouped.py::test_grouped_heads_forward_and_backward[dense-HV=2H-kda]"
echo "== this tree"
CUDA_LAUNCH_BLOCKING=1 CPBENCH_TEST_GPU=1 timeout 60 python3 -m pytest -q -x -p no:cacheprovider "$CASE" 2>&1 \
  | grep -E "^(E |FAILED|PASSED)|kernels/.*py:[0-9]+|passed|failed" | head -40
if [ -f devrun/old.tar ]; then
  echo "== old tree"
  rm -rf /tmp/old && mkdir -p /tmp/old && tar -xf devrun/old.tar -C /tmp/old
  (cd /tmp/old && PYTHONPATH=${PYTHONPATH//$PWD//tmp/old} CUDA_LAUNCH_BLOCKING=1 CPBENCH_TEST_GPU=1 timeout 60 python3 -m pytest \
    -q -x -p no:cacheprovider "$CASE" 2>&1 | grep -E "^(E |FAILED)|kernels/.*py:[0-9]+|passed|failed" | head -40)
fi
