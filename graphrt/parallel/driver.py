"""Rank 0 drives, the other ranks follow: every call is broadcast first.

TPDriver broadcasts one call (a name in CALLS, its arguments) to the workers, then runs it on
rank 0's own target; `follow` is a worker's loop running each call on its target. The target is
a bare ModelRuntime (prefill, decode, capture: the tests' and tools' path) or a LocalExecutor
(capture, prefill, run: the engine's, through TPExecutor in executor.py).

    # on every rank (inside launch.launch's fn), with its own sharded ModelRuntime `mrt`:
    if ctx.rank == 0:
        drv = TPDriver(mrt, ctx.control)
        drv.capture(); drv.prefill(prompts, table); toks = drv.decode(tokens, table, seq_lens)
        drv.runtime.last_logits(n)           # rank 0's runtime, read locally (no broadcast)
        drv.shutdown()                       # releases the workers' loops
    else:
        follow(mrt, ctx.control)             # replays what rank 0 runs, until shutdown

The call (its name, its host tensors: block table, seq_lens, sampling parameters) goes to the
workers over the gloo `control` group (`broadcast_object_list`); its device tensors (the
engine's next tokens, on the GPU) follow with `broadcast` over the model's group, ordered on
the stream like the graph replay after it (no host sync); then
every rank runs the same call: the same bucket, the same graph, the same
collectives in the same order. Tokens are identical on every rank because each rank takes the
argmax (or the seeded sample, whose random stream depends only on (seed, step)) of the same
all-gathered logits. The broadcast precedes the graph launch, never runs inside it.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, fields, is_dataclass

import torch
import torch.distributed as dist

from graphrt.model.sampling import SamplingInputs


@dataclass(frozen=True)
class _OnDevice:
    """Stands for a device tensor in a broadcast call; its data follow over the data group."""
    shape: tuple
    dtype: torch.dtype


def _split(x, device_tensors: list):
    """The call's arguments with host copies of host tensors and `_OnDevice` for device ones
    (appended to device_tensors, in order)."""
    if isinstance(x, torch.Tensor):
        if x.device.type == "cpu":
            return x
        device_tensors.append(x.contiguous())
        return _OnDevice(tuple(x.shape), x.dtype)
    if isinstance(x, (list, tuple)):
        return type(x)(_split(v, device_tensors) for v in x)
    if isinstance(x, dict):
        return {k: _split(v, device_tensors) for k, v in x.items()}
    if isinstance(x, SamplingInputs):
        return SamplingInputs(**{f.name: getattr(x, f.name).cpu() for f in fields(x)})
    if is_dataclass(x) and not isinstance(x, type):      # a launch description (graphrt/worker)
        return type(x)(**{f.name: _split(getattr(x, f.name), device_tensors) for f in fields(x)})
    return x


def _fill(x, runtime, received: list):
    """Inverse of _split on a worker: each _OnDevice becomes the next tensor broadcast from rank 0."""
    if isinstance(x, _OnDevice):
        t = torch.empty(x.shape, dtype=x.dtype, device=runtime.device)
        dist.broadcast(t, src=0, group=runtime.model.tp.group)       # stream-ordered, no host sync
        received.append(t)
        return t
    if isinstance(x, (list, tuple)):
        return type(x)(_fill(v, runtime, received) for v in x)
    if isinstance(x, dict):
        return {k: _fill(v, runtime, received) for k, v in x.items()}
    if is_dataclass(x) and not isinstance(x, type) and not isinstance(x, SamplingInputs):
        return type(x)(**{f.name: _fill(getattr(x, f.name), runtime, received) for f in fields(x)})
    return x


CALLS = ("prefill", "decode", "capture", "run")   # a ModelRuntime's or a LocalExecutor's


def _run(target, runtime, name: str, args: tuple, kwargs: dict):
    """Run call `name` on `target`; runtime: the rank's ModelRuntime (target itself, or the
    LocalExecutor's)."""
    if name not in CALLS:
        raise ValueError(f"call: {name!r} is not one of {CALLS}")
    if name == "capture" and runtime.model.tp is not None and runtime.uses_graphs:
        runtime.model.tp.warm_up(runtime.device)     # the NCCL communicator exists before capture
    return getattr(target, name)(*args, **kwargs)


