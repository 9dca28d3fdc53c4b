"""Rank 0 drives, the other ranks follow: every prefill / capture / decode call is broadcast first.

    # on every rank (inside launch.launch's fn), with its own sharded ModelRuntime `mrt`:
    if ctx.rank == 0:
        drv = TPDriver(mrt, ctx.control)
        drv.capture(); drv.prefill(prompts, table); toks = drv.decode(tokens, table, seq_lens)
        drv.shutdown()                       # releases the workers' loops
    else:
        follow(mrt, ctx.control)             # replays what rank 0 runs, until shutdown

The call (its name and host copies of its tensors: tokens, block table, seq_lens, sampling
parameters) goes to the workers over the gloo `control` group (`broadcast_object_list`), then
every rank runs the same ModelRuntime call: the same bucket, the same graph, the same
collectives in the same order. Tokens are identical on every rank because each rank takes the
argmax (or the seeded sample, whose random stream depends only on (seed, step)) of the same
all-gathered logits. The broadcast precedes the graph launch, never runs inside it.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

from ..sampling import SamplingInputs


def _host(x):
    """Host copies of the tensors of a call's arguments (CUDA tensors do not pickle across ranks)."""
    if isinstance(x, torch.Tensor):
        return x.cpu()
    if isinstance(x, (list, tuple)):
        return type(x)(_host(v) for v in x)
    if isinstance(x, SamplingInputs):
        return SamplingInputs(**{k: v.cpu() for k, v in vars(x).items()})
    return x


def _run(mrt, name: str, args: tuple, kwargs: dict):
    if name == "prefill":
        return mrt.prefill(*args, **kwargs)
    if name == "decode":
        return mrt.decode(*args, **kwargs)
    if name == "capture":
        if mrt.model.tp is not None and mrt.uses_graphs:
            mrt.model.tp.warm_up(mrt.device)     # the NCCL communicator exists before capture
        return mrt.capture()
    raise ValueError(f"call: {name!r} is not 'prefill', 'decode' or 'capture'")


class TPDriver:
    """Rank 0's handle over its ModelRuntime: each call is broadcast to the workers, then run."""

    def __init__(self, runtime, control):
        self.runtime, self.control = runtime, control

    def _call(self, name: str, *args, **kwargs):
        msg = [(name, _host(args), _host(kwargs))]
        dist.broadcast_object_list(msg, src=0, group=self.control)
        return _run(self.runtime, name, args, kwargs)

    def capture(self) -> dict:
        return self._call("capture")

    def prefill(self, prompts, block_table) -> torch.Tensor:
        """As ModelRuntime.prefill ([n, V] float32 logits, identical on every rank)."""
        return self._call("prefill", prompts, block_table)

    def decode(self, tokens, block_table, seq_lens, *, sampling: SamplingInputs | None = None):
        """As ModelRuntime.decode ([K, n] int64 tokens, identical on every rank)."""
        return self._call("decode", tokens, block_table, seq_lens, sampling=sampling)

    def shutdown(self) -> None:
        """Ends the workers' `follow` loops."""
        dist.broadcast_object_list([None], src=0, group=self.control)


def follow(runtime, control, *, on_result=None) -> int:
    """A worker's loop: receive each call from rank 0 and run it on this rank's runtime, until
    rank 0's shutdown. Returns the number of calls run; on_result(name, result) sees each result.

    A call that this rank refuses as bad input (ValueError / TypeError, raised by the runtime's
    checks before any collective) was refused by rank 0 too, which raised it to its caller: the
    loop goes on."""
    calls = 0
    while True:
        msg = [None]
        dist.broadcast_object_list(msg, src=0, group=control)
        if msg[0] is None:
            return calls
        name, args, kwargs = msg[0]
        try:
            out = _run(runtime, name, args, kwargs)
        except (ValueError, TypeError):
            continue
        calls += 1
        if on_result is not None:
            on_result(name, out)


def rank_runtime(model, config, device, **kwargs):
    """ModelRuntime of one rank: `config` is the whole model's RuntimeConfig; the rank's runtime
    gets its own heads (shard_runtime_config), its own KV pool and device plan."""
    from ..model_runtime import ModelRuntime
    from .shard import shard_runtime_config
    tp = getattr(model, "tp", None)
    world = 1 if tp is None else tp.world_size
    return ModelRuntime(model, shard_runtime_config(config, world), device, **kwargs)
