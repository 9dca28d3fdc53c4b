"""GPU tests of the fused GEMV layer (graphrt/model/fuse.py, kernels/gemv.py norm= / silu= /
residual=) at Llama-3.2-1B / 3.1-8B shapes (H200): each fused GEMV against the unfused kernels
(SiLU-mul and the residual add bitwise against the same GEMV config; the RMSNorm prologue and
cuBLAS within bf16 rounding), eagerly and replayed from a CUDA graph with fresh inputs; the
measured plan over a few random 8B layers (timings printed: pytest -s); ModelRuntime decode
graphs fused on / off / auto giving the same logits within bf16 rounding.

Run on the GPU machine: python -m pytest -m gpu -q -s tests/model/test_fuse_gpu.py
"""
from __future__ import annotations

import time

import pytest
import torch
import torch.nn.functional as F

from graphrt.kernels.activation import silu_mul
from graphrt.kernels.gemv import CANDIDATES, gemv
from graphrt.kernels.norm import add_rms_norm, rms_norm
from graphrt.kernels.timing import capture

pytestmark = pytest.mark.gpu
EPS = 1e-5
SHAPES = {"1b.qkv": (3072, 2048), "1b.down": (2048, 8192), "8b.gate_up": (28672, 4096), "8b.o": (4096, 4096)}


def _rel(a, b) -> float:
    return float((a.float() - b.float()).norm() / b.float().norm())


@pytest.mark.parametrize("name", list(SHAPES))
@pytest.mark.parametrize("m", [1, 16])
@pytest.mark.parametrize("cfg", CANDIDATES)
def test_fused_gemvs_match_the_unfused_kernels(name, m, cfg):
    n, k = SHAPES[name]
    gen = torch.Generator(device="cuda").manual_seed(m)
    w = (torch.randn(n, k, generator=gen, device="cuda") * 0.02).bfloat16()
    g = (1 + 0.1 * torch.randn(k, generator=gen, device="cuda")).bfloat16()
    x = torch.randn(m, k, generator=gen, device="cuda").bfloat16()
    gu = torch.randn(m, 2 * k, generator=gen, device="cuda").bfloat16()
    res0 = torch.randn(m, n, generator=gen, device="cuda").bfloat16()
    # SiLU-mul prologue (+ the residual add): bitwise the unfused kernels with the same config
    assert torch.equal(gemv(gu, w, silu=True, config=cfg), gemv(silu_mul(gu), w, config=cfg))
    r1, r2 = res0.clone(), res0.clone()
    gemv(gu, w, silu=True, residual=r1, config=cfg)
    add_rms_norm(gemv(silu_mul(gu), w, config=cfg), r2, torch.ones(n, device="cuda", dtype=torch.bfloat16), EPS)
    assert torch.equal(r1, r2)
    # RMSNorm prologue: rms_norm then the GEMV, and cuBLAS, within bf16 rounding
    y = gemv(x, w, norm=g, eps=EPS, config=cfg)
    assert _rel(y, gemv(rms_norm(x, g, EPS), w, config=cfg)) < 4e-3
    assert _rel(y, F.linear(rms_norm(x, g, EPS), w)) < 1e-2
    # replayed from a graph with fresh inputs
    res = res0.clone()
    held = {}

    def step():
        held["y"] = gemv(x, w, norm=g, eps=EPS, config=cfg)
        gemv(gu, w, silu=True, residual=res, config=cfg)
    graph = capture(step)
    for seed in range(2):
        g2 = torch.Generator(device="cuda").manual_seed(100 + seed)
        x.copy_(torch.randn(m, k, generator=g2, device="cuda"))
        gu.copy_(torch.randn(m, 2 * k, generator=g2, device="cuda"))
        res.copy_(res0)
        graph.replay()
        want = res0.clone()
        add_rms_norm(F.linear(silu_mul(gu), w), want, torch.ones(n, device="cuda", dtype=torch.bfloat16), EPS)
        assert _rel(held["y"], F.linear(rms_norm(x, g, EPS), w)) < 1e-2
        assert _rel(res - res0, want - res0) < 1e-2


