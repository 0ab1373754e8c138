"""`cpbench status` while a worker pays a peer's first call: a rank's notice (`runners.activity.notice`, the file the
worker hands its gangs) goes onto the worker's row as its heartbeat carries it (`db.crud.set_worker_activity`), and
the workers table shows "busy: compiling FlashQLA kernels, 95 s"; when the call is over the notice is gone.
"""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest

from runners.activity import ACTIVITY_ENV, notice, read_notice
from tests.runners.engine_fixtures import store_url  # noqa: F401
from tests.utils.cli import cpbench as _cli


def _worker_line(out: str) -> str:
    return next(line for line in out.splitlines() if "gpu-box" in line)


def test_status_shows_a_first_call_being_compiled(
    store_url: str,  # noqa: F811
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from db import crud
    from db.session import session_scope

    monkeypatch.setenv("COLUMNS", "200")
    with session_scope(store_url) as s:
        crud.register_worker(
            s, name="gpu-box:1:abcd", host="gpu-box", pid=1, devices={"kind": "cuda", "count": 1}, environment_id=None
        )
        crud.touch_worker(s, name="gpu-box:1:abcd", status="busy", current_point_id=None)
    path = tmp_path / "activity.json"
    monkeypatch.setenv(ACTIVITY_ENV, str(path))
    with notice("compiling FlashQLA kernels"):
        seen = read_notice(path)  # what the worker's heartbeat reads
        assert seen is not None and seen["what"] == "compiling FlashQLA kernels"
        seen["since"] -= 95.0  # as if the call had begun 95 s ago
        with session_scope(store_url) as s:
            crud.set_worker_activity(s, name="gpu-box:1:abcd", activity=seen)
        t0 = time.monotonic()
        code, out, err = _cli("status", "--db", store_url)
        assert code == 0, err
        shown = re.search(r"busy: compiling FlashQLA kernels, (\d+) s", _worker_line(out))
        assert shown is not None, out
        assert 95 <= int(shown.group(1)) <= 96 + (time.monotonic() - t0), out
    assert read_notice(path) is None and not path.exists()  # the call returned: no notice
    with session_scope(store_url) as s:
        crud.set_worker_activity(s, name="gpu-box:1:abcd", activity=None)
        devices = next(w.devices for w in crud.list_workers(s) if w.name == "gpu-box:1:abcd")
    assert devices == {"kind": "cuda", "count": 1}
    code, out, _ = _cli("status", "--db", store_url)
    assert "compiling" not in out and "busy" in _worker_line(out)
