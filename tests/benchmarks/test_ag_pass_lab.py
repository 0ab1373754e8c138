"""`benchmarks/ag_pass_lab.py` on any machine: its --builds names parse to the TileLang kernel's knobs and lab
switches, its --kda-builds names to KDA's pass's switches (an unknown one, or an unknown --modes, is refused in one
line, by the kernels' builds too), and its floors grow by the bytes each sum reads (v for the forward's, q for the
backward's: 256 B a token-head each, as much as k)."""

from __future__ import annotations

import pytest

from tests.utils.scripts import load_script

lab = load_script("ag_pass_lab")


def test_build_names_parse_to_the_kernels_knobs() -> None:
    none: frozenset[str] = frozenset()
    assert lab._build_knobs("free") == (0, False, none)
    assert lab._build_knobs("b4") == (4, False, none)
    assert lab._build_knobs("q") == (0, True, none)
    assert lab._build_knobs("b4+q") == (4, True, none)
    assert lab._build_knobs("free+no_subst+no_store") == (0, False, frozenset({"no_subst", "no_store"}))
    assert lab._kda_lab("free") == none and lab._kda_lab("no_keys+no_products") == {"no_keys", "no_products"}
    assert lab._kda_lab("bound") == none  # (session 31) the build with the bound sums: no switch
    with pytest.raises(ValueError, match="unknown build 'fast'"):
        lab._build_knobs("fast")
    with pytest.raises(ValueError, match="unknown build 'no_keys'"):  # KDA's switch, not GDN's
        lab._build_knobs("no_keys")
    with pytest.raises(ValueError, match="unknown build 'no_gram'"):
        lab._kda_lab("no_gram")
    for argv in (["--builds", "free,fast"], ["--kda-builds", "free,no_gram"], ["--modes", "ag,bnd"]):
        with pytest.raises(SystemExit):
            lab.main(argv)


def test_the_kernels_refuse_unknown_switches_in_one_line() -> None:
    from kernels.ops.gdn import ag_hopper, tilelang_hopper
    from kernels.ops.kda import ag_hopper as kda_ag_hopper

    assert set(ag_hopper.AG_LAB_SWITCHES) >= ag_hopper.SOLVE_LAB_SWITCHES
    assert set(kda_ag_hopper.KDA_AG_LAB_SWITCHES) >= ag_hopper.SOLVE_LAB_SWITCHES
    with pytest.raises(ValueError, match=r"^unknown lab switches \['no_keys'\]; known: \['no_exp', 'no_gate', 'no_gram', "):
        tilelang_hopper.check_lab(frozenset({"no_keys", "no_subst"}), ag_hopper.AG_LAB_SWITCHES)
    tilelang_hopper.check_lab(frozenset({"no_keys", "no_subst"}), kda_ag_hopper.KDA_AG_LAB_SWITCHES)


def test_each_sum_adds_its_inputs_bytes() -> None:
    B, T, H = 1, 65536, 16
    ag, bnd, rev = (lab._floor_ms(B, T, H, H, m) for m in ("ag", "ag+bnd", "ag+bnd+rev"))
    k_ms = B * T * H * 256 / (lab.COPY_TBS * 1e12) * 1e3  # one [B, T, H, 128] bf16 read
    assert ag > k_ms  # k, and Ag's write besides
    assert bnd - ag == pytest.approx(k_ms, rel=0.01)  # v (and 8 B a chunk)
    assert rev - bnd == pytest.approx(k_ms, rel=0.03)  # q (and p, 8 B a chunk)
    assert lab._floor_ms(B, T, H, 2 * H, "ag") > ag  # grouped heads: Ag per value head
