"""The measurement engine: sweep specs and grids, workloads, correctness gate, timing, profiling, rank gangs,
the worker that drains the queue, autotuning, regression verdicts and the `cpbench` command line."""
