"""A peer whose first call in a process takes a while and says so, as FlashQLA's TileLang JIT does: the first forward
announces "compiling stand-in kernels" (`runners.activity.notice`) and sleeps `CPBENCH_TEST_COMPILE_S` seconds (default
3) before the per-token torch recurrence of `tests.plugins.torch_peer`; later calls do not."""

from __future__ import annotations

import os
import time
from typing import Any

from torch import Tensor

from runners.activity import notice
from tests.plugins.torch_peer import TorchPeer


class CompilingPeer(TorchPeer):
    name = "compiling"
    modes = {"none": ("fwd",)}
    first_call_s = 60.0

    def __init__(self) -> None:
        self.compiled = False

    def forward(self, mode: str, op: str, *inputs: Tensor, **call: Any) -> Tensor:
        if not self.compiled:
            with notice("compiling stand-in kernels"):
                time.sleep(float(os.environ.get("CPBENCH_TEST_COMPILE_S", "3")))
            self.compiled = True
        return super().forward(mode, op, *inputs, **call)


PEER = CompilingPeer()
