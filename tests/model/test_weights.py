"""The fused weight layout from HF state dicts (Llama, Qwen2 biases, Qwen3 q/k norms) and its checks."""
from __future__ import annotations

import dataclasses

import pytest
import torch

from graphrt.model import LlamaSpec, fuse_hf_state_dict

transformers = pytest.importorskip("transformers")
COMMON = dict(vocab_size=64, hidden_size=96, intermediate_size=80, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128)


def _hf(kind):
    torch.manual_seed(0)
    if kind == "llama":
        return transformers.LlamaForCausalLM(transformers.LlamaConfig(tie_word_embeddings=False, **COMMON))
    if kind == "qwen2":
        return transformers.Qwen2ForCausalLM(transformers.Qwen2Config(tie_word_embeddings=True, **COMMON))
    return transformers.Qwen3ForCausalLM(transformers.Qwen3Config(head_dim=32, tie_word_embeddings=False,
                                                                  **COMMON))


@pytest.mark.parametrize("kind", ["llama", "qwen2", "qwen3"])
def test_fused_rows_follow_hf_weights(kind):
    hf = _hf(kind)
    spec = LlamaSpec.from_hf(hf.config)
    sd = hf.state_dict()
    w = fuse_hf_state_dict(spec, sd, torch.float32, "cpu")
    d = spec.head_dim
    assert d == (32 if kind == "qwen3" else 24)
    for i, layer in enumerate(w.layers):
        p = f"model.layers.{i}."
        q, k, v = (sd[p + f"self_attn.{x}_proj.weight"] for x in "qkv")
        assert layer.qkv.shape == ((4 + 2 * 2) * d, 96)
        assert torch.equal(layer.qkv, torch.cat([q, k, v]))           # rows: q, then k, then v
        assert torch.equal(layer.gate_up[:80], sd[p + "mlp.gate_proj.weight"])
        assert torch.equal(layer.gate_up[80:], sd[p + "mlp.up_proj.weight"])
        assert torch.equal(layer.o, sd[p + "self_attn.o_proj.weight"])
        assert torch.equal(layer.down, sd[p + "mlp.down_proj.weight"])
        assert torch.equal(layer.input_norm, sd[p + "input_layernorm.weight"])
        assert torch.equal(layer.post_attn_norm, sd[p + "post_attention_layernorm.weight"])
        if kind == "qwen2":
            assert torch.equal(layer.qkv_bias, torch.cat([sd[p + f"self_attn.{x}_proj.bias"] for x in "qkv"]))
        else:
            assert layer.qkv_bias is None
        if kind == "qwen3":
            assert torch.equal(layer.q_norm, sd[p + "self_attn.q_norm.weight"])
            assert torch.equal(layer.k_norm, sd[p + "self_attn.k_norm.weight"])
        else:
            assert layer.q_norm is None and layer.k_norm is None
    assert torch.equal(w.embed, sd["model.embed_tokens.weight"])
    assert torch.equal(w.final_norm, sd["model.norm.weight"])
    if spec.tie_word_embeddings:
        assert w.lm_head is w.embed
    else:
        assert torch.equal(w.lm_head, sd["lm_head.weight"])


def test_dtype_and_prefix_free_names():
    hf = _hf("llama")
    spec = LlamaSpec.from_hf(hf.config)
    sd = {k.removeprefix("model."): v for k, v in hf.state_dict().items()}
    w = fuse_hf_state_dict(spec, sd, torch.bfloat16, "cpu")
    assert w.dtype == torch.bfloat16 and all(t.dtype == torch.bfloat16 for t in (w.layers[1].qkv, w.final_norm))


def test_missing_key_and_bad_shapes_are_named():
    hf = _hf("qwen3")
    spec = LlamaSpec.from_hf(hf.config)
    sd = dict(hf.state_dict())
    del sd["model.layers.1.self_attn.k_norm.weight"]
    with pytest.raises(KeyError, match="layers.1.self_attn.k_norm.weight"):
        fuse_hf_state_dict(spec, sd, torch.float32, "cpu")
    w = fuse_hf_state_dict(spec, hf.state_dict(), torch.float32, "cpu")
    bad = dataclasses.replace(w.layers[0], gate_up=w.layers[0].gate_up[:-1])
    with pytest.raises(ValueError, match=r"layers\[0\].gate_up: shape"):
        dataclasses.replace(w, layers=(bad, w.layers[1])).check(spec)
    no_norm = dataclasses.replace(w.layers[1], q_norm=None)
    with pytest.raises(ValueError, match=r"layers\[1\].q_norm"):
        dataclasses.replace(w, layers=(w.layers[0], no_norm)).check(spec)
    with pytest.raises(ValueError, match="lm_head"):
        dataclasses.replace(w, lm_head=w.lm_head.half()).check(spec)
    with pytest.raises(ValueError, match="layers: 1 layers"):
        dataclasses.replace(w, layers=w.layers[:1]).check(spec)


def test_spec_refuses_unsupported_configs():
    cfg = transformers.LlamaConfig(**COMMON)
    cfg.model_type = "mistral"
    with pytest.raises(ValueError, match="model_type"):
        LlamaSpec.from_hf(cfg)
    with pytest.raises(ValueError, match="mlp_bias"):
        LlamaSpec.from_hf(transformers.LlamaConfig(mlp_bias=True, **COMMON))
    with pytest.raises(ValueError, match="num_heads"):
        dataclasses.replace(LlamaSpec.from_hf(_hf("llama").config), num_heads=3)
    with pytest.raises(ValueError, match="head_dim"):
        dataclasses.replace(LlamaSpec.from_hf(_hf("llama").config), head_dim=25)
