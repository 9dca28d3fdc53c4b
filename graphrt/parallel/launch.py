"""One process per rank, process groups with timeouts, and a watchdog: a dead rank never hangs a run.

    result = launch(fn, 2, args=(...,), backend="nccl", timeout_s=60)   # fn(ctx, *args) per rank

`launch` spawns `world_size` processes (torch.multiprocessing, start method "spawn"), each of
which joins a process group over TCP on 127.0.0.1 (a free port picked here) with
`init_process_group(timeout=...)`, builds its `RankContext` and calls `fn(ctx, *args)`; rank 0's
return value comes back (it must pickle). The calling process is the watchdog: when a rank raises
or dies (any exit code but 0, a signal included), every other rank is terminated (SIGTERM, then
SIGKILL) and `RankError` names the rank, its exit code and its traceback. `run_timeout_s` bounds
the whole run the same way. On success each rank destroys its groups; ranks that have not exited
`exit_grace_s` after reporting are killed (a known NCCL hang in destroy_process_group).

CUDA (backend "nccl"): rank r uses cuda:r, the model's collectives run on the NCCL world group
and `ctx.control` is a separate gloo group for host-side messages (driver.py).
"""
from __future__ import annotations

import os
import pickle
import queue as queue_mod
import socket
import time
import traceback
from dataclasses import dataclass
from datetime import timedelta

import torch

from graphrt.parallel.group import TensorParallel

RANK_TEARDOWN_S = 5.0  # a finished rank waits this long for destroy_process_group, then exits


class RankError(RuntimeError):
    """A rank raised, died or the run timed out; the message names the rank and why."""


@dataclass(frozen=True)
class RankContext:
    """What a rank's function gets. tp: the model's TensorParallel (its group: NCCL on CUDA,
    gloo on CPU); control: a gloo group for host messages; device: cuda:rank or cpu."""
    rank: int
    world_size: int
    device: torch.device
    tp: TensorParallel
    control: object


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def open_store(rank: int, world_size: int, port: int, timeout_s: float):
    """The run's TCPStore on 127.0.0.1:port: rank 0 serves it, the other ranks connect (retrying
    up to timeout_s)."""
    import torch.distributed as dist
    return dist.TCPStore("127.0.0.1", port, world_size, is_master=(rank == 0),
                         timeout=timedelta(seconds=timeout_s), wait_for_workers=False)


def checked_in(store, world_size: int) -> bool:
    """True once every rank 1..world_size-1 has connected to the store and checked in (a worker
    checks in just before init_process_group); never blocks."""
    return store.check([_ready_key(r) for r in range(1, world_size)])


def _ready_key(rank: int) -> str:
    return f"graphrt/ready/{rank}"


def join_group(rank: int, world_size: int, port: int, backend: str, timeout_s: float,
               store=None) -> RankContext:
    """Join the run's process group (the TCPStore on 127.0.0.1:port, collective timeout
    timeout_s) and a gloo control group; rank r of an NCCL run uses cuda:r. Rank 0 passes the
    store it opened and calls this once `checked_in` is true, so a worker that dies before the
    group forms leaves no half-initialised process group (nor torch's group counter advanced)
    behind in rank 0's process."""
    import torch.distributed as dist
    device = torch.device("cpu")
    if backend == "nccl":
        device = torch.device("cuda", rank)
        torch.cuda.set_device(device)
    timeout = timedelta(seconds=timeout_s)
    if store is None:
        store = open_store(rank, world_size, port, timeout_s)
    if rank > 0:
        store.set(_ready_key(rank), "1")
    dist.init_process_group(backend, store=store, rank=rank, world_size=world_size, timeout=timeout)
    control = dist.new_group(backend="gloo", timeout=timeout)
    return RankContext(rank, world_size, device, TensorParallel(rank, world_size, dist.group.WORLD),
                       control)


