"""The peers' columns of the kernel benchmarks (`runners.bench.kernels_peers`): `--peers` parsing, and the one line
that says why FlashQLA cannot run, from the real absent-import path (flash-qla is not installed in CI) and from the
adapter's own limits through the grid's rule."""

from __future__ import annotations

import importlib.util

import pytest

from runners.bench.kernels_peers import FLASH_QLA_COLUMNS, flash_qla_reason, parse_peers

absent = pytest.mark.skipif(importlib.util.find_spec("flash_qla") is not None, reason="flash-qla is installed here")


def test_parse_peers() -> None:
    assert parse_peers(None) == ("fla", "flash_qla")
    assert parse_peers(None, no_fla=True) == ("flash_qla",)  # --no-fla keeps working
    assert parse_peers("flash_qla,fla,fla") == ("flash_qla", "fla")
    assert parse_peers("none") == () == parse_peers("")
    with pytest.raises(ValueError) as err:
        parse_peers("fla,flashqla")
    assert str(err.value) == "--peers: unknown peer(s) flashqla; choose from fla, flash_qla (or none)"


@absent
def test_flash_qla_absent_is_one_line_reason_not_a_traceback() -> None:
    why = flash_qla_reason("gdn", H=16, HV=32, K=128, V=128)
    assert why == "flash_qla cannot be imported: ModuleNotFoundError: No module named 'flash_qla'"
    assert "\n" not in why


def test_flash_qla_columns_are_its_two_defaults() -> None:
    # auto_cp=False (mode none) and its intra-card CP (warmup_correct: what auto_cp=True, its default, runs)
    assert FLASH_QLA_COLUMNS == {"flash_qla": "none", "flash_qla_cp": "warmup_correct"}
