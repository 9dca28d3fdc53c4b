"""The speculative rounds' scratch and outputs: one typed set at the largest bucket.

The per-slot state the rounds read and advance (token history, tokens held, limit, block table,
sampling rows, per-slot k) is the runtime's SlotState (model/slots.py), shared with the decode
graphs; this object holds only what a block of R rounds computes. All tensors on the runtime
device, persistent across graph replays; `view(size)` gives a bucket's first rows.
"""
from __future__ import annotations

from dataclasses import dataclass, fields

import torch

from graphrt.model.logprobs import LogprobBuffers


@dataclass(frozen=True)
class SpecBuffers:
    """Rows are slots (B = max_batch, or a bucket's first rows after `view`); Q = k + 1.

    proposals [B, k] int64, count [B] int32: the round's proposals (count clipped to the slot's
      SPEC_K row);
    accept [B, Q] int32, fallback [B, Q] int64: the judge's per-position verdicts;
    out_tokens [R, B, Q] int64: each round's emitted tokens (-1 past emitted);
    emitted [R, B] int32: tokens emitted per slot and round (0 once a slot is done or empty);
    proposed [R, B] int32: proposals verified per slot and round (0 for inactive slots), so
      accepted proposals = emitted - 1 where emitted > 0 (acceptance rate for the stats);
    argmax [B, Q] int64: a one-round block's argmax at each verified position before masks and
      processing (grammar-checked blocks of constrained rows: whether each row's model agreed with
      its grammar; written by those blocks only);
    logprobs: a LogprobBuffers of R steps x B * Q rows (row b * Q + j: verified position j of slot
      b, the log-probs of out_tokens[r, b, j] and the top N there), or None (no processing, or
      width 0); `view` keeps it whole (a bucket's rows are its first size * Q).
    """

    proposals: torch.Tensor
    count: torch.Tensor
    accept: torch.Tensor
    fallback: torch.Tensor
    out_tokens: torch.Tensor
    emitted: torch.Tensor
    proposed: torch.Tensor
    argmax: torch.Tensor
    logprobs: LogprobBuffers | None = None

    @classmethod
    def allocate(cls, max_batch: int, k: int, rounds: int, device: torch.device, *,
                 logprobs_width: int = 0) -> "SpecBuffers":
        """logprobs_width: N alternatives recorded per verified position (0: no log-probs)."""
        def z(*shape, dt=torch.int32):
            return torch.zeros(shape, dtype=dt, device=device)
        q = k + 1
        lp = (LogprobBuffers.allocate(steps=rounds, max_batch=max_batch * q, width=logprobs_width, device=device)
              if logprobs_width else None)
        return cls(proposals=z(max_batch, k, dt=torch.int64), count=z(max_batch),
                   accept=z(max_batch, q), fallback=z(max_batch, q, dt=torch.int64),
                   out_tokens=z(rounds, max_batch, q, dt=torch.int64), emitted=z(rounds, max_batch),
                   proposed=z(rounds, max_batch), argmax=z(max_batch, q, dt=torch.int64), logprobs=lp)

    def view(self, size: int) -> "SpecBuffers":
        """The first `size` slots (views, no copies)."""
        out = {}
        for f in fields(self):
            t = getattr(self, f.name)
            if f.name == "logprobs":
                out[f.name] = t
            else:
                out[f.name] = t[:, :size] if f.name in ("out_tokens", "emitted", "proposed") else t[:size]
        return SpecBuffers(**out)


__all__ = ["SpecBuffers"]
