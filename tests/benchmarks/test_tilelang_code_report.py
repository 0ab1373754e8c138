"""`benchmarks/tilelang_code_report.py`: its nested-load finder on generated-CUDA shapes taken from K2's source before
and after session 34's rewrite (the nested select found with its buffer and line; the merged load, a thread guard
and a nested store not), its registry's builds against the kernels' own `_build` signatures, and its table. The
compile itself needs tilelang and nvcc, which CI does not install."""

from __future__ import annotations

import importlib
import inspect

import pytest

from benchmarks.tilelang_code_report import BUILDS, main, nested_loads, to_markdown

# K2's gate load before the rewrite (`T.if_then_else(r < n, T.cast(g[..], fp32), 0.0)`), indices shortened
NESTED = """\
    for (int vec_s = 0; vec_s < 4; ++vec_s) {
      float condval_4;
      if ((((i_3 * 8) + (((int)threadIdx.x) >> 5)) < n)) {
        bfloat16_t condval_5;
        if (((0 <= (((i_3 * 8) + (((int)threadIdx.x) >> 5)) + t0)) && ((t0 + 1) < (nchunk * 64)))) {
          condval_5 = g[((((int64_t)i_3) * (int64_t)16384) + ((int64_t)vec_s))];
        } else {
          condval_5 = bfloat16_t(0x0p+0f/*0.000000e+00*/);
        }
        condval_4 = ((float)condval_5);
      } else {
        condval_4 = 0x0p+0f/*0.000000e+00*/;
      }
"""
# after (`T.cast(T.if_then_else(r < n, g[..], 0), fp32)`): one merged condition
MERGED = """\
    for (int vec_s = 0; vec_s < 4; ++vec_s) {
      bfloat16_t condval_4;
      if ((((i_3 * 8) < n) && (0 <= (i_3 + t0))) && ((t0 + 1) < (nchunk * 64))) {
        condval_4 = g[((((int64_t)i_3) * (int64_t)16384) + ((int64_t)vec_s))];
      } else {
        condval_4 = bfloat16_t(0x0p+0f/*0.000000e+00*/);
      }
      float gv = ((float)condval_4);
"""
# a select whose value is computed, not loaded, inside a thread guard; and a store under two conditions
NOT_LOADS = """\
  if (((int)threadIdx.x) < 64) {
    float condval_3;
    if (((int)threadIdx.x) < n) {
      condval_3 = ((float*)b_s)[((int)threadIdx.x)] * 2.0f;
    }
  }
      if (63 < (n + r_2)) {
        if ((((t0 + 63) - r_2) < (nchunk * 64))) {
          float condval_30;
          if ((((int)((uchar*)fl_s)[8064]) == 1)) {
            condval_30 = 0x0p+0f/*0.000000e+00*/;
"""
# a vectorised nested load (`*(uint4*)(tt + ..)`)
NESTED_VEC = """\
    uint4 condval_1;
    if ((r < n)) {
      uint4 condval_2;
      if ((0 <= t0)) {
        condval_2 = *(uint4*)(tt + (((int64_t)t0) * (int64_t)1024));
      }
"""


def test_the_nested_select_is_found_with_its_buffer_and_line() -> None:
    assert nested_loads(NESTED) == [(6, "g")]
    assert nested_loads(NESTED * 2) == [(6, "g"), (19, "g")]
    assert nested_loads(NESTED_VEC) == [(5, "tt")]


def test_merged_loads_guards_and_stores_are_not_nested_loads() -> None:
    assert nested_loads(MERGED) == []
    assert nested_loads(NOT_LOADS) == []
    assert nested_loads(MERGED + NESTED) == [(6 + MERGED.count("\n"), "g")]


@pytest.mark.parametrize("name", sorted(BUILDS))
def test_each_build_binds_to_its_kernels_build_signature(name: str) -> None:
    module, args = BUILDS[name]
    build = importlib.import_module(module)._build
    bound = inspect.signature(build.__wrapped__).bind(*args)  # (functools.cache keeps the function)
    assert bound.arguments  # a wrong count or name raised above


def test_table_names_each_builds_nested_buffers() -> None:
    rows = [{"build": "k2", "module": "kernels.ops.kda.bwd_products_hopper", "nested": [(6, "g"), (9, "dqg"), (12, "g")],
             "regs": 166, "spill_stores": 0, "spill_loads": 0, "branches": 244},
            {"build": "k1", "module": "kernels.ops.kda.state_grads_hopper", "nested": [], "regs": 179, "spill_stores": 0,
             "spill_loads": 0, "branches": 3}]  # fmt: skip
    lines = to_markdown(rows).splitlines()
    assert lines[2] == "| k2 | `kernels.ops.kda.bwd_products_hopper` | 3 (dqg, g) | 166 | 0 / 0 | 244 |"
    assert lines[3] == "| k1 | `kernels.ops.kda.state_grads_hopper` | 0 | 179 | 0 / 0 | 3 |"


def test_an_unknown_build_is_refused_in_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as err:
        main(["--builds", "k2,nope"])
    assert err.value.code == 2
    assert "unknown ['nope']" in capsys.readouterr().err
