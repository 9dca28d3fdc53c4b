"""FP8 weights (graphrt/model/quant): quantize / dequantize / fuse against float32 math, and the
whole decoder with FP8 linear layers against independent references: per-tensor / per-channel
weights run W8A8 (activations quantized per row at every GEMM input), checked against HF
transformers in float32 with the dequantized weights and the same per-row activation
quantization applied by forward pre-hooks; block-scaled weights run weight-only, checked
against the float32 decoder over the dequantized weights (exact up to float32 rounding); both
close to the original weights."""
from __future__ import annotations

import pytest
import torch

from graphrt import RuntimeConfig
from graphrt.model import LlamaDecoder
from graphrt.model.linear import Linear, linear
from graphrt.model.quant import FP8, FP8_MAX, Fp8Weight, cat_rows, quantize_fp8
from graphrt.model.fp8_weights import dequantize_weights, quantize_weights
from graphrt.model.runtime import ModelRuntime
from graphrt.model.spec import LlamaSpec
from graphrt.model.weights import fuse_hf_state_dict

transformers = pytest.importorskip("transformers")


@pytest.mark.parametrize("strategy", ["tensor", "channel", "block"])
def test_quantize_roundtrip_error_is_bounded(strategy):
    g = torch.Generator().manual_seed(0)
    w = torch.randn(70, 200, generator=g) * torch.linspace(0.1, 3, 70)[:, None]
    w8 = quantize_fp8(w, strategy, block=(32, 64))
    assert w8.data.dtype == FP8 and w8.scale.dtype == torch.float32
    assert w8.scale.shape == ((3, 4) if strategy == "block" else (70,))
    err = (w8.dequantize() - w).abs()
    # e4m3 has 3 mantissa bits: relative rounding error <= 2^-4 of the scaled value's magnitude
    bound = w.abs() * 2.0 ** -4 + w8.dequantize().abs().max() / FP8_MAX * 2.0 ** -6
    assert bool((err <= bound + 1e-7).all())
    # the largest element of each scale group lands on +-448 exactly
    assert float(w8.data.float().abs().max()) == FP8_MAX


def test_per_tensor_scales_become_per_channel_on_fusion():
    a, b = torch.randn(8, 16), 10 * torch.randn(4, 16)
    fused = cat_rows([quantize_fp8(a, "tensor"), quantize_fp8(b, "tensor")])
    assert fused.scale.shape == (12,)
    assert len(set(fused.scale[:8].tolist())) == 1 and len(set(fused.scale[8:].tolist())) == 1
    assert fused.scale[8] > fused.scale[0]                       # each part kept its own scale
    ref = torch.cat([quantize_fp8(a, "tensor").dequantize(), quantize_fp8(b, "tensor").dequantize()])
    torch.testing.assert_close(fused.dequantize(), ref, rtol=0, atol=0)


def test_fp8_weight_and_fusion_refusals():
    with pytest.raises(ValueError, match="data"):
        Fp8Weight(torch.randn(4, 4), torch.ones(4))
    with pytest.raises(ValueError, match="scale: shape"):
        Fp8Weight(torch.zeros(4, 4, dtype=FP8), torch.ones(3))
    with pytest.raises(ValueError, match="strategy"):
        quantize_fp8(torch.randn(4, 4), "row")
    q = quantize_fp8(torch.randn(40, 32), "block", block=(32, 32))
    with pytest.raises(ValueError, match=r"parts\[0\]: 40 rows"):
        cat_rows([q, q])
    with pytest.raises(ValueError, match="mixed scale layouts"):
        cat_rows([q, quantize_fp8(torch.randn(4, 32))])


def test_linear_dispatch_on_cpu_uses_dequantized_weight():
    w8 = quantize_fp8(torch.randn(24, 40), "channel")
    x, b = torch.randn(3, 40), torch.randn(24)
    ref = x @ w8.dequantize().T + b
    torch.testing.assert_close(linear(x, w8, b), ref, rtol=1e-6, atol=1e-5)
    torch.testing.assert_close(Linear(w8, b)(x), ref, rtol=1e-6, atol=1e-5)
    assert Linear(w8).choose([1, 2]) == {}                       # CPU: nothing to time


def _hf(kind, seed=0):
    torch.manual_seed(seed)
    common = dict(vocab_size=160, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                  num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=256)
    if kind == "qwen3":
        return transformers.Qwen3ForCausalLM(transformers.Qwen3Config(
            tie_word_embeddings=False, head_dim=64, **common)).eval()
    return transformers.LlamaForCausalLM(transformers.LlamaConfig(tie_word_embeddings=False,
                                                                  **common)).eval()


