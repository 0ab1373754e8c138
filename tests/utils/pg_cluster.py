"""A PostgreSQL cluster of a test's own, which the test may stop and start (fault injection), unlike the shared
server of `tests.utils.postgres`. Needs the server binaries (/usr/lib/postgresql/*/bin); as root it runs them as
the `postgres` user, like `./dev`. Missing binaries skip the test, except under CI, where they fail it.
"""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import socket
import subprocess
import tempfile
from pathlib import Path

from tests.utils.postgres import missing_postgres

__all__ = ["ScratchCluster"]


def _bin_dir() -> Path:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"), key=lambda p: [int(x) if x.isdigit() else x for x in p.split("/")])
    if not found:
        missing_postgres("no PostgreSQL server binaries", "`./dev test` installs them")
    return Path(found[-1]).parent


class ScratchCluster:
    """initdb + start on a free loopback port; `stop()` / `start()` at will; `destroy()` removes everything."""

    def __init__(self) -> None:
        self.bin = _bin_dir()
        self.root = Path(tempfile.mkdtemp(prefix="cpbench-pg-"))
        self.as_user: list[str] = []
        if os.getuid() == 0:
            shutil.chown(self.root, "postgres", "postgres")
            self.as_user = ["runuser", "-u", "postgres", "--"]
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.data = self.root / "data"
        self._run("initdb", "-D", str(self.data), "-U", "postgres", "--auth=trust", "-E", "UTF8", "--locale=C.UTF-8", "-N")
        self.start()
        self.url = f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/postgres"

    def _run(self, tool: str, *args: str) -> None:
        subprocess.run([*self.as_user, str(self.bin / tool), *args], check=True, capture_output=True, timeout=120)

    def start(self) -> None:
        opts = (f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 -c fsync=off -c synchronous_commit=off "
                "-c full_page_writes=off")
        self._run("pg_ctl", "-D", str(self.data), "-l", str(self.root / "server.log"), "-w", "-t", "60", "-o", opts, "start")

    def stop(self, mode: str = "fast") -> None:
        self._run("pg_ctl", "-D", str(self.data), "-m", mode, "-w", "stop")

    def destroy(self) -> None:
        with contextlib.suppress(subprocess.CalledProcessError):
            self.stop("immediate")
        shutil.rmtree(self.root, ignore_errors=True)
