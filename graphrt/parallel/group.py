"""`TensorParallel`: the three collectives of a Megatron-style sharded decoder, on an explicit group.

    tp = TensorParallel(rank=r, world_size=n, group=pg)     # pg: a torch.distributed ProcessGroup
    x = tp.all_reduce(x)                   # sum of the ranks' partial o_proj / down_proj outputs
                                           # (NCCL, or per message size a one-shot kernel: allreduce.py)
    e = tp.embed(embed_shard, tokens)      # vocab-parallel embedding: mask + all-reduce
    logits = tp.gather_logits(local, V)    # [B, ceil(V/n)] per rank -> [B, V] on every rank

Every call is a plain torch.distributed collective on `group` (no default group, no global
state), issued on the current stream: with NCCL it can be captured in a CUDA graph once the
communicator exists (warm it up with one eager call before capture: `warm_up`).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.distributed as dist

# torch >= 2.12 names it all_gather_single; older torch (2.11 on the GPU hosts) all_gather_into_tensor
_ALL_GATHER = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


@dataclass(frozen=True)
class TensorParallel:
    """rank in [0, world_size); group: the ProcessGroup of the model's collectives (NCCL on CUDA
    tensors, gloo on CPU tensors); reducer: None (every all-reduce on `group`) or an
    `allreduce.AllReducer` that routes each message by its size (set by allreduce.configure)."""
    rank: int
    world_size: int
    group: object
    reducer: object = field(default=None, compare=False, repr=False)

    def __post_init__(self):
        for name in ("rank", "world_size"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int):
                raise ValueError(f"{name}: expected an int, got {v!r}")
        if self.world_size < 1 or not 0 <= self.rank < self.world_size:
            raise ValueError(f"rank: {self.rank} is not in [0, world_size={self.world_size})")

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """Sum over the ranks of x (any shape): x itself summed in place (NCCL / gloo), or a new
        tensor (the one-shot kernel); use the returned tensor."""
        return self.nccl_all_reduce(x) if self.reducer is None else self.reducer(x)

    def nccl_all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        """In-place sum over the ranks of x on `group` (torch.distributed); returns x."""
        dist.all_reduce(x, group=self.group)
        return x

    def embed(self, embed_shard: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        """embed_shard [V/n, H] (this rank's vocab rows), tokens [T] int64 (global ids) ->
        [T, H] full embeddings: each rank looks up the ids it owns, zeros the others, all-reduce."""
        rows = embed_shard.shape[0]
        local = tokens - self.rank * rows                            # [T] int64
        outside = (local < 0) | (local >= rows)
        out = embed_shard[local.clamp(0, rows - 1)]                  # [T, H] (a copy)
        out.masked_fill_(outside.unsqueeze(1), 0)
        return self.all_reduce(out)

    def gather_logits(self, local: torch.Tensor, vocab_size: int | None = None) -> torch.Tensor:
        """local [B, Vr] (this rank's vocab rows, Vr = ceil(V/n)) -> [B, V] identical on every
        rank, contiguous; the columns of the padding rows (ids >= vocab_size) are dropped."""
        b, v = local.shape
        parts = torch.empty((self.world_size * b, v), dtype=local.dtype, device=local.device)
        _ALL_GATHER(parts, local.contiguous(), group=self.group)
        full = parts.view(self.world_size, b, v).transpose(0, 1).reshape(b, self.world_size * v)
        if vocab_size is None or vocab_size == full.shape[1]:
            return full
        return full[:, :vocab_size].contiguous()

    def warm_up(self, device) -> None:
        """One eager all-reduce and all-gather, so the communicator exists before graph capture."""
        x = torch.ones(1, 8, device=device)
        self.all_reduce(x)
        self.gather_logits(x)
        if torch.device(device).type == "cuda":
            torch.cuda.synchronize(device)