def _random_8b(layers, vocab=4096):
    from graphrt.model import LlamaDecoder, LlamaSpec
    from graphrt.parallel.random_weights import random_weights
    spec = LlamaSpec(vocab_size=vocab, hidden_size=4096, intermediate_size=14336, num_layers=layers,
                     num_heads=32, num_kv_heads=8, head_dim=128, rms_norm_eps=1e-5, rope_theta=500000.0,
                     tie_word_embeddings=False, attention_bias=False, max_position_embeddings=4096)
    return LlamaDecoder(spec, random_weights(spec, dtype=torch.bfloat16, device="cuda"))


def test_measured_plan_on_8b_layers(monkeypatch):
    """The measured choice over 8 random 8B layers (timings printed; scale by 32 / 8 for the
    whole model's measurement time)."""
    monkeypatch.delenv("GRAPHRT_FUSE", raising=False)
    from graphrt.model.fuse import GEMMS, plan_fuse
    model = _random_8b(8)
    plan_fuse(model, [1], "auto")                                   # first-use costs (compiles) apart
    t0 = time.perf_counter()
    plan = plan_fuse(model, [1, 4, 16, 32], "auto")
    took = time.perf_counter() - t0
    assert plan.source == "measured" and set(plan.table) <= {1, 4, 16}
    print(f"\nfuse plan {sorted(plan.table)} in {took:.2f} s over 8 layers")
    for m in (1, 4, 16):
        t = plan.timings_us
        print(f"  M={m:<3} per layer fused {t[(m, 'fused')] / 8:6.2f} us, unfused {t[(m, 'unfused')] / 8:6.2f} us; "
              + " ".join(f"{g} {min(us for (r, key), us in t.items() if r == m and key[0:1] == (g,)) / 8:.2f}"
                         for g in GEMMS))
    assert took < 5.0


def test_decode_graph_fused_equals_unfused(monkeypatch):
    """The float logits of decode graphs fused on and auto against off, both buckets, from the
    same prefill and fed tokens."""
    monkeypatch.delenv("GRAPHRT_FUSE", raising=False)
    from graphrt import RuntimeConfig
    from graphrt.model.runtime import ModelRuntime
    model = _random_8b(2)
    cfg = RuntimeConfig(num_qo_heads=32, num_kv_heads=8, head_dim=128, page_size=16, max_context_len=256,
                        buckets=[1, 16], dtype="bfloat16", backend="flashinfer", kv_pool_pages=16 * 16 + 1)
    gen = torch.Generator().manual_seed(0)
    prompts = [torch.randint(0, 4096, (int(n),), generator=gen).cuda() for n in torch.randint(1, 100, (16,))]
    table = torch.arange(16 * 16, dtype=torch.int32, device="cuda").view(16, 16)
    feed = torch.randint(0, 4096, (3, 16), generator=gen).cuda()
    out = {}
    for fuse in ("off", "on", "auto"):
        mrt = ModelRuntime(model, cfg, "cuda", keep_logits=True, fuse=fuse)
        mrt.capture()
        assert (sorted(mrt.fuse.table) == [1, 16]) if fuse == "on" else \
            (mrt.fuse.table == {} if fuse == "off" else mrt.fuse.source == "measured")
        print(f"\nfuse={fuse}: fused buckets {sorted(mrt.fuse.table)}")
        mrt.prefill(prompts, table)
        lens = torch.tensor([p.numel() for p in prompts], dtype=torch.int32, device="cuda")
        steps = []
        for n in (1, 16):
            for t in feed:
                lens[:n] += 1
                mrt.decode(t[:n], table[:n], lens[:n])
                steps.append(mrt.last_logits(n).clone())
        out[fuse] = steps
        del mrt
    for a, b, c in zip(out["on"], out["off"], out["auto"]):
        assert _rel(a, b) < 3e-2 and _rel(c, b) < 3e-2, (_rel(a, b), _rel(c, b))
