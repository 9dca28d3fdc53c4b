"""The RoPE cos/sin table built at load vs transformers' rotary embedding (default and Llama-3 scaling)."""
from __future__ import annotations

import pytest
import torch

from graphrt.model import LlamaSpec
from graphrt.model.rope import cos_sin_cache

transformers = pytest.importorskip("transformers")


@pytest.mark.parametrize("kind", ["default", "llama3", "qwen3"])
def test_table_matches_hf_rotary_embedding(kind):
    common = dict(vocab_size=32, hidden_size=256, intermediate_size=64, num_hidden_layers=1,
                  num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=4096)
    if kind == "qwen3":
        from transformers.models.qwen3.modeling_qwen3 import Qwen3RotaryEmbedding as Rotary
        cfg = transformers.Qwen3Config(head_dim=64, rope_theta=1e6, **common)
    else:
        from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding as Rotary
        rope = dict(rope_type="llama3", rope_theta=500000.0, factor=8.0, low_freq_factor=1.0,
                    high_freq_factor=4.0, original_max_position_embeddings=512) if kind == "llama3" else None
        cfg = transformers.LlamaConfig(rope_parameters=rope, **common) if rope else transformers.LlamaConfig(**common)
    spec = LlamaSpec.from_hf(cfg)
    table = cos_sin_cache(spec, 4096)
    assert table.shape == (4096, spec.head_dim) and table.dtype == torch.float32
    pos = torch.tensor([[0, 1, 15, 16, 511, 512, 2047, 4095]])
    cos, sin = Rotary(cfg)(torch.zeros(1, dtype=torch.float32), pos)
    half = spec.head_dim // 2
    torch.testing.assert_close(cos[0, :, half:], cos[0, :, :half])      # HF repeats the halves
    torch.testing.assert_close(table[pos[0], :half], cos[0, :, :half], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(table[pos[0], half:], sin[0, :, :half], rtol=1e-5, atol=1e-5)


def test_bad_max_positions():
    spec = LlamaSpec.from_hf(transformers.LlamaConfig(hidden_size=64, num_attention_heads=2))
    with pytest.raises(ValueError, match="max_positions"):
        cos_sin_cache(spec, 0)
