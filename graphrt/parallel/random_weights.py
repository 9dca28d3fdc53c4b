"""Random weights of a whole model, built straight into one rank's shard (benchmarks, GPU tests).

Each full tensor is drawn from one seeded generator on the device, in a fixed order, and only
the rank's slice is kept, so every tensor-parallel size holds slices of the same model (TP=2's
two ranks together equal TP=1's weights). Peak extra memory: one full layer.
"""
from __future__ import annotations

import torch

from graphrt.model.spec import LlamaSpec
from graphrt.model.weights import LayerWeights, ModelWeights
from graphrt.parallel.shard import shard_layer, shard_vocab


def random_weights(spec: LlamaSpec, *, dtype=torch.bfloat16, device="cuda", seed: int = 0,
                   rank: int = 0, world_size: int = 1, scale: float = 0.02) -> ModelWeights:
    """Rank's shard of a random model: matrices N(0, scale), norms 1 + N(0, 0.1) (Qwen2 biases
    N(0, scale), Qwen3 q/k norms like the others), all in `dtype` on `device`."""
    device = torch.device(device)
    gen = torch.Generator(device=device).manual_seed(seed)

    def rnd(*shape, mean=0.0, std=scale):
        return (torch.randn(shape, generator=gen, device=device, dtype=torch.float32) * std + mean).to(dtype)

    h, d, i = spec.hidden_size, spec.head_dim, spec.intermediate_size
    embed = shard_vocab(spec, rnd(spec.vocab_size, h), rank, world_size)
    layers = []
    for _ in range(spec.num_layers):
        full = LayerWeights(input_norm=rnd(h, mean=1.0, std=0.1), post_attn_norm=rnd(h, mean=1.0, std=0.1),
                            qkv=rnd(spec.qkv_rows, h), qkv_bias=rnd(spec.qkv_rows) if spec.attention_bias else None,
                            q_norm=rnd(d, mean=1.0, std=0.1) if spec.qk_norm else None,
                            k_norm=rnd(d, mean=1.0, std=0.1) if spec.qk_norm else None,
                            o=rnd(h, spec.num_heads * d), gate_up=rnd(2 * i, h), down=rnd(h, i))
        layers.append(shard_layer(spec, full, rank, world_size) if world_size > 1 else full)
        del full
    final_norm = rnd(h, mean=1.0, std=0.1)
    lm_head = embed if spec.tie_word_embeddings else shard_vocab(spec, rnd(spec.vocab_size, h), rank, world_size)
    return ModelWeights(embed=embed, final_norm=final_norm, lm_head=lm_head, layers=tuple(layers))