def rank_main(rank, world_size, port, backend, timeout_s, fn, args, results):
    """A rank process's body: join the group, run fn(ctx, *args), report on `results`, tear down."""
    import torch.distributed as dist
    ok = False
    try:
        ctx = join_group(rank, world_size, port, backend, timeout_s)
        out = fn(ctx, *args)
        results.put((rank, "ok", pickle.dumps(out) if rank == 0 else None))  # by value
        ok = True
        dist.barrier(group=ctx.control)   # teardown after the report: its errors end nothing
        # destroy_process_group can hang on NCCL (docs: tensor-parallel facts): bounded, then
        # os._exit below ends the rank with status 0 whatever the teardown thread is doing
        import threading
        ender = threading.Thread(target=dist.destroy_process_group, daemon=True)
        ender.start()
        ender.join(RANK_TEARDOWN_S)
    except BaseException:  # reported to the watchdog, which ends the other ranks
        if not ok:
            results.put((rank, "error", traceback.format_exc()))
    finally:
        results.close()
        results.join_thread()
        os._exit(0 if ok else 1)


def _last_words(results) -> str:
    """A dead rank's traceback if it reached the queue, else ''."""
    try:
        rank, status, payload = results.get(timeout=0.5)
    except queue_mod.Empty:
        return ""
    return f":\nrank {rank} reported {status}:\n{payload}" if status == "error" else ""


def stop_processes(procs, grace_s: float = 3.0) -> None:
    for p in procs:
        if p.is_alive():
            p.terminate()
    end = time.monotonic() + grace_s
    for p in procs:
        p.join(max(0.0, end - time.monotonic()))
        if p.is_alive():
            p.kill()
            p.join(1.0)


def launch(fn, world_size: int, *, args: tuple = (), backend: str = "gloo", timeout_s: float = 60.0,
           run_timeout_s: float = 600.0, exit_grace_s: float = 10.0):
    """Run fn(ctx, *args) on world_size ranks; returns rank 0's result or raises RankError.

    fn and args must pickle (a module-level function). timeout_s: the process groups' collective
    timeout; run_timeout_s: the whole run's wall-clock limit."""
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"world_size: expected an int >= 1, got {world_size!r}")
    if backend not in ("gloo", "nccl"):
        raise ValueError(f"backend: {backend!r} is not 'gloo' or 'nccl'")
    if backend == "nccl" and torch.cuda.device_count() < world_size:
        raise ValueError(f"world_size: {world_size} ranks need {world_size} GPUs, "
                         f"{torch.cuda.device_count()} visible")
    mp = torch.multiprocessing.get_context("spawn")
    results, port = mp.Queue(), free_port()
    procs = [mp.Process(target=rank_main, daemon=True, name=f"graphrt-tp-rank{r}",
                        args=(r, world_size, port, backend, timeout_s, fn, args, results))
             for r in range(world_size)]
    for p in procs:
        p.start()
    done, result, deadline = set(), None, time.monotonic() + run_timeout_s
    try:
        while len(done) < world_size:
            try:
                rank, status, payload = results.get(timeout=0.2)
            except queue_mod.Empty:
                dead = [(r, p.exitcode) for r, p in enumerate(procs)
                        if r not in done and p.exitcode not in (None, 0)]
                if dead:
                    r, code = dead[0]
                    raise RankError(f"rank {r} died (exit code {code}) before reporting; the other "
                                    f"ranks were ended" + _last_words(results))
                if time.monotonic() > deadline:
                    raise RankError(f"run_timeout_s: ranks {sorted(set(range(world_size)) - done)} "
                                    f"still running after {run_timeout_s} s; all ranks were ended")
                continue
            if status == "error":
                time.sleep(0.5)                    # a peer's death often surfaces as this error
                dead = [f"rank {r} died (exit code {p.exitcode}); " for r, p in enumerate(procs)
                        if r != rank and r not in done and p.exitcode not in (None, 0)]
                raise RankError(f"{''.join(dead)}rank {rank} failed; the other ranks were ended:\n"
                                f"{payload}")
            done.add(rank)
            if rank == 0:
                result = pickle.loads(payload)
        end = time.monotonic() + exit_grace_s
        for p in procs:
            p.join(max(0.0, end - time.monotonic()))
        return result
    finally:
        stop_processes(procs)
        results.close()
