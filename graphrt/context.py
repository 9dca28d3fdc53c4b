"""The attention context handed to model code: one bucket's prepared attention state for a step.

    def step(ctx: AttentionContext, tokens):        # captured per bucket by ModelRuntime
        ctx.prepare()                               # metadata + device plan, once per step
        ...
        ctx.write_kv(layer, k, v)                   # [B, Hkv, D] into the layer's paged cache
        o = ctx.attention(layer, q)                 # [B, Hq, D]

No global state: the context is an explicit argument; every layer shares the step's plan.
"""
from __future__ import annotations

import torch

from .backends.base import AttentionBackend
from .buffers import BucketView
from .kernels.append_kv import append_kv
from .kvcache import PagedKVCache


class AttentionContext:
    def __init__(self, backend: AttentionBackend, view: BucketView, kv_caches: list[PagedKVCache]):
        self.backend = backend
        self.view = view
        self.kv_caches = kv_caches

    @property
    def size(self) -> int:
        return self.view.size

    def prepare(self) -> None:
        """Once per step, before any layer: CSR metadata + split-KV plan on the device."""
        self.backend.prepare(self.view)

    def positions(self) -> torch.Tensor:
        """[B] int64 position of each row's current token (seq_len - 1; 0 for padding rows)."""
        return (self.view.seq_lens.long() - 1).clamp_min(0)

    def write_kv(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> None:
        """k, v [B, Hkv, D]: the current token's K/V, written at slot seq_len - 1 of each row."""
        append_kv(k.contiguous(), v.contiguous(), self.kv_caches[layer], self.view.block_table,
                  self.view.seq_lens, self.view.device_error)

    def attention(self, layer: int, q: torch.Tensor) -> torch.Tensor:
        """q [B, Hq, D] -> [B, Hq, D], over the layer's cache with the step's shared plan."""
        out = torch.empty_like(q)
        self.backend.attend(self.view, q.contiguous(), self.kv_caches[layer], out)
        return out
