"""The per-slot allowed-token masks of constrained decoding (structured outputs): one owner.

    mask = TokenMask.allocate(max_batch, vocab, device, positions=P)
    mask.write(slots, bits_host, active_host)     # host -> device rows (no host sync); bits
                                                  # [m, W] (position 0) or [m, p, W] (p <= P)
    mask.apply(logits, size)                       # in a graph: rows [0, size) of the slots
    mask.apply(logits, slots_dev)                  # a prefill's first draws: logits row i = slot i
    mask.apply_verify(logits, size, k)             # a verify: row b * (k + 1) + j = slot b, position j

Device tensors (the runtime's device), written only through `write` (which also keeps `on`, the
host's set of constrained slots, so an eager draw knows whether it needs `apply`):
    bits   [B, P, W] int32  W = ceil(V / 32); bit t % 32 of word t // 32 = token t allowed (the
                            layout of xgrammar's `fill_next_token_bitmask`); position j is the
                            mask after j tokens past the slot's current one: a decode draw reads
                            position 0; a speculative verify reads positions 0..k, the masks
                            before each proposal and after the last (P = 1 + the most proposals
                            a round verifies; 1 without speculation)
    active [B, P] int32     1 where the slot's request is constrained (every position alike); 0
                            rows are untouched

The host (engine/structured.py) fills a constrained slot's rows after each token it reads back
and writes them before the next launch that draws for that slot; the decode graphs and the
speculative rounds read them in place (kernels/token_mask.py, one launch per step or round).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from graphrt.kernels.ops import KernelOps, default_ops
from graphrt.kernels.reference_sample import words
from graphrt.kernels.transfer import tensor_on, to_device


@dataclass(frozen=True)
class TokenMask:
    bits: torch.Tensor
    active: torch.Tensor
    rows: torch.Tensor            # [B, P] int64 device: b * P + j, the flat row of (slot b, position j)
    first: torch.Tensor           # [B] int64 device: b * P, each slot's position 0 (contiguous)
    on: set = field(default_factory=set, compare=False, repr=False)   # host: the slots whose `active` flag `write` set to 1

    @classmethod
    def allocate(cls, max_batch: int, vocab: int, device, *, positions: int = 1) -> "TokenMask":
        if isinstance(positions, bool) or not isinstance(positions, int) or positions < 1:
            raise ValueError(f"positions: expected an int >= 1, got {positions!r}")
        b, p = max_batch, positions
        rows = torch.arange(b * p, dtype=torch.int64, device=device).view(b, p)
        return cls(torch.full((b, p, words(vocab)), -1, dtype=torch.int32, device=device),
                   torch.zeros((b, p), dtype=torch.int32, device=device), rows, rows[:, 0].contiguous())

    @property
    def words(self) -> int:
        return self.bits.shape[2]

    @property
    def positions(self) -> int:
        return self.bits.shape[1]

    def write(self, slots: list[int], bits: torch.Tensor, active: torch.Tensor) -> None:
        """Rows `slots` <- bits [m, W] (position 0) or [m, p, W] (positions [0, p), p <= P)
        int32 (CPU) and active [m] int32 (CPU, the flag of every position); stream-ordered copies
        through pinned memory (kernels/transfer.py). ValueError naming the argument on a shape
        mismatch."""
        m = len(slots)
        if bits.dim() == 2:
            bits = bits[:, None]
        if bits.dim() != 3 or bits.shape[0] != m or not 1 <= bits.shape[1] <= self.positions \
                or bits.shape[2] != self.words or bits.dtype != torch.int32:
            raise ValueError(f"bits: expected [{m}, {self.words}] or [{m}, p <= {self.positions}, {self.words}] "
                             f"int32, got {tuple(bits.shape)} {bits.dtype}")
        if tuple(active.shape) != (m,) or active.dtype != torch.int32:
            raise ValueError(f"active: expected [{m}] int32, got {tuple(active.shape)} {active.dtype}")
        if not m:
            return
        dev, p = self.bits.device, bits.shape[1]
        idx = tensor_on(slots, torch.long, dev)
        if p == self.positions:
            self.bits.index_copy_(0, idx, to_device(bits.contiguous(), dev))
        else:
            self.bits[:, :p].index_copy_(0, idx, to_device(bits.contiguous(), dev))
        self.active.index_copy_(0, idx, to_device(active[:, None].expand(m, self.positions).contiguous(), dev))
        for slot, flag in zip(slots, active.tolist()):
            (self.on.add if flag else self.on.discard)(slot)

    def any_on(self, slots) -> bool:
        """Whether some of `slots` (host ints) is constrained: a draw over only the others needs
        no `apply` (their rows would be untouched)."""
        return not self.on.isdisjoint(slots)

    def apply(self, logits: torch.Tensor, sel, *, ops: KernelOps | None = None) -> torch.Tensor:
        """logits [b, V] of slots `sel` (an int b: slots [0, b); or a [b] int64 device tensor),
        position 0: disallowed tokens of active rows -> -inf, in place (ops: the kernel set,
        kernels/ops.py; None: Triton's). Capturable."""
        apply = default_ops(ops).apply_token_mask
        flat_bits, flat_active = self.bits.view(-1, self.words), self.active.view(-1)
        if self.positions == 1:
            if isinstance(sel, int):
                return apply(logits, flat_bits[:sel], flat_active[:sel])
            return apply(logits, flat_bits, flat_active, slots=sel)
        rows = self.first[:sel] if isinstance(sel, int) else self.first.index_select(0, sel)
        return apply(logits, flat_bits, flat_active, slots=rows)

    def apply_verify(self, logits: torch.Tensor, size: int, k: int, *, ops: KernelOps | None = None) -> torch.Tensor:
        """logits [size * (k + 1), V] of a verify over slots [0, size) (row b * (k + 1) + j: slot
        b's position j, j <= k < P): disallowed tokens of active rows -> -inf, in place (ops: as
        `apply`). Capturable (one small index copy, then one launch)."""
        if not 0 <= k < self.positions:
            raise ValueError(f"k: {k} proposals need positions {k + 1}, the mask holds {self.positions}")
        rows = self.rows[:size, :k + 1].reshape(-1)                       # [size * (k + 1)] int64
        return default_ops(ops).apply_token_mask(logits, self.bits.view(-1, self.words), self.active.view(-1),
                                                 slots=rows)


__all__ = ["TokenMask"]
