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


def assert_logits_close(got: torch.Tensor, want: torch.Tensor) -> torch.Tensor:
    """Two bf16 paths' logits [rows, vocab] (~N(0, 45^2) here: a unit-variance tied embedding):
    within two bf16 steps at each row's largest |logit| (near 200 over 128k logits, a step of 1.0;
    summing in another order or rounding the hidden state at another point moves every logit by a
    share of it: the H100 runs saw at most 1.0-1.31), and no drift (the mean difference at most 1%
    of the mean |logit|). Returns the per-row max |difference|."""
    a, b = want.float(), got.float()
    d = (a - b).abs()
    step = torch.exp2(torch.floor(torch.log2(a.abs().amax(dim=-1, keepdim=True))) - 7)
    assert bool((d <= 2 * step).all()), f"max |logit diff| {float(d.max()):.4f} over 2 bf16 steps"
    assert float(d.mean()) <= 0.01 * float(a.abs().mean()), f"mean |logit diff| {float(d.mean()):.4f}"
    return d.amax(dim=-1)
