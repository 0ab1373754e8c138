"""The GPU benchmarks of the kernel suite (not tests): `cpbench bench kernels|cp` runs them.

- `runners.bench.kernels`: our Triton forward against FLA's and the bandwidth / compute floor, one GPU
  (`kernels_ops`: what it times and how; `kernels_report`: its Markdown table);
- `runners.bench.cp`: every CP scheme over W GPUs against FLA's CP, and warmup_correct on one GPU;
- `runners.bench.kernels_train`: our Triton forward+backward against FLA's (`cpbench bench train`);
- `runners.bench.common`: what both share (result file names, the environment block of a result).

They are engine code: inputs come from `runners.workload` (or FLA's anchor recipe where the figures are compared
with FLA's published ones), errors from `runners.correctness.rel_l2`, CP steps are timed by `runners.timing`,
counted by `runners.profile` and run on a `runners.gang.Gang`; versions, driver and git sha from
`runners.versions`. `benchmarks/` keeps the committed results and device-only lab scripts.
"""
