"""The torch references of the multi-query attention kernels: multiquery_attention.py, query_layout.py.

As kernels/reference.py: the kernel tests' oracle and the "torch" kernel set's implementation
(kernels/ops.py), so a CPU runs the model's verify steps, prompt pieces and mixed chunks without
Triton. Same signatures, outputs and argument checks (kernels/mq_launch.py) as the kernels; the
launch options (splits, block_n, num_warps, num_stages) are accepted and change nothing.

multiquery_attention: row b's query j sits at position kv_lens[b] - q_lens[b] + j and attends
keys 0 .. that position, float32 over the K/V gathered from the pages (FP8 pages times their
scales), softmax scale D ** -0.5; padding rows (kv_lens 0) and padding tokens (j >= q_lens[b])
are zeros. Eager: it reads the longest kv_len on the host to size the gather (as the torch
decode backend does; a CPU does not mind). This module imports no Triton.
"""
from __future__ import annotations

import torch

from graphrt.kernels.mq_launch import check_multiquery, check_query_layout


def query_layout(cache_lens: torch.Tensor, nq: int, q_lens: torch.Tensor | None = None, *, offset: int = 0
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """kernels/query_layout.py's query_layout: cache_lens [B] int32 (< 0: padding row), Q = nq,
    q_lens [B] int32 or None -> (positions [B * Q] int32, rows [B * Q] int32 (-1: no K/V),
    kv_lens [B] int32)."""
    b = check_query_layout(cache_lens, nq, q_lens, offset)
    dev = cache_lens.device
    c = cache_lens.to(torch.int64)
    live = c >= 0
    c = torch.where(live, c + offset, c)
    n = q_lens.to(torch.int64) if q_lens is not None else torch.full((b,), nq, dtype=torch.int64, device=dev)
    j = torch.arange(nq, device=dev)[None, :]
    real = live[:, None] & (j < n[:, None])
    rows = torch.where(real, torch.arange(b, device=dev)[:, None], -1)
    return ((c.clamp_min(0)[:, None] + j).to(torch.int32).reshape(-1), rows.to(torch.int32).reshape(-1),
            torch.where(live, c + n, 0).to(torch.int32))


def multiquery_attention(q: torch.Tensor, kv_cache, block_table: torch.Tensor,
                         kv_lens: torch.Tensor, *, q_lens: torch.Tensor | None = None, splits: int = 1,
                         out: torch.Tensor | None = None, block_n: int | None = None,
                         num_warps: int | None = None, num_stages: int | None = None) -> torch.Tensor:
    """kernels/multiquery_attention.py's multiquery_attention: q [B, Q, Hq, D] -> [B, Q, Hq, D]
    causal attention over the paged cache (module docstring)."""
    out = check_multiquery(q, kv_cache, block_table, kv_lens, q_lens=q_lens, splits=splits, out=out,
                           block_n=block_n, num_warps=num_warps, num_stages=num_stages)
    b, nq, hq, d = q.shape
    kc, vc = kv_cache.as_tuple()
    nhd = kv_cache.layout == "NHD"
    hkv, page = (kc.shape[2], kc.shape[1]) if nhd else (kc.shape[1], kc.shape[2])
    longest = int(kv_lens.max()) if b else 0                             # host read (eager)
    if longest <= 0:
        return out.zero_()
    dev = q.device
    lens = kv_lens.to(torch.int64)
    n = q_lens.to(torch.int64) if q_lens is not None else torch.full((b,), nq, dtype=torch.int64, device=dev)
    pos = torch.arange(longest, device=dev)                              # [L]
    pages = block_table[:b, pos // page].to(torch.int64).clamp(0, kc.shape[0] - 1)   # [B, L] (past a row's
    slots = pos % page                                                    # keys: masked below)
    k, v = (kc[pages, slots], vc[pages, slots]) if nhd else (kc[pages, :, slots], vc[pages, :, slots])
    k_scale, v_scale = kv_cache.kv_scales()                               # [B, L, Hkv, D]; FP8: dequantized
    kf, vf = k.float() * k_scale, v.float() * v_scale
    qf = q.float().view(b, nq, hkv, hq // hkv, d)
    s = torch.einsum("bqhgd,blhd->bhgql", qf, kf) * d ** -0.5             # [B, Hkv, G, Q, L]
    j = torch.arange(nq, device=dev)[None, :]
    qpos = lens[:, None] - n[:, None] + j                                 # [B, Q]
    real = (j < n[:, None]) & (lens[:, None] > 0) & (qpos >= 0)
    see = (pos[None, None, :] <= qpos[:, :, None]) & real[:, :, None]     # [B, Q, L]
    s = s.masked_fill(~see[:, None, None], float("-inf"))
    p = torch.softmax(s, dim=-1).nan_to_num(0.0)                          # padding rows: all -inf
    o = torch.einsum("bhgql,blhd->bqhgd", p, vf).reshape(b, nq, hq, d)
    return out.copy_(o)


__all__ = ["multiquery_attention", "query_layout"]
