"""A stand-in kernel module for `benchmarks.tilelang_builds`' test: its `_build` records its arguments and process, and
returns a kernel whose generated source names them."""

from __future__ import annotations

import os
from pathlib import Path


class _Kernel:
    def __init__(self, source: str) -> None:
        self.source = source

    def get_kernel_source(self) -> str:
        return self.source


def _build(out: str, name: str) -> _Kernel:
    Path(out, name).write_text(str(os.getpid()))
    return _Kernel(f"// {name} built in {os.getpid()}")
