"""FP8 KV cache values: rope_append writing e4m3 with per-tensor k / v scales (decode and
prefill, NHD / HND) against the same kernel writing float32, read back through
graphrt/model/quant/kv.py; refusals. TRITON_INTERPRET=1 on CPU."""
from __future__ import annotations

import pytest
import torch

from graphrt.attention.kvcache import PagedKVCache
from graphrt.kernels.rope_append import rope_append_decode, rope_append_prefill
from graphrt.model.quant import FP8
from graphrt.model.quant.kv import calibrate_scale, dequantize_kv, kv_scales, quantize_kv

HQ, HKV, D, PAGE = 4, 2, 64, 16


def _caches(layout, pages=6):
    shape = (pages, PAGE, HKV, D) if layout == "NHD" else (pages, HKV, PAGE, D)
    f32 = PagedKVCache(torch.zeros(shape), torch.zeros(shape), layout)
    f8 = PagedKVCache(torch.zeros(shape, dtype=FP8), torch.zeros(shape, dtype=FP8), layout, kv_scales())
    return f32, f8


def _cos_sin(n=64):
    inv = 1.0 / (10000 ** (torch.arange(0, D, 2).float() / D))
    ang = torch.arange(n).float()[:, None] * inv[None]
    return torch.cat([ang.cos(), ang.sin()], dim=1).contiguous()


def _representable(shape, g, scale):
    """Random values whose x / scale is an e4m3 normal number: the CPU interpreter's float32 ->
    e4m3 conversion mis-rounds (ties, mantissa carry, subnormals; Triton 3.9 interpreter), so
    on CPU the kernel's own rounding is kept out of the comparison; the GPU test covers it."""
    e = (torch.randn(shape, generator=g) * 40).to(FP8).float()
    e = torch.where(e.abs() < 2 ** -6, torch.full_like(e, 0.5), e)
    return e * scale


@pytest.mark.parametrize("layout", ["NHD", "HND"])
def test_fp8_cache_holds_scaled_values_prefill(layout):
    """Five requests' tokens at position 0 (RoPE is the identity there) into fp8 pages: every
    stored byte equals the float value / scale in e4m3; a value past 448 * scale saturates."""
    g = torch.Generator().manual_seed(len(layout))
    scale = kv_scales(0.05, 0.02)
    t = 5
    qkv = torch.randn(t, (HQ + 2 * HKV) * D, generator=g)
    qkv[:, HQ * D:(HQ + HKV) * D] = _representable((t, HKV * D), g, 0.05)
    qkv[:, (HQ + HKV) * D:] = _representable((t, HKV * D), g, 0.02)
    qkv[0, HQ * D] = 900 * 0.05                                  # saturates at +448
    table = torch.tensor([[3, 0], [1, 0], [0, 0], [2, 0], [5, 0]], dtype=torch.int32)
    pos, rows = torch.zeros(t, dtype=torch.int32), torch.arange(t, dtype=torch.int32)
    (f32, f8), err = _caches(layout), torch.zeros(1, dtype=torch.int32)
    rope_append_prefill(qkv, _cos_sin(), f8, table, pos, rows, err, num_q_heads=HQ, kv_scale=scale)
    rope_append_prefill(qkv, _cos_sin(), f32, table, pos, rows, err, num_q_heads=HQ)
    assert int(err) == 0
    for got, ref, s in ((f8.k, f32.k, scale[0]), (f8.v, f32.v, scale[1])):
        assert bool((ref != 0).any())                            # slots were written
        torch.testing.assert_close(dequantize_kv(got, s), dequantize_kv(quantize_kv(ref, s), s),
                                   rtol=0, atol=0)
    assert float(f8.k.float().abs().max()) == 448.0              # the 900 saturated, not NaN


@pytest.mark.gpu
@pytest.mark.parametrize("layout", ["NHD", "HND"])
def test_fp8_cache_decode_rounding_on_gpu(layout):
    """Random values at random positions: the fp8 cache is the float32 cache rounded once
    (RNE, saturating): equal to torch's conversion but for rare double-rounding ties."""
    g = torch.Generator().manual_seed(3)
    t = 5
    qkv = (torch.randn(t, (HQ + 2 * HKV) * D, generator=g) * 3).cuda()
    table = torch.tensor([[3, 1, 0], [2, 4, 5]], dtype=torch.int32).repeat(3, 1)[:t].cuda()
    lens = torch.tensor([1, 17, 33, 16, 20], dtype=torch.int32).cuda()
    scale = kv_scales(0.01, 0.02, device="cuda")
    caches = [PagedKVCache(c.k.cuda(), c.v.cuda(), layout, None if c.scale is None else c.scale.cuda())
              for c in _caches(layout)]
    for cache, ks in zip(caches, (None, scale)):
        rope_append_decode(qkv, _cos_sin().cuda(), cache, table, lens,
                           torch.zeros(1, dtype=torch.int32, device="cuda"), num_q_heads=HQ, kv_scale=ks)
    for got, ref, s in ((caches[1].k, caches[0].k, scale[0]), (caches[1].v, caches[0].v, scale[1])):
        want = quantize_kv(ref, s)
        assert float((got.float() == want.float()).float().mean()) > 0.999
        diff = (dequantize_kv(got, s) - dequantize_kv(want, s)).abs()
        assert bool((diff <= dequantize_kv(want, s).abs() * 2 ** -3 + s * 2 ** -9).all())


def test_kv_scale_refusals():
    f32, f8 = _caches("NHD")
    qkv, err = torch.randn(1, (HQ + 2 * HKV) * D), torch.zeros(1, dtype=torch.int32)
    table, lens = torch.zeros(1, 3, dtype=torch.int32), torch.ones(1, dtype=torch.int32)
    with pytest.raises(ValueError, match="kv_scale: give a"):
        rope_append_decode(qkv, _cos_sin(), f8, table, lens, err, num_q_heads=HQ)
    with pytest.raises(ValueError, match="kv_scale: give a"):
        rope_append_decode(qkv, _cos_sin(), f32, table, lens, err, num_q_heads=HQ, kv_scale=kv_scales())
    with pytest.raises(ValueError, match=r"kv_scale: expected \[2\] float32"):
        rope_append_decode(qkv, _cos_sin(), f8, table, lens, err, num_q_heads=HQ,
                           kv_scale=torch.ones(3))
    with pytest.raises(ValueError, match="k_scale: expected a finite float > 0"):
        kv_scales(0.0)
    with pytest.raises(ValueError, match="x: expected"):
        dequantize_kv(torch.zeros(2), 1.0)


def test_reference_decode_reads_fp8_pages_with_scales():
    """The float32 decode oracle over fp8 pages + scales equals it over the dequantized pages."""
    from graphrt.attention.reference import reference_decode
    g = torch.Generator().manual_seed(5)
    shape = (6, PAGE, HKV, D)
    k8 = quantize_kv(torch.randn(shape, generator=g), 0.01)
    v8 = quantize_kv(torch.randn(shape, generator=g), 0.02)
    q = torch.randn(2, HQ, D, generator=g)
    table = torch.tensor([[3, 1, 0], [2, 4, 5]], dtype=torch.int32)
    lens = torch.tensor([20, 40], dtype=torch.int32)
    got = reference_decode(q, k8, v8, table, lens, k_scale=0.01, v_scale=0.02)
    ref = reference_decode(q, dequantize_kv(k8, 0.01), dequantize_kv(v8, 0.02), table, lens)
    torch.testing.assert_close(got, ref, rtol=0, atol=0)
    assert float(got.abs().sum()) > 0
