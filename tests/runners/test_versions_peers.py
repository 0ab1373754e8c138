"""The environment record names the peer packages a sweep measured (FLA, FlashQLA, TileLang, FlashKDA; None when
absent), read from their package metadata without importing them."""

from __future__ import annotations

import importlib.metadata
import sys
from pathlib import Path

import pytest

from runners.versions import peer_versions
from runners.worker import DeviceInfo, environment_facts


def _dist(site: Path, name: str, version: str) -> None:
    info = site / f"{name.replace('-', '_')}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")


def test_versions_of_the_installed_peers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    before = peer_versions()
    assert before["fla"] == importlib.metadata.version("fla-core")  # the venv's fla-core
    assert before["flash_qla"] is None and before["flash_kda"] is None
    _dist(tmp_path, "flash-qla", "0.1.3")
    _dist(tmp_path, "tilelang", "0.1.15")
    _dist(tmp_path, "tokenspeed-flashkda", "0.0.1.post20260901")
    monkeypatch.syspath_prepend(str(tmp_path))
    got = peer_versions()
    assert got == {"fla": before["fla"], "flash_qla": "0.1.3", "tilelang": "0.1.15", "flash_kda": "0.0.1.post20260901"}
    assert "flash_qla" not in sys.modules and "tilelang" not in sys.modules
    facts = environment_facts(DeviceInfo(kind="cpu", count=1, names=("x86_64",)))
    assert {k: facts[k] for k in got} == got
