"""The attention context handed to model code: one bucket's prepared attention state for a step.

    def step(ctx: AttentionContext, tokens):        # captured per bucket by ModelRuntime
        ctx.prepare()                               # metadata + device plan, once per step
        ...
        q = ctx.rope_append(layer, qkv, cos_sin)    # [B, Hq, D]; rotated k, v into the cache
        o = ctx.attention(layer, q)                 # [B, Hq, D]

(`ctx.write_kv(layer, k, v)` appends already-rotated k, v [B, Hkv, D] instead of rope_append.)

No global state: the context is an explicit argument; every layer shares the step's plan.
"""
from __future__ import annotations

import torch

from graphrt.attention.backends.base import AttentionBackend
from graphrt.attention.buffers import BucketView
from graphrt.attention.kvcache import PagedKVCache


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
        from graphrt.kernels.append_kv import append_kv          # Triton: imported where it runs
        cache = self.kv_caches[layer]
        append_kv(k.contiguous(), v.contiguous(), cache, self.view.block_table,
                  self.view.seq_lens, self.view.device_error, kv_scale=cache.scale)

    def rope_append(self, layer: int, qkv: torch.Tensor, cos_sin: torch.Tensor, *,
                    num_q_heads: int, q_norm: torch.Tensor | None = None,
                    k_norm: torch.Tensor | None = None, eps: float = 1e-6) -> torch.Tensor:
        """qkv [B, (Hq + 2*Hkv) * D] (fused GEMM output) -> rotated q [B, Hq, D]; rotated k and
        v go to slot seq_len - 1 of each row in the layer's cache (kernels/rope_append.py).
        cos_sin: [max_positions, D] float32 (model/rope.py); q_norm, k_norm: [D] (Qwen3)."""
        from graphrt.kernels.rope_append import rope_append_decode   # Triton (LlamaDecoder: its kernel set's)
        cache = self.kv_caches[layer]   # FP8 pages: x / cache.scale stored in e4m3
        return rope_append_decode(qkv, cos_sin, cache, self.view.block_table,
                                  self.view.seq_lens, self.view.device_error,
                                  num_q_heads=num_q_heads, q_norm=q_norm, k_norm=k_norm, eps=eps,
                                  kv_scale=cache.scale)

    def attention(self, layer: int, q: torch.Tensor, *, out: torch.Tensor | None = None) -> torch.Tensor:
        """q [B, Hq, D] -> [B, Hq, D], over the layer's cache with the step's shared plan (into
        `out`, a contiguous [B, Hq, D] of q's dtype, when given)."""
        out = torch.empty_like(q) if out is None else out
        self.backend.attend(self.view, q.contiguous(), self.kv_caches[layer], out)
        return out
