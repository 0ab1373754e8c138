"""A persistent gloo world for tests: W rank processes spawned ONCE, fed cases through queues.

Spawning a world costs seconds here (anchors/cpu-feasibility.md §2), so each session starts one gang per
world size and sends it many cases: `gang.run("fn_name", **kwargs)` calls `cp_cases.fn_name(rank=..,
world_size=.., **kwargs)` on every rank and returns the per-rank results (tensors travel as numpy arrays).
Rendezvous is a file:// store in a temp dir (no ports; safe under pytest-xdist); every wait is bounded
(60 s). A rank that fails returns its traceback; a gang that times out is killed and respawned on next use.
Shutdown follows the profiler+gloo rule of §3: barrier, destroy_process_group, os._exit(0).
"""

from __future__ import annotations

import datetime
import os
import queue
import tempfile
import traceback
from typing import Any

import torch.multiprocessing as mp

TIMEOUT_S = 60.0


def _to_host(x: Any) -> Any:
    import torch

    if isinstance(x, torch.Tensor):
        return ("__tensor__", x.detach().cpu().contiguous().numpy())
    if isinstance(x, dict):
        return {k: _to_host(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return type(x)(_to_host(v) for v in x)
    return x


def _from_host(x: Any) -> Any:
    import torch

    if isinstance(x, tuple) and len(x) == 2 and x[0] == "__tensor__":
        return torch.from_numpy(x[1])
    if isinstance(x, dict):
        return {k: _from_host(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return type(x)(_from_host(v) for v in x)
    return x


def _rank_main(rank: int, world_size: int, init_file: str, tasks: Any, results: Any) -> None:
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world_size,
                            timeout=datetime.timedelta(seconds=TIMEOUT_S))
    import cp_cases

    while True:
        task = tasks.get()
        if task is None:
            break
        seq, name, kwargs = task
        try:
            out = getattr(cp_cases, name)(rank=rank, world_size=world_size, **kwargs)
            results.put((rank, seq, True, _to_host(out)))
        except BaseException:  # noqa: BLE001 - the traceback goes back to the test
            results.put((rank, seq, False, traceback.format_exc()))
    try:
        dist.barrier()
        dist.destroy_process_group()
    finally:
        os._exit(0)


class Gang:
    """W gloo ranks serving test cases (see the module docstring)."""

    def __init__(self, world_size: int) -> None:
        self.world_size = world_size
        self._procs: list[Any] = []
        self._seq = 0

    def _start(self) -> None:
        ctx = mp.get_context("spawn")
        self._dir = tempfile.TemporaryDirectory(prefix=f"cpgang{self.world_size}-")
        init_file = os.path.join(self._dir.name, "rdzv")
        self._tasks = [ctx.Queue() for _ in range(self.world_size)]
        self._results = ctx.Queue()
        self._procs = [ctx.Process(target=_rank_main, args=(r, self.world_size, init_file, self._tasks[r], self._results),
                                   daemon=True) for r in range(self.world_size)]
        for p in self._procs:
            p.start()

    def run(self, name: str, timeout: float = TIMEOUT_S, **kwargs: Any) -> list[Any]:
        """Run `cp_cases.<name>` on every rank; returns the results in rank order (raises on any failure)."""
        if not self._procs or not all(p.is_alive() for p in self._procs):
            self.close()
            self._start()
        self._seq += 1
        for q in self._tasks:
            q.put((self._seq, name, kwargs))
        got: dict[int, Any] = {}
        errors: list[str] = []
        while len(got) + len(errors) < self.world_size:
            try:
                rank, seq, ok, payload = self._results.get(timeout=timeout)
            except queue.Empty:
                self.kill()
                raise TimeoutError(f"gang W={self.world_size}: {name} gave no result within {timeout} s") from None
            if seq != self._seq:
                continue
            if ok:
                got[rank] = _from_host(payload)
            else:
                errors.append(f"rank {rank}:\n{payload}")
        if errors:
            raise AssertionError(f"gang W={self.world_size}: {name} failed\n" + "\n".join(errors))
        return [got[r] for r in range(self.world_size)]

    def kill(self) -> None:
        for p in self._procs:
            if p.is_alive():
                p.kill()
        for p in self._procs:
            p.join(timeout=5)
        self._procs = []

    def close(self) -> None:
        if not self._procs:
            return
        for q in self._tasks:
            q.put(None)
        for p in self._procs:
            p.join(timeout=TIMEOUT_S)
        self.kill()
        self._dir.cleanup()
