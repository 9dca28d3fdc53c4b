"""Rank 0 in this process, ranks 1..n-1 spawned: the layout `LLM(..., tensor_parallel=n)` uses.

    group = WorkerGroup.start(n, backend="nccl", timeout_s=120, target=fn, args=(...))
    ctx = group.ctx                           # rank 0's RankContext (this process joined the group)
    ex = TPExecutor(local, ctx.control, health=group.failure)   # calls fail fast once a rank died
    ...
    group.close(ex)                           # workers leave their loops; groups destroyed; joined

Each worker runs target(ctx, *args) (launch.py's rank main: its traceback is reported, its exit
code is non-zero on error). A watchdog thread here polls the workers: when one raises or dies,
`failure()` returns a message naming it (logged at ERROR once), and the driver raises RankError
on its next call. A collective already waiting on the dead rank ends with the process group's
timeout (gloo: at once, the peer's socket closes; NCCL: `timeout_s`, then torch's NCCL error
handling ends this process with its error), never a hang.
"""
from __future__ import annotations

import logging
import queue as queue_mod
import threading
import time

import torch
import torch.distributed as dist

from graphrt.parallel.launch import (RankContext, RankError, checked_in, free_port, join_group, open_store,
                                     rank_main, stop_processes)
from graphrt.parallel.spawn import start_detached_from_main

log = logging.getLogger("graphrt.parallel")


def _join_watching(procs, results, world_size, port, backend, timeout_s) -> RankContext:
    """join_group as rank 0 while watching the workers: one that raises or dies before the group
    forms is reported at once (RankError with its traceback), not after the store's timeout.
    The process group is only created once every worker has checked in on the store, so a
    worker lost before that leaves nothing of torch.distributed behind in this process."""
    store = open_store(0, world_size, port, timeout_s)
    deadline = time.monotonic() + timeout_s
    while not checked_in(store, world_size):
        _raise_if_failed(procs, results)
        if time.monotonic() > deadline:
            raise RankError(f"tensor parallel: the workers did not check in within the group's "
                            f"timeout ({timeout_s} s)")
        time.sleep(0.05)
    box: dict = {}

    def join():
        try:
            box["ctx"] = join_group(0, world_size, port, backend, timeout_s, store=store)
        except BaseException as e:          # handed to the caller below
            box["error"] = e

    joiner = threading.Thread(target=join, name="graphrt-tp-join", daemon=True)
    joiner.start()
    while True:
        joiner.join(0.1)
        if not joiner.is_alive():
            if "error" in box:
                raise box["error"]
            return box["ctx"]
        _raise_if_failed(procs, results)


def _raise_if_failed(procs, results) -> None:
    """RankError naming a worker that reported an error or exited while the group was forming."""
    try:
        rank, status, payload = results.get_nowait()
        if status == "error":
            raise RankError(f"tensor parallel: rank {rank} failed while starting:\n{payload}")
    except queue_mod.Empty:
        pass
    for r, p in enumerate(procs, start=1):
        if p.exitcode not in (None, 0):
            raise RankError(f"tensor parallel: rank {r} died while starting (exit code "
                            f"{p.exitcode}) before joining the process group")


class WorkerGroup:
    def __init__(self, ctx: RankContext, procs, results):
        self.ctx, self.procs, self._results = ctx, procs, results
        self._failure: str | None = None
        self._closed = threading.Event()
        self._watchdog = threading.Thread(target=self._watch, name="graphrt-tp-watchdog", daemon=True)
        self._watchdog.start()

    @classmethod
    def start(cls, world_size: int, *, backend: str, timeout_s: float, target, args: tuple = ()):
        """Spawn ranks 1..world_size-1 running target(ctx, *args), join the group as rank 0."""
        if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 2:
            raise ValueError(f"tensor_parallel: a worker group needs >= 2 ranks, got {world_size!r}")
        if backend == "nccl" and torch.cuda.device_count() < world_size:
            raise ValueError(f"tensor_parallel: {world_size} ranks need {world_size} GPUs, "
                             f"{torch.cuda.device_count()} visible")
        if dist.is_initialized():
            raise RuntimeError("tensor_parallel: this process already has a torch.distributed "
                               "default process group; graphrt's tensor parallelism creates its own")
        mp = torch.multiprocessing.get_context("spawn")
        results, port = mp.Queue(), free_port()
        procs = [mp.Process(target=rank_main, daemon=True, name=f"graphrt-tp-rank{r}",
                            args=(r, world_size, port, backend, timeout_s, target, args, results))
                 for r in range(1, world_size)]
        start_detached_from_main(procs)     # the caller's script is not re-run in the workers
        try:
            ctx = _join_watching(procs, results, world_size, port, backend, timeout_s)
        except BaseException:
            stop_processes(procs)
            raise
        return cls(ctx, procs, results)

    def failure(self) -> str | None:
        """None while every worker runs; else a message naming the rank that failed or died."""
        return self._failure

    def _fail(self, message: str) -> None:
        if self._failure is None:
            self._failure = message
            log.error("%s", message)

    def _watch(self) -> None:
        while not self._closed.wait(0.2):
            try:
                rank, status, payload = self._results.get_nowait()
                if status == "error":
                    self._fail(f"tensor parallel: rank {rank} failed:\n{payload}")
            except queue_mod.Empty:
                pass
            for r, p in enumerate(self.procs, start=1):
                if p.exitcode not in (None, 0):
                    self._fail(f"tensor parallel: rank {r} died (exit code {p.exitcode}); "
                               f"this engine cannot continue")

    def close(self, driver=None, *, grace_s: float = 10.0) -> None:
        """End the workers: the driver's shutdown (if the group is healthy), the control barrier
        the workers wait in, the process group destroyed (in a thread: it may hang), workers
        joined, stragglers killed. Idempotent."""
        if self._closed.is_set():
            return
        healthy = self._failure is None
        self._closed.set()
        if healthy and driver is not None:
            try:
                driver.shutdown()
                dist.barrier(group=self.ctx.control)
            except RuntimeError as e:
                log.warning("tensor parallel: shutdown: %s", e)
        ender = threading.Thread(target=dist.destroy_process_group, daemon=True)
        ender.start()
        ender.join(grace_s)
        for p in self.procs:
            p.join(grace_s)
        stop_processes(self.procs)
        self._results.close()