def _logits(model, prompts, steps=4):
    """Prefill logits then `steps` decode steps' logits [steps + 1, B, V] (fixed token feed)."""
    cfg = RuntimeConfig(num_qo_heads=2, num_kv_heads=1, head_dim=64, page_size=16,
                        max_context_len=64, buckets=[1, 2], dtype="float32",
                        backend="torch", kv_pool_pages=16)
    mrt = ModelRuntime(model, cfg, "cpu", keep_logits=True)
    table = torch.arange(8, dtype=torch.int32).view(2, 4)[: len(prompts)]
    out = [mrt.prefill(prompts, table)]
    lens = torch.tensor([len(p) for p in prompts], dtype=torch.int32)
    gen = torch.Generator().manual_seed(1)
    for _ in range(steps):
        lens += 1
        mrt.decode(torch.randint(0, 160, (len(prompts),), generator=gen), table, lens)
        out.append(mrt.last_logits(len(prompts)).clone())
    return torch.stack(out)


def _fake_quant_rows(x: torch.Tensor) -> torch.Tensor:
    """Per-row e4m3 round trip of a float32 activation (torch): scale = amax / 448."""
    s = (x.abs().amax(-1, keepdim=True) / FP8_MAX).clamp(min=1e-12)
    return (x / s).clamp(-FP8_MAX, FP8_MAX).to(FP8).float() * s


def _hf_w8a8(hf, w8, spec, lm_head):
    """A copy of HF float32 with the FP8 model's dequantized weights and, for W8A8, every linear
    layer's input fake-quantized per row (forward pre-hooks)."""
    import copy
    ref = copy.deepcopy(hf)
    deq = dequantize_weights(w8)
    sd = ref.state_dict()
    d, hq, hkv, i = spec.head_dim, spec.num_heads, spec.num_kv_heads, spec.intermediate_size
    for n, layer in enumerate(deq.layers):
        p = f"model.layers.{n}."
        q, k, v = torch.split(layer.qkv, [hq * d, hkv * d, hkv * d])
        g, u = torch.split(layer.gate_up, [i, i])
        for name, t in (("self_attn.q_proj", q), ("self_attn.k_proj", k), ("self_attn.v_proj", v),
                        ("self_attn.o_proj", layer.o), ("mlp.gate_proj", g), ("mlp.up_proj", u),
                        ("mlp.down_proj", layer.down)):
            sd[p + name + ".weight"].copy_(t)
    sd["lm_head.weight"].copy_(deq.lm_head)
    for name, mod in ref.named_modules():
        if isinstance(mod, torch.nn.Linear) and (name != "lm_head" or lm_head):
            mod.register_forward_pre_hook(lambda m, args: (_fake_quant_rows(args[0]),))
    return ref


def _hf_reference(hf, w8, spec, prompts, fed, lm_head):
    """HF W8A8 float32 logits [steps + 1, B, V] at the positions _logits reads."""
    ref = _hf_w8a8(hf, w8, spec, lm_head)
    out = []
    with torch.no_grad():
        for b, p in enumerate(prompts):
            seq = torch.cat([p, fed[:, b]])
            logits = ref(seq[None]).logits[0]                        # [T, V]
            out.append(logits[len(p) - 1:])
    return torch.stack(out, 1)


def test_fp8_verify_step_runs_the_w8a8_layer_loop():
    """verify_step (speculative verify, Q = 3 tokens) over W8A8 weights equals HF with the same
    activation rounding: the one layer loop serves verify as it serves decode and prefill."""
    from graphrt.attention.kvcache import PagedKVCache
    hf = _hf("llama")
    spec = LlamaSpec.from_hf(hf.config)
    w8 = quantize_weights(fuse_hf_state_dict(spec, hf.state_dict()), spec, "fused-tensor", lm_head=True)
    model = LlamaDecoder(spec, w8)
    cfg = RuntimeConfig(num_qo_heads=2, num_kv_heads=1, head_dim=64, page_size=16, max_context_len=64,
                        buckets=[1], dtype="float32", backend="torch", kv_pool_pages=8)
    caches = [PagedKVCache.allocate(cfg, 8, "cpu", seed=i) for i in range(spec.num_layers)]
    prompt, toks = torch.arange(7) * 5 % 160, torch.tensor([[5, 9, 33]])
    table = torch.arange(4, dtype=torch.int32).view(1, 4)
    model.prefill([prompt], caches, table)
    err = torch.zeros(1, dtype=torch.int32)
    got = model.verify_step(toks, torch.tensor([len(prompt)], dtype=torch.int32), caches, table, err)
    with torch.no_grad():
        ref = _hf_w8a8(hf, w8, spec, True)(torch.cat([prompt, toks[0]])[None]).logits[0, -3:]
    assert int(err) == 0
    assert float((got - ref).norm() / ref.norm()) < 2e-3


