"""Which slice of every weight a rank owns (Megatron-style), and the per-rank geometry.

With n ranks, rank r owns (Hq, Hkv, I, V: heads, KV heads, MLP width, vocabulary):

    qkv      rows: its q heads [r*Hq/n, (r+1)*Hq/n), then its k heads and v heads [r*Hkv/n, ...)
             (GQA stays local: q head h reads kv head h // (Hq/Hkv), which the same rank owns)
    qkv_bias the same rows (Qwen2)
    gate_up  rows: its slice [r*I/n, (r+1)*I/n) of the gate rows AND the same slice of the up
             rows, so silu_mul stays local
    o, down  columns (the input dim): its heads' / its MLP slice; the partial outputs are summed
             by an all-reduce
    embed, lm_head  rows [r*Vr, (r+1)*Vr) with Vr = ceil(V/n) (vocab-parallel); rows past V are
             zero padding (vLLM pads the same way): never looked up, their logits dropped
    norms, q_norm, k_norm  replicated

Every other sliced tensor is split along exactly one dim into n equal contiguous blocks, so a
rank's slice of a HF tensor follows from the full and the local shapes alone (`owned_slice`);
the vocabulary rows use `vocab_rows`.
"""
from __future__ import annotations

import torch

from graphrt.model.spec import LlamaSpec, check_tp_size, owned_slice, shard_spec, vocab_rows
from graphrt.model.weights import LayerWeights, ModelWeights


def shard_runtime_config(config, world_size: int):
    """A RuntimeConfig with this rank's heads (num_qo_heads, num_kv_heads divided by n)."""
    for name in ("num_qo_heads", "num_kv_heads"):
        if getattr(config, name) % world_size:
            raise ValueError(f"tensor_parallel: {world_size} does not divide {name}={getattr(config, name)}")
    return config.replace(num_qo_heads=config.num_qo_heads // world_size,
                          num_kv_heads=config.num_kv_heads // world_size)


def _take(t: torch.Tensor, where) -> torch.Tensor:
    if where is None:
        return t.contiguous()
    d, a, b = where
    return t.narrow(d, a, b - a).contiguous()


def shard_layer(spec: LlamaSpec, layer: LayerWeights, rank: int, world_size: int) -> LayerWeights:
    """Rank's shard of one layer's full fused weights (see the module docstring)."""
    local = shard_spec(spec, world_size)
    d = spec.head_dim
    q, kv = spec.num_heads * d, spec.num_kv_heads * d
    lq, lkv = local.num_heads * d, local.num_kv_heads * d
    inter, li = spec.intermediate_size, local.intermediate_size

    def blocks(t, sizes, local_sizes):   # rows in blocks (q, k, v or gate, up), each sharded
        out, off = [], 0
        for size, ls in zip(sizes, local_sizes):
            out.append(t.narrow(0, off + rank * ls, ls))
            off += size
        return torch.cat(out).contiguous()

    return LayerWeights(
        input_norm=layer.input_norm, post_attn_norm=layer.post_attn_norm,
        qkv=blocks(layer.qkv, (q, kv, kv), (lq, lkv, lkv)),
        qkv_bias=None if layer.qkv_bias is None else blocks(layer.qkv_bias, (q, kv, kv), (lq, lkv, lkv)),
        q_norm=layer.q_norm, k_norm=layer.k_norm,
        o=_take(layer.o, owned_slice(tuple(layer.o.shape), (spec.hidden_size, lq), rank)),
        gate_up=blocks(layer.gate_up, (inter, inter), (li, li)),
        down=_take(layer.down, owned_slice(tuple(layer.down.shape), (spec.hidden_size, li), rank)))


def shard_vocab(spec: LlamaSpec, t: torch.Tensor, rank: int, world_size: int) -> torch.Tensor:
    """Rank's [ceil(V/n), H] block of a [V, H] embedding or LM head (zero rows past V)."""
    rows = shard_spec(spec, world_size).vocab_size
    a, b = vocab_rows(spec.vocab_size, rows, rank)
    out = t.new_zeros((rows, t.shape[1]))
    out[: b - a] = t[a:b]
    return out


def shard_weights(spec: LlamaSpec, weights: ModelWeights, rank: int, world_size: int) -> ModelWeights:
    """Rank's shard of full fused weights (tests, tools; the loader reads shards from disk)."""
    embed = shard_vocab(spec, weights.embed, rank, world_size)
    lm_head = embed if spec.tie_word_embeddings else shard_vocab(spec, weights.lm_head, rank, world_size)
    layers = tuple(shard_layer(spec, x, rank, world_size) for x in weights.layers)
    return ModelWeights(embed=embed, final_norm=weights.final_norm, lm_head=lm_head, layers=layers)
