"""Random bf16 decoders at Llama-3.2-1B / 3.1-8B layer shapes for the persistent step's GPU tests
(tests/kernels/test_persistent_step_gpu.py, tests/model/test_persistent_gpu.py): built straight
into the fused layout on the GPU, any layer count and vocabulary."""
from __future__ import annotations

import torch

from graphrt.kernels.persistent import Geometry
from graphrt.model import LlamaDecoder, LlamaSpec
from graphrt.model.weights import LayerWeights, ModelWeights

SHAPES = {"1b": (2048, 8192, 32, 8, 64, True), "8b": (4096, 14336, 32, 8, 128, False)}


def random_model(name: str, layers: int = 2, vocab: int = 128256) -> LlamaDecoder:
    h, inter, hq, hkv, d, tied = SHAPES[name]
    spec = LlamaSpec(vocab_size=vocab, hidden_size=h, intermediate_size=inter, num_layers=layers, num_heads=hq,
                     num_kv_heads=hkv, head_dim=d, rms_norm_eps=1e-5, rope_theta=500000.0,
                     tie_word_embeddings=tied, attention_bias=False, max_position_embeddings=4096)
    gen = torch.Generator(device="cuda").manual_seed(0)

    def rnd(*shape, scale=0.02):
        return torch.randn(shape, generator=gen, device="cuda", dtype=torch.bfloat16) * scale

    def norm(n):
        return 1 + rnd(n, scale=0.1)
    qkv = (hq + 2 * hkv) * d
    layer_w = [LayerWeights(norm(h), norm(h), rnd(qkv, h), None, None, None, rnd(h, hq * d), rnd(2 * inter, h),
                            rnd(h, inter)) for _ in range(layers)]
    embed = rnd(vocab, h, scale=1.0)
    weights = ModelWeights(embed, norm(h), embed if tied else rnd(vocab, h), tuple(layer_w))
    return LlamaDecoder(spec, weights)


def geometry(model) -> Geometry:
    s = model.spec
    return Geometry(s.num_layers, s.hidden_size, s.intermediate_size, s.num_heads, s.num_kv_heads, s.head_dim,
                    s.vocab_size)
