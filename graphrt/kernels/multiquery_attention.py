"""Plan-free multi-query paged attention: Q new tokens per request over the paged KV cache.

The verify step of speculative decoding runs Q = k + 1 query tokens per request: query j of
row b sits at position kv_lens[b] - Q + j and attends keys 0 .. that position (causal within the
new tokens, whose K/V are already in the cache). GQA: the G = Hq / Hkv query heads of one KV
head and the query tokens form one [tokens * G, D] tile, so each K/V page is read once per KV
head and tile. A graphed prefill chunk runs the same kernel with Q = its token bucket and
per-row q_lens (<= Q real tokens; query j at kv_lens[b] - q_lens[b] + j, rows j >= q_lens[b] are
padding whose output is never used); when Q * G exceeds one tile (128 rows) the tokens are
split into tiles of 128 // G, and each tile reads keys only up to its last query's position (a
tile of padding tokens only reads none: its rows are zeros).

Grid: (B * tiles, Hkv, splits). Split s covers an equal share of the tile's keys (by BLOCK_N blocks);
with splits > 1 each program writes a partial output and its log-sum-exp and one combine launch
merges them (split-KV for small batches at long context). Everything is read from device
tensors (kv_lens, block_table) with a grid fixed by static shapes: no plan, no host sync, so it
can be captured in a CUDA graph. Rows with kv_lens 0 (padding) produce zeros. Page ids are not
checked here: the caller's block table must be valid for every position < kv_lens.
Runs on CPU under TRITON_INTERPRET=1. Its launch shapes and argument check are kernels/mq_launch.py's
(no Triton), re-exported here.

FP8 KV cache (float8_e4m3fn pages, q in the model dtype): the kernel reads the [2] float32
(k, v) per-tensor scales from the device; k is converted to q's dtype in registers and
k_scale folded into the logit scale, v converted to the p dtype and v_scale applied to the
output (one multiply per element at the end).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from graphrt.kernels.mq_launch import (MAX_TILE_ROWS, check_multiquery, default_splits, piece_block_n,
                                       piece_launch, query_tiles)

LOG2E = 1.4426950408889634


@triton.jit(do_not_specialize=["bt_stride", "s_page", "s_slot", "s_head", "page_size", "splits", "n_tiles", "Q"])
def _mq_attention_kernel(q_ptr, k_ptr, v_ptr, bt_ptr, bt_stride, lens_ptr, qlens_ptr, out_ptr, part_ptr,
                         lse_ptr, s_page, s_slot, s_head, page_size, splits, n_tiles, qk_scale, kvs_ptr,
                         Q, HQ: tl.constexpr, HKV: tl.constexpr, D: tl.constexpr,
                         TILE_T: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                         SPLIT: tl.constexpr, PREC: tl.constexpr, KV_FP8: tl.constexpr,
                         QLENS: tl.constexpr):
    b = tl.program_id(0) // n_tiles
    t0 = (tl.program_id(0) % n_tiles) * TILE_T         # the tile's first query token
    kvh = tl.program_id(1)
    sp = tl.program_id(2)
    G: tl.constexpr = HQ // HKV
    m = tl.arange(0, BLOCK_M)
    d = tl.arange(0, D)
    j = t0 + m // G                                    # query token of tile row m
    h = kvh * G + m % G                                # its query head
    row_ok = (m < TILE_T * G) & (j < Q)
    q_off = ((b * Q + j) * HQ + h).to(tl.int64) * D
    q = tl.load(q_ptr + q_off[:, None] + d[None, :], mask=row_ok[:, None], other=0.0)
    v_scale = 1.0
    if KV_FP8:                                         # per-tensor scales, read on the device
        qk_scale = qk_scale * tl.load(kvs_ptr)
        v_scale = tl.load(kvs_ptr + 1)
    kv_len = tl.load(lens_ptr + b)
    qlen = Q
    if QLENS:                                          # the row's real query tokens (<= Q)
        qlen = tl.load(qlens_ptr + b)
    qpos = kv_len - qlen + j                           # [BLOCK_M] absolute query positions
    top = tl.minimum(kv_len, kv_len - qlen + tl.minimum(t0 + TILE_T, Q))   # causal: keys < top
    top = tl.where(t0 < qlen, top, 0)                  # a tile of padding tokens only: no keys
    n_blocks = tl.cdiv(top, BLOCK_N)
    per = tl.cdiv(n_blocks, splits)
    lo = sp * per * BLOCK_N
    hi = tl.minimum(lo + per * BLOCK_N, top)
    m_i = tl.full((BLOCK_M,), -1.0e30, tl.float32)
    l_i = tl.zeros((BLOCK_M,), tl.float32)
    acc = tl.zeros((BLOCK_M, D), tl.float32)
    n = tl.arange(0, BLOCK_N)
    for start in range(lo, hi, BLOCK_N):
        pos = start + n                                # [BLOCK_N] key positions
        key_ok = pos < hi
        page = tl.load(bt_ptr + b.to(tl.int64) * bt_stride + pos // page_size, mask=key_ok, other=0)
        kv_off = page.to(tl.int64) * s_page + (pos % page_size) * s_slot + kvh * s_head
        k = tl.load(k_ptr + kv_off[:, None] + d[None, :], mask=key_ok[:, None], other=0.0)
        if KV_FP8:
            k = k.to(q.dtype)
        s = tl.dot(q, tl.trans(k), input_precision=PREC).to(tl.float32) * qk_scale    # [BLOCK_M, BLOCK_N], log2 units
        ok = key_ok[None, :] & (pos[None, :] <= qpos[:, None])
        s = tl.where(ok, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        v = tl.load(v_ptr + kv_off[:, None] + d[None, :], mask=key_ok[:, None], other=0.0)
        if KV_FP8:
            v = v.to(q.dtype)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PREC).to(tl.float32)
        m_i = m_new
    acc = acc * v_scale
    o_row = (b * Q + j) * HQ + h                       # flat (token, head) index
    if SPLIT:
        part = (o_row.to(tl.int64) * splits + sp) * D
        tl.store(part_ptr + part[:, None] + d[None, :], acc / tl.maximum(l_i, 1e-30)[:, None],
                 mask=row_ok[:, None])
        lse = tl.where(l_i > 0, m_i + tl.log2(tl.maximum(l_i, 1e-30)), float("-inf"))
        tl.store(lse_ptr + o_row * splits + sp, lse, mask=row_ok)
    else:
        o = acc / tl.maximum(l_i, 1e-30)[:, None]
        tl.store(out_ptr + o_row.to(tl.int64)[:, None] * D + d[None, :], o.to(out_ptr.dtype.element_ty),
                 mask=row_ok[:, None])


@triton.jit(do_not_specialize=["splits"])
def _combine_kernel(part_ptr, lse_ptr, out_ptr, splits, D: tl.constexpr, SB: tl.constexpr):
    r = tl.program_id(0)                               # flat (token, head) row
    s = tl.arange(0, SB)
    d = tl.arange(0, D)
    lse = tl.load(lse_ptr + r * splits + s, mask=s < splits, other=float("-inf"))
    mx = tl.max(lse, axis=0)
    w = tl.where(lse > float("-inf"), tl.exp2(lse - tl.maximum(mx, -1.0e30)), 0.0)
    part = tl.load(part_ptr + (r.to(tl.int64) * splits + s[:, None]) * D + d[None, :],
                   mask=(s < splits)[:, None], other=0.0)
    o = tl.sum(part * w[:, None], axis=0) / tl.maximum(tl.sum(w, axis=0), 1e-30)
    tl.store(out_ptr + r.to(tl.int64) * D + d, o.to(out_ptr.dtype.element_ty))


def multiquery_attention(q: torch.Tensor, kv_cache, block_table: torch.Tensor,
                         kv_lens: torch.Tensor, *, q_lens: torch.Tensor | None = None, splits: int = 1,
                         out: torch.Tensor | None = None, block_n: int | None = None,
                         num_warps: int | None = None, num_stages: int | None = None) -> torch.Tensor:
    """q [B, Q, Hq, D] (cache dtype, contiguous) -> [B, Q, Hq, D] attention over the paged cache.

    kv_cache: graphrt PagedKVCache (NHD or HND; float8_e4m3fn pages with its `scale`: q then
    in the model dtype, bf16 / fp16 / float32); block_table [B, W] int32; kv_lens [B] int32
    keys of each row including its new tokens (0 = padding row, zeros out). q_lens [B] int32
    (optional, device): each row's real query tokens, <= Q (default Q for every row); query j
    of row b then sits at kv_lens[b] - q_lens[b] + j, and rows j >= q_lens[b] are padding
    (finite, unused). splits: static split-KV factor (see default_splits). Capturable in a
    CUDA graph (nothing depends on device values but the kernel's own loop bounds).
    block_n (keys per loop iteration, default 64), num_warps (default 8 for 128-row query tiles,
    else 4) and num_stages (Triton's software pipelining of the key loop; default Triton's):
    launch configuration only, the same arithmetic per key block.
    """
    out = check_multiquery(q, kv_cache, block_table, kv_lens, q_lens=q_lens, splits=splits, out=out,
                           block_n=block_n, num_warps=num_warps, num_stages=num_stages)
    kc, vc = kv_cache.as_tuple()
    nhd = kv_cache.layout == "NHD"
    hkv, d = (kc.shape[2], kc.shape[3]) if nhd else (kc.shape[1], kc.shape[3])
    page_size = kc.shape[1] if nhd else kc.shape[2]
    fp8 = kc.dtype == torch.float8_e4m3fn
    scale = getattr(kv_cache, "scale", None)
    b, nq, hq, _ = q.shape
    tile_t, block_m, n_tiles = query_tiles(nq, hq // hkv)
    block_n = block_n or 64
    split = splits > 1
    part = torch.empty((b * nq * hq, splits, d), dtype=torch.float32, device=q.device) if split else out
    lse = torch.empty((b * nq * hq, splits), dtype=torch.float32, device=q.device) if split else out
    _mq_attention_kernel[(b * n_tiles, hkv, splits)](
        q, kc, vc, block_table, block_table.stride(0), kv_lens, kv_lens if q_lens is None else q_lens,
        out, part, lse, kc.stride(0), kc.stride(1 if nhd else 2), kc.stride(2 if nhd else 1), page_size,
        splits, n_tiles, d ** -0.5 * LOG2E, scale if fp8 else kv_lens, nq, HQ=hq, HKV=hkv, D=d,
        TILE_T=tile_t, BLOCK_M=block_m, BLOCK_N=block_n, SPLIT=split,
        PREC="ieee" if q.dtype == torch.float32 else "tf32", KV_FP8=fp8, QLENS=q_lens is not None,
        num_warps=num_warps or (8 if block_m >= 128 else 4),   # float32: no tf32
        **({} if num_stages is None else {"num_stages": num_stages}))
    if split:
        _combine_kernel[(b * nq * hq,)](part, lse, out, splits, D=d,
                                        SB=triton.next_power_of_2(splits))
    return out


__all__ = ["multiquery_attention", "default_splits", "piece_block_n", "piece_launch", "query_tiles",
           "MAX_TILE_ROWS"]
