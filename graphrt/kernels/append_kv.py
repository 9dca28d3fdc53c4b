"""Append each request's new K/V token into the paged cache at a slot computed on the device.

Request r writes its token at position seq_lens[r] - 1 (seq_lens count the token being decoded):
page block_table[r, pos // page_size], slot pos % page_size. Padding rows (seq_len 0) write
nothing. A position past the block table's width or a page id outside the pool is skipped and
flagged in device_error (ERR_KV_SLOT / ERR_PAGE_ID): never a write out of bounds. Layout-agnostic:
the cache strides are passed in. Grid: one program per bucket row.

FP8 cache (float8_e4m3fn pages): `kv_scale` [2] float32 (k, v) on the device is required and
the stored value is clamp(x / scale, +-448) in e4m3 (`kv_e4m3`, shared with rope_append).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from graphrt.kernels.fp8 import round_e4m3
from graphrt.kernels.flags import ERR_KV_SLOT, ERR_PAGE_ID



@triton.jit
def kv_e4m3(x, scale):
    """float32 x -> clamp(x / scale, +-448) rounded to the nearest e4m3 value (ties to even), as
    float32 (exactly representable: the cast to float8_e4m3fn is then exact). IEEE division, so
    the codes equal torch's `(x / scale).clamp(-448, 448).to(torch.float8_e4m3fn)`."""
    return round_e4m3(tl.minimum(tl.maximum(tl.div_rn(x, scale), -448.0), 448.0))


@triton.jit(do_not_specialize=["bt_stride", "max_pages", "num_pool_pages", "page_size",
                               "s_page", "s_slot", "s_head", "s_row"])
def _append_kv_kernel(k_ptr, v_ptr, k_cache_ptr, v_cache_ptr, block_table_ptr, bt_stride,
                      seq_lens_ptr, error_ptr, max_pages, num_pool_pages, page_size,
                      s_page, s_slot, s_head, s_row, kvs_ptr,
                      HKV: tl.constexpr, D: tl.constexpr, BLOCK_H: tl.constexpr,
                      KV_FP8: tl.constexpr):
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
                k = tl.load(k_ptr + src, mask=m)
                v = tl.load(v_ptr + src, mask=m)
                if KV_FP8:   # per-tensor scales: stored = clamp(x / scale, +-448) in e4m3
                    k = kv_e4m3(k.to(tl.float32), tl.load(kvs_ptr))
                    v = kv_e4m3(v.to(tl.float32), tl.load(kvs_ptr + 1))
                ty = k_cache_ptr.dtype.element_ty
                tl.store(k_cache_ptr + dst, k.to(ty), mask=m)
                tl.store(v_cache_ptr + dst, v.to(ty), mask=m)


def append_kv(k: torch.Tensor, v: torch.Tensor, kv_cache, block_table: torch.Tensor,
              seq_lens: torch.Tensor, device_error: torch.Tensor, *,
              kv_scale: torch.Tensor | None = None) -> None:
    """k, v: [B, Hkv, D] contiguous (the cache dtype, or any float dtype for an FP8 cache);
    block_table [B, max_pages] int32; seq_lens [B] int32 (including the new token); kv_scale
    [2] float32 exactly for a float8_e4m3fn cache; all on the cache's device."""
    kc, vc = kv_cache.as_tuple()
    fp8 = kc.dtype == torch.float8_e4m3fn
    if fp8 != (kv_scale is not None):
        raise ValueError(f"kv_scale: give a [2] float32 (k, v) scale tensor exactly when the cache is "
                         f"float8_e4m3fn (cache dtype {kc.dtype})")
    if fp8 and (kv_scale.dtype != torch.float32 or tuple(kv_scale.shape) != (2,)):
        raise ValueError(f"kv_scale: expected [2] float32, got {tuple(kv_scale.shape)} {kv_scale.dtype}")
    b, hkv, d = k.shape
    if kv_cache.layout == "NHD":  # [pages, P, H, D]
        s_page, s_slot, s_head = kc.stride(0), kc.stride(1), kc.stride(2)
    else:                         # [pages, H, P, D]
        s_page, s_slot, s_head = kc.stride(0), kc.stride(2), kc.stride(1)
    page_size = kc.shape[1] if kv_cache.layout == "NHD" else kc.shape[2]
    _append_kv_kernel[(b,)](
        k, v, kc, vc, block_table, block_table.stride(0), seq_lens, device_error,
        block_table.shape[1], kc.shape[0], page_size, s_page, s_slot, s_head, k.stride(0),
        kv_scale if fp8 else seq_lens, HKV=hkv, D=d, BLOCK_H=triton.next_power_of_2(hkv),
        KV_FP8=fp8, num_warps=1)


__all__ = ["append_kv", "ERR_KV_SLOT", "ERR_PAGE_ID"]