def _fed_tokens(steps=4, rows=2):
    gen = torch.Generator().manual_seed(1)
    return torch.stack([torch.randint(0, 160, (rows,), generator=gen) for _ in range(steps)])


@pytest.mark.slow
@pytest.mark.parametrize("kind,strategy,lm_head", [("llama", "channel", False), ("llama", "tensor", True),
                                                   ("llama", "fused-tensor", True),
                                                   ("qwen3", "channel", False), ("qwen3", "block", False)])
def test_fp8_decoder_matches_reference(kind, strategy, lm_head):
    hf = _hf(kind)
    spec = LlamaSpec.from_hf(hf.config)
    w = fuse_hf_state_dict(spec, hf.state_dict())
    w8 = quantize_weights(w, spec, strategy, lm_head=lm_head, block=(64, 64))
    assert isinstance(w8.layers[0].qkv, Fp8Weight)
    assert isinstance(w8.lm_head, Fp8Weight) == lm_head
    assert (w8.layers[0].qkv.tensor_scale is not None) == (strategy == "fused-tensor")
    prompts = [torch.arange(5) * 7 % 160, torch.arange(11) * 3 % 160]
    got = _logits(LlamaDecoder(spec, w8), prompts)
    if strategy == "block":                                      # weight-only: exact
        ref = _logits(LlamaDecoder(spec, dequantize_weights(w8)), prompts)
        torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)
    else:
        ref = _hf_reference(hf, w8, spec, prompts, _fed_tokens(), lm_head)
        weight_only = _logits(LlamaDecoder(spec, dequantize_weights(w8)), prompts)
        err = float((got - ref).norm() / ref.norm())
        assert err < 2e-3, err                                   # same function, float32 rounding
        assert float((weight_only - ref).norm() / ref.norm()) > 5 * err   # activations quantized
    full = _logits(LlamaDecoder(spec, w), prompts)
    rel = (got - full).norm() / full.norm()
    assert 0 < float(rel) < 0.1                                  # FP8 noise, not garbage


def test_model_weights_check_names_bad_fp8_field():
    hf = _hf("llama")
    spec = LlamaSpec.from_hf(hf.config)
    w8 = quantize_weights(fuse_hf_state_dict(spec, hf.state_dict()), spec)
    from dataclasses import replace
    bad = replace(w8, layers=(replace(w8.layers[0], o=w8.layers[0].qkv),) + w8.layers[1:])
    with pytest.raises(ValueError, match=r"layers\[0\]\.o: FP8 weight of shape"):
        LlamaDecoder(spec, bad)
    bad = replace(w8, final_norm=quantize_fp8(torch.randn(1, 128)))
    with pytest.raises(ValueError, match="final_norm"):
        LlamaDecoder(spec, bad)


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
@pytest.mark.parametrize("m", [1, 5, 16, 40])
def test_fp8_matmul_w8a8_matches_float32(device, m):
    """quantize_rows -> fp8_matmul (torch._scaled_mm, unit scales) -> apply_scales equals the
    float32 product of the dequantized rows and weight (bf16 output rounding on CUDA)."""
    from graphrt.kernels.fp8 import apply_scales, quantize_rows
    from graphrt.model.linear import fp8_matmul
    g = torch.Generator().manual_seed(m)
    w8 = quantize_fp8(torch.randn(256, 512, generator=g), "channel").to(device)
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    x = torch.randn(m, 512, generator=g).to(device, dtype)
    xq = quantize_rows(x)
    for w8 in (w8, quantize_fp8(torch.randn(256, 512, generator=g), "tensor").to(device)):
        acc = fp8_matmul(xq, w8, unit=torch.ones((), device=device), out_dtype=dtype)
        assert acc.shape == (m, 256) and (acc.col_scale is None) == (w8.tensor_scale is not None)
        got = apply_scales(acc).float()
        ref = xq.dequantize() @ w8.dequantize().T
        assert float((got - ref).norm() / ref.norm()) < (1e-2 if device == "cuda" else 1e-6)
    with pytest.raises(ValueError, match="block-scaled"):
        fp8_matmul(xq, quantize_fp8(torch.randn(256, 512), "block").to(device), unit=torch.ones(()))
