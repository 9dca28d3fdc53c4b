"""Append each request's new K/V token into the paged cache at a slot computed on the device.

Request r writes its token at position seq_lens[r] - 1 (seq_lens count the token being decoded):
page block_table[r, pos // page_size], slot pos % page_size. Padding rows (seq_len 0) write
nothing. A position past the block table's width or a page id outside the pool is skipped and
flagged in device_error (ERR_KV_SLOT / ERR_PAGE_ID): never a write out of bounds. Layout-agnostic:
the cache strides are passed in. Grid: one program per bucket row.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from graphrt.kernels.prepare import ERR_PAGE_ID

ERR_KV_SLOT = 8


@triton.jit(do_not_specialize=["bt_stride", "max_pages", "num_pool_pages", "page_size",
                               "s_page", "s_slot", "s_head", "s_row"])
def _append_kv_kernel(k_ptr, v_ptr, k_cache_ptr, v_cache_ptr, block_table_ptr, bt_stride,
                      seq_lens_ptr, error_ptr, max_pages, num_pool_pages, page_size,
                      s_page, s_slot, s_head, s_row,
                      HKV: tl.constexpr, D: tl.constexpr, BLOCK_H: tl.constexpr):
    r = tl.program_id(0)
    seq = tl.load(seq_lens_ptr + r)
    if seq > 0:
        pos = seq - 1
        col = pos // page_size
        if col >= max_pages:
            tl.atomic_or(error_ptr, 8)
        else:
            page = tl.load(block_table_ptr + r * bt_stride + col)
            if (page < 0) | (page >= num_pool_pages):
                tl.atomic_or(error_ptr, 2)
            else:
                h = tl.arange(0, BLOCK_H)[:, None]
                d = tl.arange(0, D)[None, :]
                m = h < HKV
                src = r * s_row + h * D + d
                dst = page.to(tl.int64) * s_page + (pos % page_size) * s_slot + h * s_head + d
                tl.store(k_cache_ptr + dst, tl.load(k_ptr + src, mask=m), mask=m)
                tl.store(v_cache_ptr + dst, tl.load(v_ptr + src, mask=m), mask=m)


def append_kv(k: torch.Tensor, v: torch.Tensor, kv_cache, block_table: torch.Tensor,
              seq_lens: torch.Tensor, device_error: torch.Tensor) -> None:
    """k, v: [B, Hkv, D] contiguous (cache dtype); block_table [B, max_pages] int32;
    seq_lens [B] int32 (including the new token); all on the cache's device."""
    kc, vc = kv_cache.as_tuple()
    b, hkv, d = k.shape
    if kv_cache.layout == "NHD":  # [pages, P, H, D]
        s_page, s_slot, s_head = kc.stride(0), kc.stride(1), kc.stride(2)
    else:                         # [pages, H, P, D]
        s_page, s_slot, s_head = kc.stride(0), kc.stride(2), kc.stride(1)
    page_size = kc.shape[1] if kv_cache.layout == "NHD" else kc.shape[2]
    _append_kv_kernel[(b,)](
        k, v, kc, vc, block_table, block_table.stride(0), seq_lens, device_error,
        block_table.shape[1], kc.shape[0], page_size, s_page, s_slot, s_head, k.stride(0),
        HKV=hkv, D=d, BLOCK_H=triton.next_power_of_2(hkv), num_warps=1)


__all__ = ["append_kv", "ERR_KV_SLOT", "ERR_PAGE_ID"]
