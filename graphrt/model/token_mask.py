"""The per-slot allowed-token masks of constrained decoding (structured outputs): one owner.

    mask = TokenMask.allocate(max_batch, vocab, device)
    mask.write(slots, bits_host, active_host)     # host -> device rows (no host sync)
    mask.apply(logits, size)                       # in a graph: rows [0, size) of the slots
    mask.apply(logits, slots_dev)                  # a prefill's first draws: logits row i = slot i

Device tensors (the runtime's device), written only through `write`:
    bits   [B, W] int32   W = ceil(V / 32); bit t % 32 of word t // 32 = token t allowed (the
                          layout of xgrammar's `fill_next_token_bitmask`)
    active [B] int32      1 where the slot's request is constrained; 0 rows are untouched

The host (engine/structured.py) fills a constrained slot's row after each token it reads back
and writes it before the next launch that draws for that slot; the decode graphs read it in
place (kernels/token_mask.py, one launch per step before the draw).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from graphrt.kernels.ops import KernelOps, default_ops
from graphrt.kernels.reference_sample import words
from graphrt.kernels.transfer import tensor_on, to_device


@dataclass(frozen=True)
class TokenMask:
    bits: torch.Tensor
    active: torch.Tensor

    @classmethod
    def allocate(cls, max_batch: int, vocab: int, device) -> "TokenMask":
        return cls(torch.full((max_batch, words(vocab)), -1, dtype=torch.int32, device=device),
                   torch.zeros(max_batch, dtype=torch.int32, device=device))

    @property
    def words(self) -> int:
        return self.bits.shape[1]

    def write(self, slots: list[int], bits: torch.Tensor, active: torch.Tensor) -> None:
        """Rows `slots` <- bits [m, W] int32 (CPU) and active [m] int32 (CPU); stream-ordered
        copies through pinned memory (kernels/transfer.py). ValueError naming the argument on a
        shape mismatch."""
        m = len(slots)
        if tuple(bits.shape) != (m, self.words) or bits.dtype != torch.int32:
            raise ValueError(f"bits: expected [{m}, {self.words}] int32, got {tuple(bits.shape)} {bits.dtype}")
        if tuple(active.shape) != (m,) or active.dtype != torch.int32:
            raise ValueError(f"active: expected [{m}] int32, got {tuple(active.shape)} {active.dtype}")
        if not m:
            return
        dev = self.bits.device
        idx = tensor_on(slots, torch.long, dev)
        self.bits.index_copy_(0, idx, to_device(bits, dev))
        self.active.index_copy_(0, idx, to_device(active, dev))

    def apply(self, logits: torch.Tensor, sel, *, ops: KernelOps | None = None) -> torch.Tensor:
        """logits [b, V] of slots `sel` (an int b: slots [0, b); or a [b] int64 device tensor):
        disallowed tokens of active rows -> -inf, in place (ops: the kernel set, None: Triton's).
        Capturable."""
        apply = default_ops(ops).apply_token_mask
        if isinstance(sel, int):
            return apply(logits, self.bits[:sel], self.active[:sel])
        return apply(logits, self.bits, self.active, slots=sel)


__all__ = ["TokenMask"]
