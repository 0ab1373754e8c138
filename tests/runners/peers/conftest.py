"""Shared by the peer tests: a point and its run options; a backend registered in FLA's real registry through FLA's own `register`, so its dispatch has something to pick on a
CPU (where FLA's Triton kernels cannot launch and FlashQLA is not installed): `cpu_stand_in` takes GDN calls with
K = 16 (the fp32 per-token reference) and declines any other with a reason."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

STAND_IN = "cpu_stand_in"
# a point's timing, check and profile options for in-process runs (`runners.execute.run_point_job`)
OPTIONS = {
    "timing": {"min_samples": 2, "max_samples": 2, "min_time_s": 0.0, "timeout_s": 1.0, "warmup_s": 0.0, "flush_l2": False},
    "check": {"reference_tokens": 48},
    "profile": False,
}


def peer_point(backend: str, **kw: Any) -> Any:
    """A GDN `none` fwd point of `backend` (B=1, T=256, H=2, K=V=128, bf16), with `kw` changed."""
    from runners.point import PointSpec

    base = {
        "op": "gdn",
        "mode": "none",
        "backend": backend,
        "B": 1,
        "T": 256,
        "H": 2,
        "K": 128,
        "V": 128,
        "lb": -1.0,
        "W": 1,
        "layout": "contiguous",
        "direction": "fwd",
        "dtype": "bfloat16",
        "seed": 0,
        "rep": 0,
    }
    return PointSpec.from_json({**base, **kw})


@pytest.fixture
def fla_stand_in() -> Iterator[Any]:
    import fla.backends as fb
    import fla.ops.gated_delta_rule  # noqa: F401 - builds the registry of 'gated_delta_rule'

    import kernels

    class CPUStandIn(fb.BaseBackend):
        backend_type = STAND_IN
        priority = 1

        def chunk_gated_delta_rule_verifier(self, q: Any, k: Any, v: Any, g: Any, beta: Any, **kw: Any) -> Any:
            if q.shape[-1] != 16:
                return False, f"the stand-in takes K=16 only, got {q.shape[-1]}"
            return True, None

        def chunk_gated_delta_rule(
            self, q: Any, k: Any, v: Any, g: Any, beta: Any, scale: Any = None, cu_seqlens: Any = None, **kw: Any
        ) -> Any:
            return kernels.reference("gdn", q, k, v, g, beta, scale=scale, cu_seqlens=cu_seqlens)[0], None

    fb.register("gated_delta_rule")(CPUStandIn)
    registry = fb._operation_registries["gated_delta_rule"]
    yield registry
    registry._backends.pop(STAND_IN, None)
