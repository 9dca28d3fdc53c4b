"""GPU tests of the FP8 (e4m3) KV cache (H200 + FlashInfer): decode through captured graphs with
the device planner (plan checked at capture against FlashInfer's own plan() for the FP8 KV dtype)
and with FlashInfer's host plan(), tensor-core and CUDA-core kernels, against float32 attention
over the dequantized pages; FlashInfer batch prefill over FP8 pages against the torch reference;
the verify kernel on the GPU; an LLM with kv_cache_dtype="fp8" on the 8B-shaped checkpoint:
greedy agreement with the bf16 KV run printed.

Run on the GPU machine: python -m pytest -m gpu -q tests/attention/test_fp8_kv_gpu.py -s
"""
from __future__ import annotations

import pytest
import torch

from graphrt import DecodeRuntime, PagedKVCache, load_config
from graphrt.attention.verify import verify_bucket
from graphrt.model.quant.kv import quantize_kv

pytestmark = pytest.mark.gpu
CONFIG = "configs/llama-3.1-8b.yaml"
TOL = 2e-2      # bf16 q and output vs float32 over the same (dequantized) pages


def _fp8_cache(cfg, pages, seed=0):
    g = torch.Generator().manual_seed(seed)
    shape = PagedKVCache.allocate(cfg.replace(kv_cache_dtype="auto"), 1, "cpu").k.shape[1:]
    kf = torch.randn((pages, *shape), generator=g) * 4
    vf = torch.randn((pages, *shape), generator=g)
    scale = torch.tensor([float(kf.abs().max()) / 448, float(vf.abs().max()) / 448])
    return PagedKVCache(quantize_kv(kf, scale[0]).cuda(), quantize_kv(vf, scale[1]).cuda(),
                        cfg.kv_layout, scale.cuda())


@pytest.mark.parametrize("backend,kernel", [("flashinfer", "tensor-core"), ("flashinfer", "cuda-core"),
                                            ("flashinfer-hostplan", "tensor-core")])
def test_flashinfer_fp8_decode_matches_reference(backend, kernel):
    cfg = load_config(CONFIG).replace(kv_cache_dtype="fp8", decode_kernel=kernel, buckets=[1, 4, 16],
                                      max_context_len=8192)
    rt = DecodeRuntime(cfg, _fp8_cache(cfg, 4096), "cuda", backend=backend)
    rt.capture()
    if backend == "flashinfer":
        assert rt.backend.planner == "device", rt.backend.fallback_reason      # FP8 parity held
    for b in (1, 4, 16):
        err = verify_bucket(rt, b, steps=3, lengths=[1, 17, 1000, 8192])
        print(f"{backend} {kernel} FP8 KV bucket {b}: rel. error {err:.2e}")
        assert err < TOL


def test_flashinfer_fp8_prefill_matches_reference():
    from graphrt.model.prefill import PrefillAttention, plan_chunks, reference_prefill
    cfg = load_config(CONFIG).replace(kv_cache_dtype="fp8", max_context_len=4096)
    cache = _fp8_cache(cfg, 512, seed=1)
    attn = PrefillAttention(cfg, "cuda")
    table = torch.arange(512, dtype=torch.int32).view(4, 128)
    chunk = plan_chunks([300, 1200, 7, 2048], max_tokens=8192)[0]
    meta = attn.plan(chunk, table)
    q = torch.randn(sum(chunk.lens), cfg.num_qo_heads, cfg.head_dim, device="cuda", dtype=torch.bfloat16)
    got = attn.run(q, cache)
    want = reference_prefill(q, cache, meta, cfg)
    err = float((got.float() - want.float()).norm() / want.float().norm())
    print(f"FlashInfer FP8 prefill: rel. error {err:.2e}")
    assert err < TOL


def test_multiquery_fp8_on_gpu():
    from graphrt.kernels.multiquery_attention import multiquery_attention
    cfg = load_config(CONFIG).replace(kv_cache_dtype="fp8")
    cache = _fp8_cache(cfg, 64, seed=2)
    table = torch.arange(64, dtype=torch.int32, device="cuda").view(4, 16)
    lens = torch.tensor([5, 100, 256, 33], dtype=torch.int32, device="cuda")
    q = torch.randn(4, 5, cfg.num_qo_heads, cfg.head_dim, device="cuda", dtype=torch.bfloat16)
    out = multiquery_attention(q, cache, table, lens, splits=3)
    k = cache.k.float() * cache.scale[0]
    v = cache.v.float() * cache.scale[1]
    g = cfg.num_qo_heads // cfg.num_kv_heads
    for b in range(4):
        n = int(lens[b])
        kk = k[table[b].long()].flatten(0, 1)[:n].repeat_interleave(g, 1)
        vv = v[table[b].long()].flatten(0, 1)[:n].repeat_interleave(g, 1)
        s = torch.einsum("qhd,khd->hqk", q[b].float(), kk) / cfg.head_dim ** 0.5
        s = s.masked_fill(torch.arange(n, device="cuda")[None, :] > torch.arange(n - 5, n, device="cuda")[:, None],
                          float("-inf"))
        want = torch.einsum("hqk,khd->qhd", torch.softmax(s, -1), vv)
        err = float((out[b].float() - want).norm() / want.norm())
        assert err < TOL, (b, err)


def test_llm_fp8_kv_on_gpu(ckpt_8b):
    from graphrt import LLM, SamplingParams
    params = SamplingParams(max_tokens=32, temperature=0.0, ignore_eos=True)
    gen = torch.Generator().manual_seed(0)
    prompts = [torch.randint(2, 4096, (int(n),), generator=gen).tolist() for n in (5, 40, 300, 1000)]
    kw = dict(device="cuda", max_batch=4, steps_per_graph=4, max_model_len=2048, gpu_memory_utilization=0.5)
    bf16 = LLM(ckpt_8b, **kw)
    ref = bf16.generate(prompts, params, use_tqdm=False)
    del bf16
    torch.cuda.empty_cache()
    llm = LLM(ckpt_8b, kv_cache_dtype="fp8", **kw)
    outs = llm.generate(prompts, params, use_tqdm=False)
    mrt = llm.runtime.runtime
    assert mrt.kv_scale_source == "calibrated" and mrt.kv_caches[0].k.dtype == torch.float8_e4m3fn
    same = sum(a == b for o, r in zip(outs, ref) for a, b in zip(o.token_ids, r.token_ids))
    print(f"8B-shaped, FP8 KV vs bf16 KV greedy agreement: {same}/{32 * len(prompts)} tokens")
    assert all(len(o.token_ids) == 32 for o in outs)
