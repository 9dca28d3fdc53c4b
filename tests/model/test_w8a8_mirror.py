"""The W8A8 reference of the FP8 GPU tests (tests/_w8a8_mirror.py) on CPU: its GEMM arithmetic
is graphrt's (quantize_rows kernel, fp8_matmul, the consumer's scale multiply) bit for bit, and
on an HF float32 model its hooks round exactly where graphrt's bf16 W8A8 step rounds."""
from __future__ import annotations

import pytest
import torch

from _w8a8_mirror import ATTN, bf16, channel_codes, mirror_w8a8, quantize_rows, w8a8_linear
from graphrt.kernels.fp8 import quantize_rows as graphrt_quantize_rows
from graphrt.model.linear import fp8_matmul
from graphrt.model.quant import quantize_fp8

transformers = pytest.importorskip("transformers")


def test_mirror_gemm_is_graphrts_w8a8_arithmetic():
    g = torch.Generator().manual_seed(0)
    w8 = quantize_fp8(torch.randn(96, 1024, generator=g) * torch.rand(96, 1, generator=g) * 3, "channel")
    codes, cs = channel_codes(w8.dequantize())
    assert torch.equal(codes, w8.data.float()) and torch.equal(cs, w8.scale)
    x = torch.randn(7, 1024, generator=g) * 5
    x[2] *= 1e-3                                                 # rows of very different scales
    x[4] = 0.0                                                   # an all-zero row: scale 1e-12
    q, s = quantize_rows(x)
    rows = graphrt_quantize_rows(x)                              # Triton (interpreter on CPU)
    assert torch.equal(q, rows.data[:7].float()) and torch.equal(s[:, 0], rows.scale)
    acc = fp8_matmul(rows, w8, unit=torch.ones(()), out_dtype=torch.bfloat16)
    assert torch.equal(w8a8_linear(x, codes, cs), acc.reference())   # bf16(acc) * s_row * s_col


def _tiny_hf():
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=128, hidden_size=128, intermediate_size=256,
                                   num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                                   max_position_embeddings=64, tie_word_embeddings=False)
    hf = transformers.LlamaForCausalLM(cfg).eval()
    with torch.no_grad():
        for name, p in hf.named_parameters():
            p.copy_(bf16(p * 20 if "norm" not in name else 1 + 0.1 * torch.randn_like(p)))
            if p.dim() == 2 and "embed" not in name and "lm_head" not in name:
                p.copy_(quantize_fp8(p, "channel").dequantize())     # per-channel FP8 values
    return hf


def _is_bf16(x):
    return torch.equal(x, bf16(x))


def test_mirror_rounds_where_graphrt_rounds():
    """Spies registered after the mirror's hooks see: every linear layer's output equal to the
    W8A8 arithmetic of its input (o_proj: of the bf16 attention output), a bf16 residual stream
    at every norm input and layer output, a bf16 final-norm output, and the bf16-q/k/v attention."""
    hf = _tiny_hf()
    with torch.no_grad():
        plain = hf(torch.arange(9)[None] * 7 % 128).logits
    mirror_w8a8(hf)
    assert hf.config._attn_implementation == ATTN
    seen = []

    def linear_spy(name):
        def spy(m, args, out):
            x = bf16(args[0]) if name.endswith("o_proj") else args[0]
            assert torch.equal(out, w8a8_linear(x, m._w8a8_codes, m._w8a8_scale)), name
            seen.append(name)
        return spy

    def bf16_spy(where, pick):
        def spy(m, args, *out):
            assert _is_bf16(pick(args, out)), where
            seen.append(where)
        return spy
    for name, mod in hf.named_modules():
        if isinstance(mod, torch.nn.Linear) and name != "lm_head":
            mod.register_forward_hook(linear_spy(name))
        elif name.endswith(("input_layernorm", "post_attention_layernorm")):
            mod.register_forward_pre_hook(bf16_spy(name, lambda a, o: a[0]))
    for i, layer in enumerate(hf.model.layers):
        layer.register_forward_hook(bf16_spy(f"layer {i} out", lambda a, o: o[0]))
    hf.model.norm.register_forward_hook(bf16_spy("final norm out", lambda a, o: o[0]))
    with torch.no_grad():
        got = hf(torch.arange(9)[None] * 7 % 128).logits
    assert len(seen) == 2 * (7 + 2 + 1) + 1
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
    q, k, v = (torch.randn(1, 2, 5, 64) for _ in range(3))
    attn = hf.model.layers[0].self_attn
    out = ALL_ATTENTION_FUNCTIONS[ATTN](attn, q, k, v, None, scaling=0.125, is_causal=True)[0]
    ref = sdpa_attention_forward(attn, bf16(q), bf16(k), bf16(v), None, scaling=0.125, is_causal=True)[0]
    assert torch.equal(out, ref) and not torch.equal(out, sdpa_attention_forward(
        attn, q, k, v, None, scaling=0.125, is_causal=True)[0])      # q, k, v rounded to bf16
    rel = float((got - plain).norm() / plain.norm())
    assert 1e-3 < rel < 0.2, rel                                 # activations rounded, not garbage
