"""The speculative runner's persistent per-slot state: one typed set at the largest bucket.

All tensors live on the runtime device and persist across graph replays: the host writes a slot
at admission (`SpecBuffers.set_slot`) and reads outputs after a block; between blocks the
device advances num_tokens, step and the token buffer by itself.
"""
from __future__ import annotations

from dataclasses import dataclass, fields

import torch


@dataclass(frozen=True)
class SpecBuffers:
    """Rows are slots (B = max_batch, or a bucket's first rows after `view`).

    token_buf [B, W] int32: each slot's prompt + output tokens (the device token buffer);
    num_tokens [B] int32: tokens held; the last one is the current token, whose K/V is not yet in
      the cache (so the cache holds num_tokens - 1 positions); 0 = empty slot;
    limit [B] int32: the most tokens the slot may hold (prompt + max_tokens); 0 = empty slot;
    block_table [B, P] int32: pages for positions < limit + k - 1 (verify writes k ahead);
    temperature [B] float32 (0 = greedy), seed [B] int64, step [B] int32 (draw index of the
      next output token: tokens sampled so far), top_k [B] int32 (0 = off), top_p [B] float32
      (1 = off; both read only by runners built with filtered=True), for the acceptance;
    proposals [B, k] int64, count [B] int32: the round's proposals;
    accept [B, Q] int32, fallback [B, Q] int64: the judge's per-position verdicts (Q = k + 1);
    out_tokens [R, B, Q] int64: each round's emitted tokens (-1 past emitted);
    emitted [R, B] int32: tokens emitted per slot and round (0 once a slot is done or empty);
    proposed [R, B] int32: proposals verified per slot and round (0 for inactive slots), so
      accepted proposals = emitted - 1 where emitted > 0 (acceptance rate for the stats);
    device_error [1] int32: the K/V append's error flags.
    """

    token_buf: torch.Tensor
    num_tokens: torch.Tensor
    limit: torch.Tensor
    block_table: torch.Tensor
    temperature: torch.Tensor
    seed: torch.Tensor
    step: torch.Tensor
    top_k: torch.Tensor
    top_p: torch.Tensor
    proposals: torch.Tensor
    count: torch.Tensor
    accept: torch.Tensor
    fallback: torch.Tensor
    out_tokens: torch.Tensor
    emitted: torch.Tensor
    proposed: torch.Tensor
    device_error: torch.Tensor

    @classmethod
    def allocate(cls, max_batch: int, width: int, max_pages: int, k: int, rounds: int,
                 device: torch.device) -> "SpecBuffers":
        def z(*shape, dt=torch.int32):
            return torch.zeros(shape, dtype=dt, device=device)
        q = k + 1
        return cls(token_buf=z(max_batch, width), num_tokens=z(max_batch), limit=z(max_batch),
                   block_table=z(max_batch, max_pages), temperature=z(max_batch, dt=torch.float32),
                   seed=z(max_batch, dt=torch.int64), step=z(max_batch), top_k=z(max_batch),
                   top_p=torch.ones(max_batch, dtype=torch.float32, device=device),
                   proposals=z(max_batch, k, dt=torch.int64), count=z(max_batch),
                   accept=z(max_batch, q), fallback=z(max_batch, q, dt=torch.int64),
                   out_tokens=z(rounds, max_batch, q, dt=torch.int64), emitted=z(rounds, max_batch),
                   proposed=z(rounds, max_batch),
                   device_error=z(1))

    def view(self, size: int) -> "SpecBuffers":
        """The first `size` slots (views, no copies); device_error is shared."""
        out = {}
        for f in fields(self):
            t = getattr(self, f.name)
            if f.name == "device_error":
                out[f.name] = t
            elif f.name in ("out_tokens", "emitted", "proposed"):
                out[f.name] = t[:, :size]
            else:
                out[f.name] = t[:size]
        return SpecBuffers(**out)

    @property
    def width(self) -> int:
        return self.token_buf.shape[1]


__all__ = ["SpecBuffers"]
