"""Decode attention over an FP8 (e4m3) KV cache through DecodeRuntime: the reference, the torch
split-KV (device planner) and graphrt's triton-decode backends equal float32 attention over the
dequantized pages (tight) and stay close to the float pages before quantization (loose,
printed); FP8 config and cache refusals. FlashInfer's FP8 decode: GPU tests (tests/attention/test_fp8_kv_gpu.py)."""
from __future__ import annotations

import pytest
import torch

from graphrt import DecodeRuntime, PagedKVCache, RuntimeConfig
from graphrt.attention.reference import reference_decode
from graphrt.config import ConfigError
from graphrt.model.quant import FP8
from graphrt.model.quant.kv import quantize_kv


def _config(backend, **kw):
    kw = {"dtype": "float32", "kv_cache_dtype": "fp8"} | kw
    return RuntimeConfig(num_qo_heads=8, num_kv_heads=2, head_dim=64, page_size=16, max_context_len=128,
                         buckets=[1, 4], backend=backend, kv_pool_pages=24, **kw)


@pytest.mark.parametrize("backend,layout", [("reference", "NHD"), ("torch-splitkv", "HND"),
                                            ("triton-decode", "NHD"), ("triton-decode", "HND")])
def test_decode_over_fp8_pages(backend, layout):
    cfg = _config(backend, kv_layout=layout)
    g = torch.Generator().manual_seed(3)
    shape = PagedKVCache.allocate(cfg, 24, "cpu").k.shape
    kf, vf = torch.randn(shape, generator=g) * 3, torch.randn(shape, generator=g)
    scale = torch.tensor([float(kf.abs().max()) / 448, float(vf.abs().max()) / 448])
    cache = PagedKVCache(quantize_kv(kf, scale[0]), quantize_kv(vf, scale[1]), layout, scale)
    rt = DecodeRuntime(cfg, cache, "cpu")
    rt.capture()
    q = torch.randn(4, 8, 64, generator=g)
    table = torch.randperm(24, generator=g)[:24].view(3, 8).repeat(2, 1)[:4].to(torch.int32)
    lens = torch.tensor([1, 37, 128, 90], dtype=torch.int32)
    out = rt.decode(q, table, lens).clone()
    tight = reference_decode(q, cache.k.float() * scale[0], cache.v.float() * scale[1], table, lens,
                             layout=layout)
    torch.testing.assert_close(out, tight, rtol=1e-4, atol=1e-5)
    loose = reference_decode(q, kf, vf, table, lens, layout=layout)
    rel = float((out - loose).norm() / loose.norm())
    print(f"{backend} decode, FP8 KV vs float KV: rel. error {rel:.4f}")
    assert rel < 0.08


def test_fp8_config_and_cache_refusals():
    assert _config("reference").kv_torch_dtype == FP8
    assert _config("reference").replace(kv_cache_dtype="auto").kv_cache_dtype == "float32"
    with pytest.raises(ConfigError, match="kv_cache_dtype: 'int4' is not one of"):
        _config("reference").replace(kv_cache_dtype="int4")
    with pytest.raises(ConfigError, match="kv_cache_dtype: 'bfloat16' differs from dtype"):
        _config("reference").replace(kv_cache_dtype="bfloat16")
    with pytest.raises(ConfigError, match="kv_cache_dtype: 'fp8' is not supported by backend 'xqa'"):
        _config("xqa", dtype="bfloat16")
    cfg = _config("reference")
    cache = PagedKVCache.allocate(cfg, 24, "cpu")
    assert cache.k.dtype == FP8 and cache.scale.tolist() == [1.0, 1.0]
    with pytest.raises(ValueError, match="scale: a \\[2\\] float32"):
        PagedKVCache(cache.k, cache.v, "NHD")
    with pytest.raises(ValueError, match="scale: expected \\[2\\] float32"):
        PagedKVCache(cache.k, cache.v, "NHD", torch.ones(3))
    f32 = PagedKVCache.allocate(cfg.replace(kv_cache_dtype="auto"), 24, "cpu")
    with pytest.raises(ValueError, match="kv_cache.k: dtype torch.float32, config's KV dtype"):
        DecodeRuntime(cfg, f32, "cpu")
