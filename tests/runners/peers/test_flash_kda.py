"""`backend: flash_kda`: the reason a point stores when the installed FlashKDA wheel's extension was compiled against
another torch ABI than the installed one (`abi_refusal`), and the order of its skip reasons, decided without importing
FlashKDA.
"""

from __future__ import annotations

import sys

import pytest

from runners.peers import peer_skip_reason
from runners.peers.flash_kda import FLASH_KDA, abi_refusal, installed_abi_refusal
from tests.runners.peers.conftest import peer_point

WHEEL = "0.0.1.post20260901"


@pytest.mark.parametrize("torch_version", ["2.10.0", "2.11.0+cu130", "2.12.1+cpu"])
def test_the_wheel_built_against_torch_2_13_is_refused_under_an_older_torch(torch_version: str) -> None:
    why = abi_refusal(WHEEL, torch_version)
    assert why is not None
    assert f"tokenspeed-flashkda {WHEEL} was compiled against torch >= 2.13" in why
    assert f"torch {torch_version} lays TensorImpl out 8 bytes later" in why
    assert "'all tensors must be on CUDA' (csrc/flash_kda.cpp:44)" in why


@pytest.mark.parametrize(
    ("wheel", "torch_version"),
    [(WHEEL, "2.13.0"), (WHEEL, "2.14.1+cu130"), (WHEEL, "3.0.0"), ("0.0.2", "2.11.0"), (None, "2.11.0")],
)
def test_a_matching_torch_or_an_unknown_wheel_is_not_refused(wheel: str | None, torch_version: str) -> None:
    assert abi_refusal(wheel, torch_version) is None


def test_the_skip_reasons_come_in_order_without_importing_flash_kda() -> None:
    def reason(**kw: object) -> str:
        return str(peer_skip_reason(FLASH_KDA, peer_point("flash_kda", **{"op": "kda", "H": 16, **kw})))

    assert "FlashKDA implements KDA only" in reason(op="gdn")
    assert "FlashKDA is inference only" in reason(direction="fwd+bwd")
    assert "requires bfloat16" in reason(dtype="float32")
    # no FlashKDA wheel is installed here (or one whose ABI matches torch): the engine's refusal is the point's reason
    assert installed_abi_refusal() is None
    assert "computes the safe gate" in reason()
    assert "flash_kda" not in sys.modules
