"""What FLA's dispatch ran, read from FLA 0.6.0's real backend registry on a CPU: a call a registered backend takes is
recorded under its name, one that every backend declines goes to FLA's Triton function (it reaches Triton's launcher,
which has no driver here) and is recorded as `triton` with the decliners' reasons; the pin holds FLA on Triton even with
a backend that would take the call, and lets go afterwards. FLA's own FlashQLA backend, made available, declines a CPU
call in its own words.
"""

from __future__ import annotations

import traceback
from typing import Any

import pytest
import torch

import kernels
from runners.peers.fla_registry import DispatchRecord, pin_note, pinned_to_triton, recording
from tests.runners.peers.conftest import STAND_IN

FN = "chunk_gated_delta_rule"


def _inputs(K: int, T: int = 32) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    q = torch.randn(1, T, 2, K, generator=g)
    k = torch.nn.functional.normalize(torch.randn(1, T, 2, K, generator=g), dim=-1)
    v = torch.randn(1, T, 2, K, generator=g)
    return [q, k, v, -torch.rand(1, T, 2, generator=g), torch.rand(1, T, 2, generator=g)]


def _fla_op() -> Any:
    from fla.ops.gated_delta_rule import chunk_gated_delta_rule

    return chunk_gated_delta_rule


def _reaches_triton(call: Any) -> bool:
    """The call fails inside Triton's launcher (FLA's own Triton function ran; a CPU has no Triton driver)."""
    try:
        call()
    except RuntimeError as err:
        frames = [f.filename for f in traceback.extract_tb(err.__traceback__)]
        return "active drivers" in str(err) and any("/triton/" in f for f in frames)
    return False


def test_a_backend_that_takes_the_call_is_recorded(fla_stand_in: Any) -> None:
    xs = _inputs(16)
    record = DispatchRecord()
    with recording(record):
        o, _ = _fla_op()(*xs)
    assert record.calls == {FN: STAND_IN} and record.as_dict("gdn")["op"] == STAND_IN
    ref = kernels.reference("gdn", *xs)[0]
    assert torch.allclose(o, ref)
    assert "get_implementation" not in vars(fla_stand_in._backends[STAND_IN])  # unwrapped after


def test_a_declined_call_runs_fla_triton_and_says_why(fla_stand_in: Any) -> None:
    record = DispatchRecord()
    with recording(record):
        assert _reaches_triton(lambda: _fla_op()(*_inputs(8)))
    got = record.as_dict("gdn")
    assert got["op"] == "triton" and got["calls"] == {}
    assert got["declined"] == {STAND_IN: "the stand-in takes K=16 only, got 8"}


def test_the_pin_holds_fla_on_triton_then_lets_go(fla_stand_in: Any) -> None:
    record = DispatchRecord()
    with pinned_to_triton(), recording(record):
        assert _reaches_triton(lambda: _fla_op()(*_inputs(16)))
    assert record.as_dict("gdn") == {"op": "triton", "calls": {}}
    assert STAND_IN in fla_stand_in._backends  # restored
    after = DispatchRecord()
    with recording(after):
        _fla_op()(*_inputs(16))
    assert after.ran(FN) == STAND_IN
    assert "registries emptied" in pin_note()  # FLA was imported here without FLA_DISABLE_BACKEND_DISPATCH=1


def test_the_pin_keeps_fla_own_intra_card_cp(fla_stand_in: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """FLA's intra-card CP (`backend: fla`'s warmup_correct) is one of its dispatch backends: under the pin it still
    takes its call (FLA_INTRACARD_CP=1, inference mode, varlen), recorded before its kernels refuse the CPU."""
    from fla.ops.common.chunk_delta_h import chunk_gated_delta_rule_fwd_h

    monkeypatch.setenv("FLA_INTRACARD_CP", "1")
    k, w, u = (torch.randn(1, 128, 2, 16) for _ in range(3))
    record = DispatchRecord()
    refused = pytest.raises(RuntimeError, match="require NVIDIA Ampere or newer")  # its kernels, past the dispatch
    with pinned_to_triton(), recording(record), torch.inference_mode(), refused:
        chunk_gated_delta_rule_fwd_h(k, w, u, g=-torch.rand(1, 128, 2), cu_seqlens=torch.tensor([0, 64, 128]))
    assert record.calls == {"chunk_gated_delta_rule_fwd_h": "intracard_cp"}
    assert STAND_IN in fla_stand_in._backends  # the pin lifted


def test_fla_flashqla_backend_declines_a_cpu_call_in_its_own_words(monkeypatch: pytest.MonkeyPatch) -> None:
    from fla.ops.gated_delta_rule.backends.flash_qla import FlashQLABackend

    monkeypatch.setattr(FlashQLABackend, "is_available", classmethod(lambda cls: True))  # as if flash-qla were installed
    record = DispatchRecord()
    with recording(record):
        assert _reaches_triton(lambda: _fla_op()(*_inputs(16)))
    assert record.ran(FN) == "triton"
    assert record.declined[FN]["flash_qla"] == "FlashQLA requires NVIDIA SM90, SM100/SM103 or SM120"


def test_the_config_cache_note_says_what_fla_reads_its_configs_from(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """None while FLA autotunes on its own; with FLA_CONFIG_DIR and FLA_CACHE_MODE=strict (FLA reads the mode when it
    is imported: set here on FLA's module) the directory, the mode and the kernel files, which FLA's own lookup reads."""
    import json

    from fla.ops.utils import cache

    from runners.peers.fla_autotune import cache_file
    from runners.peers.fla_registry import config_cache_note

    monkeypatch.setattr(cache, "FLA_CACHE_MODE", cache.FlaCacheMode.DISABLED)
    assert config_cache_note() is None
    key = (16, 16, 128, 64, "torch.bfloat16")
    config = {"kwargs": {"BK": 64}, "num_warps": 4, "num_stages": 3, "num_ctas": 1, "maxnreg": None}
    entry = cache_file("chunk_fwd_kernel_o", [(key, config, 0.1)], triton_version="3.6.0", default_config=config)
    (tmp_path / "chunk_fwd_kernel_o.json").write_text(json.dumps(entry))
    monkeypatch.setenv("FLA_CONFIG_DIR", str(tmp_path))
    monkeypatch.setattr(cache, "FLA_CACHE_MODE", cache.FlaCacheMode.STRICT)
    assert config_cache_note() == {"mode": "strict", "dir": str(tmp_path), "kernels": 1}
    assert cache.load_cached_config("chunk_fwd_kernel_o", cache.AutotuneKey(autotune_key=key)) == config