class TPDriver:
    """Rank 0's handle: each call is broadcast to the workers, then run on `target` (a
    ModelRuntime, or a LocalExecutor with runtime= its ModelRuntime). `runtime` is rank 0's
    ModelRuntime, read locally (last_logits, graphs, config: nothing broadcast).

    health: a callable returning None, or a message naming a dead rank (WorkerGroup.failure);
    calls then raise RankError instead of waiting on a collective that cannot complete."""

    def __init__(self, target, control, *, runtime=None, health=None):
        self.target, self.control, self.health = target, control, health
        self.runtime = target if runtime is None else runtime

    def call(self, name: str, *args, **kwargs):
        """Broadcast call `name` (one of CALLS) with its arguments, then run it here."""
        from graphrt.parallel.launch import RankError
        if name not in CALLS:
            raise ValueError(f"call: {name!r} is not one of {CALLS}")
        failure = self.health() if self.health is not None else None
        if failure:
            raise RankError(failure)
        tensors: list = []
        msg = [(name, _split(args, tensors), _split(kwargs, tensors))]
        try:
            dist.broadcast_object_list(msg, src=0, group=self.control)
            tp = self.runtime.model.tp
            for t in tensors if tp is not None else ():   # device inputs (engine tokens)
                dist.broadcast(t, src=0, group=tp.group)
        except RuntimeError as e:
            raise RankError(self._failure(wait_s=1.0) or f"tensor parallel: broadcasting {name!r} "
                            f"failed: {e}") from e
        try:
            return _run(self.target, self.runtime, name, args, kwargs)
        except RuntimeError as e:               # a collective inside the call saw a peer vanish
            failure = self._failure(wait_s=1.0)
            if failure:
                raise RankError(failure) from e
            raise

    def _failure(self, *, wait_s: float) -> str | None:
        """The health message, waiting up to wait_s for the watchdog to notice a death."""
        end = time.monotonic() + wait_s
        while self.health is not None:
            failure = self.health()
            if failure or time.monotonic() > end:
                return failure
            time.sleep(0.05)
        return None

    def capture(self) -> dict:
        return self.call("capture")

    def prefill(self, prompts, block_table, *, starts=None, after=None, defer_check: bool = False) -> torch.Tensor:
        """As ModelRuntime.prefill ([n, V] float32 logits, identical on every rank; a bare runtime)."""
        return self.call("prefill", prompts, block_table, starts=starts, after=after, defer_check=defer_check)

    def decode(self, tokens, block_table, seq_lens, *, out=None, sampling: SamplingInputs | None = None):
        """As ModelRuntime.decode ([K, n] int64 tokens, identical on every rank); `out` stays
        on rank 0."""
        rows = self.call("decode", tokens, block_table, seq_lens, sampling=sampling)
        if out is None:
            return rows
        with self.runtime.lock:
            return out.copy_(rows)

    def shutdown(self) -> None:
        """Ends the workers' `follow` loops."""
        dist.broadcast_object_list([None], src=0, group=self.control)


def follow(target, control, *, runtime=None, on_result=None) -> int:
    """A worker's loop: receive each call from rank 0 and run it on this rank's target (a
    ModelRuntime, or a LocalExecutor with runtime= its ModelRuntime), until rank 0's shutdown.
    Returns the number of calls run; on_result(name, result) sees each result.

    A call that this rank refuses as bad input (ValueError / TypeError, raised by the runtime's
    checks before any collective) was refused by rank 0 too, which raised it to its caller: the
    loop goes on."""
    runtime = target if runtime is None else runtime
    calls = 0
    while True:
        msg = [None]
        dist.broadcast_object_list(msg, src=0, group=control)
        if msg[0] is None:
            return calls
        name, args, kwargs = msg[0]
        received: list = []
        args, kwargs = _fill(args, runtime, received), _fill(kwargs, runtime, received)
        try:
            out = _run(target, runtime, name, args, kwargs)
        except (ValueError, TypeError):
            continue
        calls += 1
        if on_result is not None:
            on_result(name, out)


def rank_runtime(model, config, device, **kwargs):
    """ModelRuntime of one rank: `config` is the whole model's RuntimeConfig; the rank's runtime
    gets its own heads (shard_runtime_config), its own KV pool and device plan."""
    from graphrt.model.runtime import ModelRuntime
    from graphrt.parallel.shard import shard_runtime_config
    tp = getattr(model, "tp", None)
    world = 1 if tp is None else tp.world_size
    return ModelRuntime(model, shard_runtime_config(config, world), device, **kwargs)
