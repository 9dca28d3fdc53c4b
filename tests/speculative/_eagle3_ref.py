"""Test helpers for EAGLE-3 heads: a small random head on disk and a plain dense float32 head.

The dense head is written from the published description, one position at a time, with its own
RoPE (rotate_half, HF convention) and softmax attention over python lists of K/V: it shares no
code with graphrt's head.
"""
from __future__ import annotations

import math

import torch

from graphrt.model.spec import LlamaSpec

H, I, HQ, HKV, D, V = 64, 96, 2, 1, 32, 80


def target_spec(*, layers: int = 8, vocab: int = V, hidden: int = H) -> LlamaSpec:
    return LlamaSpec(vocab_size=vocab, hidden_size=hidden, intermediate_size=128, num_layers=layers,
                     num_heads=HQ, num_kv_heads=HKV, head_dim=D, rms_norm_eps=1e-5, rope_theta=10000.0,
                     tie_word_embeddings=False, attention_bias=False, max_position_embeddings=256)


def original_config(*, draft_vocab: int = V, **extra) -> dict:
    cfg = {"architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "vocab_size": V,
           "hidden_size": H, "intermediate_size": I, "num_hidden_layers": 1, "num_attention_heads": HQ,
           "num_key_value_heads": HKV, "head_dim": D, "rms_norm_eps": 1e-5, "rope_theta": 10000.0,
           "max_position_embeddings": 256, "draft_vocab_size": draft_vocab, "torch_dtype": "float32"}
    cfg.update(extra)
    return cfg


def random_tensors(*, draft_vocab: int = V, seed: int = 0, scale: float = 0.15) -> dict:
    """Original-layout tensors; draft vocabulary = every other target id when draft_vocab < V."""
    g = torch.Generator().manual_seed(seed)

    def r(*shape):
        return torch.randn(shape, generator=g) * scale

    def norm():
        return 1.0 + 0.1 * torch.randn(H, generator=g)

    m = "midlayer."
    t = {"fc.weight": r(H, 3 * H), m + "input_layernorm.weight": norm(), m + "hidden_norm.weight": norm(),
         m + "self_attn.q_proj.weight": r(HQ * D, 2 * H), m + "self_attn.k_proj.weight": r(HKV * D, 2 * H),
         m + "self_attn.v_proj.weight": r(HKV * D, 2 * H), m + "self_attn.o_proj.weight": r(H, HQ * D),
         m + "post_attention_layernorm.weight": norm(), m + "mlp.gate_proj.weight": r(I, H),
         m + "mlp.up_proj.weight": r(I, H), m + "mlp.down_proj.weight": r(H, I), "norm.weight": norm(),
         "lm_head.weight": r(draft_vocab, H)}
    ids = torch.arange(0, 2 * draft_vocab, 2)[:draft_vocab] if draft_vocab < V else torch.arange(V)
    t["d2t"] = ids - torch.arange(draft_vocab)
    t["t2d"] = torch.zeros(V, dtype=torch.bool)
    t["t2d"][ids] = True
    return t


def _rms(x, w, eps=1e-5):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def _rope(x, pos, theta=10000.0):
    """x [heads, D] at integer position pos, rotate_half convention."""
    inv = 1.0 / theta ** (torch.arange(0, D, 2, dtype=torch.float32) / D)
    ang = pos * inv
    cos, sin = torch.cat([ang.cos(), ang.cos()]), torch.cat([ang.sin(), ang.sin()])
    half = torch.cat([-x[:, D // 2:], x[:, : D // 2]], dim=-1)
    return x * cos + half * sin


class DenseHead:
    """Positions appended one at a time; each attends to every earlier position and itself."""

    def __init__(self, tensors: dict, embed: torch.Tensor, *, norm_before_residual: bool = False):
        self.nbr = norm_before_residual
        self.t = {k: v.float() for k, v in tensors.items()}
        self.embed = embed.float()
        self.keys, self.values = [], []

    def step(self, g, token: int, pos: int):
        """g [H] (fc output or own pre-norm h), token: the token after `pos` -> (logits, h)."""
        t, m = self.t, "midlayer."
        x = torch.cat([_rms(self.embed[token], t[m + "input_layernorm.weight"]),
                       _rms(g, t[m + "hidden_norm.weight"])])
        q = (t[m + "self_attn.q_proj.weight"] @ x).view(HQ, D)
        k = (t[m + "self_attn.k_proj.weight"] @ x).view(HKV, D)
        v = (t[m + "self_attn.v_proj.weight"] @ x).view(HKV, D)
        self.keys.append(_rope(k, pos))
        self.values.append(v)
        q = _rope(q, pos)
        ks, vs = torch.stack(self.keys), torch.stack(self.values)          # [n, Hkv, D]
        o = []
        for hd in range(HQ):
            kv = hd // (HQ // HKV)
            p = torch.softmax(ks[:, kv] @ q[hd] / math.sqrt(D), dim=0)
            o.append(p @ vs[:, kv])
        residual = _rms(g, t[m + "hidden_norm.weight"]) if self.nbr else g
        h = residual + t[m + "self_attn.o_proj.weight"] @ torch.cat(o)
        y = _rms(h, t[m + "post_attention_layernorm.weight"])
        gate, up = t[m + "mlp.gate_proj.weight"] @ y, t[m + "mlp.up_proj.weight"] @ y
        h = h + t[m + "mlp.down_proj.weight"] @ (torch.nn.functional.silu(gate) * up)
        return t["lm_head.weight"] @ _rms(h, t["norm.weight"]), h

    def target(self, h3, token: int, pos: int):
        return self.step(self.t["fc.weight"] @ h3.float(), token, pos)

    def draft_ids(self):
        return torch.arange(self.t["lm_head.weight"].shape[0]) + self.t["d2t"].long()
