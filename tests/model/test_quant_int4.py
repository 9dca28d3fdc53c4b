"""graphrt/model/quant/int4.py (the Int4Weight layout, RTN, from_codes, cat_rows) and its use by the
model: linear / int4_linear dispatch, ModelWeights.check, dequantize_weights; bad input named."""
from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from graphrt.model.fp8_weights import dequantize_weights
from graphrt.model.linear import Linear, int4_linear, linear
from graphrt.model.quant.int4 import Int4Weight, cat_rows, from_codes, pack_codes, quantize_int4


def test_pack_codes_layout_is_the_documented_one():
    codes = torch.arange(16).repeat(3, 1) % 16                    # [3, 16]: row r, column j -> j
    q = pack_codes(codes)
    assert q.dtype == torch.int32 and q.shape == (3, 2)
    # nibble i of word c is column 8c + i, least significant first
    assert q[0, 0].item() == 0x76543210 and (q[0, 1].item() & 0xFFFFFFFF) == 0xFEDCBA98
    w = Int4Weight(q, torch.ones(3, 1, dtype=torch.float16), 16)
    assert torch.equal(w.codes(), codes.to(torch.uint8))
    assert torch.equal(w.dequantize(), codes.float() - 8)


@pytest.mark.parametrize("group,sym", [(32, True), (64, False), (128, False), (-1, True)])
def test_quantize_int4_round_to_nearest(group, sym):
    w = torch.randn(24, 256)
    w4 = quantize_int4(w, group, symmetric=sym)
    g = 256 if group == -1 else group
    assert w4.group_size == g and w4.scale.shape == (24, 256 // g) and w4.scale.dtype == torch.float16
    assert (w4.zero is None) == sym
    step = w4.scale.float().repeat_interleave(g, 1)
    err = (w4.dequantize() - w).abs()
    assert bool((err <= step * 1.001).all())
    assert w4.nbytes == 24 * 128 + 24 * (256 // g) * (2 + (0 if sym else 1))


def test_from_codes_act_order_and_dropped_zeros():
    g = torch.Generator().manual_seed(1)
    codes = torch.randint(0, 16, (8, 64), generator=g)
    scale = torch.rand(8, 2, generator=g).half() + 0.1
    zero = torch.randint(0, 16, (8, 2), generator=g)
    order = torch.randperm(64, generator=g)
    g_idx = torch.empty(64, dtype=torch.int32)
    g_idx[order] = (torch.arange(64) // 32).to(torch.int32)
    w4 = from_codes(codes, scale, 32, zero=zero, g_idx=g_idx)
    assert w4.perm is not None
    ref = (codes.float() - zero.float()[:, g_idx.long()]) * scale.float()[:, g_idx.long()]
    assert torch.equal(w4.dequantize(), ref)
    assert from_codes(codes, scale, 32, zero=torch.full((8, 2), 8)).zero is None
    assert from_codes(codes, scale, 32, g_idx=torch.arange(64) // 32).perm is None
    with pytest.raises(ValueError, match="g_idx: groups must each hold group_size=32"):
        from_codes(codes, scale, 32, g_idx=torch.zeros(64, dtype=torch.int32))


def test_cat_rows_keeps_each_parts_scales():
    a, b = quantize_int4(torch.randn(16, 64), 32), quantize_int4(torch.randn(8, 64), 32, symmetric=True)
    ab = cat_rows([a, b])
    assert torch.equal(ab.dequantize(), torch.cat([a.dequantize(), b.dequantize()]))
    with pytest.raises(ValueError, match="parts: mixed group_size"):
        cat_rows([a, quantize_int4(torch.randn(8, 64), 64)])
    p = replace(a, perm=torch.randperm(64).to(torch.int32))
    with pytest.raises(ValueError, match="perm: parts with different act-order"):
        cat_rows([p, a])


def test_int4_weight_bad_fields_are_named():
    q = torch.zeros(4, 8, dtype=torch.int32)
    s = torch.ones(4, 2, dtype=torch.float16)
    with pytest.raises(ValueError, match="qweight: expected a 2-D int32"):
        Int4Weight(q.float(), s, 32)
    with pytest.raises(ValueError, match="group_size: 48 must be a positive multiple of 8 dividing K=64"):
        Int4Weight(q, s, 48)
    with pytest.raises(ValueError, match=r"scale: expected .* \[4, 2\]"):
        Int4Weight(q, s[:, :1], 32)
    with pytest.raises(ValueError, match=r"zero: expected uint8 \[4, 2\]"):
        Int4Weight(q, s, 32, zero=torch.zeros(4, 2, dtype=torch.int32))
    with pytest.raises(ValueError, match=r"perm: expected int32 \[64\]"):
        Int4Weight(q, s, 32, perm=torch.arange(64))
    with pytest.raises(ValueError, match="group_size: 96"):
        quantize_int4(torch.randn(4, 64), 96)
    with pytest.raises(ValueError, match="w: expected a 2-D floating"):
        quantize_int4(torch.zeros(4, 64, dtype=torch.int32))
    with pytest.raises(ValueError, match="scale_dtype"):
        quantize_int4(torch.randn(4, 64), 32, scale_dtype=torch.int8)


def test_linear_dispatch_on_cpu_is_the_float32_reference():
    w4 = quantize_int4(torch.randn(24, 128), 32)
    w4 = replace(w4, perm=torch.randperm(128).to(torch.int32))
    x, bias = torch.randn(3, 128).bfloat16(), torch.randn(24).bfloat16()
    ref = (x.float() @ w4.dequantize().T + bias.float()).bfloat16()
    assert torch.equal(linear(x, w4, bias), ref)
    assert torch.equal(int4_linear(x, w4, bias), ref)
    assert torch.equal(Linear(w4, bias)(x), ref)
    assert Linear(w4).choose([1, 2]) == {}                       # CPU: no timing


def test_model_weights_accept_int4_and_dequantize():
    from graphrt.model.llama import LlamaDecoder
    from graphrt.model.spec import LlamaSpec
    spec = LlamaSpec(vocab_size=64, hidden_size=64, intermediate_size=128, num_layers=1, num_heads=2,
                     num_kv_heads=1, head_dim=32, rms_norm_eps=1e-5, rope_theta=10000.0,
                     max_position_embeddings=64, tie_word_embeddings=True, attention_bias=False)
    torch.manual_seed(0)
    base = LlamaDecoder.from_state_dict(spec, _random_state(spec)).weights
    layer = base.layers[0]
    q = replace(layer, **{f: quantize_int4(getattr(layer, f), 32) for f in ("qkv", "o", "gate_up", "down")})
    w4 = replace(base, layers=(q,))
    w4.check(spec)
    deq = dequantize_weights(w4)
    assert torch.equal(deq.layers[0].down, q.down.dequantize())
    bad = replace(base, layers=(replace(q, o=quantize_int4(torch.randn(64, 32), 32)),))
    with pytest.raises(ValueError, match=r"layers\[0\].o: int4 weight of shape \(64, 32\), expected \(64, 64\)"):
        bad.check(spec)


def _random_state(spec):
    h, i, d = spec.hidden_size, spec.intermediate_size, spec.head_dim
    sd = {"model.embed_tokens.weight": torch.randn(spec.vocab_size, h), "model.norm.weight": torch.ones(h)}
    p = "model.layers.0."
    sd |= {p + "input_layernorm.weight": torch.ones(h), p + "post_attention_layernorm.weight": torch.ones(h),
           p + "self_attn.q_proj.weight": torch.randn(spec.num_heads * d, h),
           p + "self_attn.k_proj.weight": torch.randn(spec.num_kv_heads * d, h),
           p + "self_attn.v_proj.weight": torch.randn(spec.num_kv_heads * d, h),
           p + "self_attn.o_proj.weight": torch.randn(h, spec.num_heads * d),
           p + "mlp.gate_proj.weight": torch.randn(i, h), p + "mlp.up_proj.weight": torch.randn(i, h),
           p + "mlp.down_proj.weight": torch.randn(h, i)}
    return sd
