"""TEMPORARY shim: build today's LlamaDecoder (HF state-dict names) from the fused layout.

The one place the engine depends on the current model's constructor. When the fused-layout model
lands, `build_model` becomes a call to its constructor with `ckpt.weights` and this file goes.
The unfused tensors are row slices (views) of the fused ones: no extra device memory.
Qwen3's per-head q/k RMSNorm (before RoPE) is added by a small subclass until the fused model
carries it.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ..models.llama import LlamaDecoder, _rotate_half
from .loader import Checkpoint


def unfuse(ckpt: Checkpoint) -> dict[str, torch.Tensor]:
    """Fused weights -> HF state-dict names (views)."""
    s, w = ckpt.spec, ckpt.weights
    q, kv, inter = s.num_heads * s.head_dim, s.num_kv_heads * s.head_dim, s.intermediate_size
    sd = {"model.embed_tokens.weight": w["embed"], "model.norm.weight": w["final_norm"],
          "lm_head.weight": w["lm_head"]}
    for i, layer in enumerate(w["layers"]):
        p = f"model.layers.{i}."
        qkv, gu = layer["qkv"], layer["gate_up"]
        sd |= {p + "input_layernorm.weight": layer["input_norm"],
               p + "post_attention_layernorm.weight": layer["post_attn_norm"],
               p + "self_attn.q_proj.weight": qkv[:q], p + "self_attn.k_proj.weight": qkv[q:q + kv],
               p + "self_attn.v_proj.weight": qkv[q + kv:], p + "self_attn.o_proj.weight": layer["o"],
               p + "mlp.gate_proj.weight": gu[:inter], p + "mlp.up_proj.weight": gu[inter:],
               p + "mlp.down_proj.weight": layer["down"]}
        if layer["qkv_bias"] is not None:
            b = layer["qkv_bias"]
            sd |= {p + "self_attn.q_proj.bias": b[:q], p + "self_attn.k_proj.bias": b[q:q + kv],
                   p + "self_attn.v_proj.bias": b[q + kv:]}
    return sd


class _QkNormDecoder(LlamaDecoder):
    """LlamaDecoder plus Qwen3's RMSNorm over each q / k head before RoPE."""

    def __init__(self, ckpt: Checkpoint, **kw):
        super().__init__(ckpt.spec, unfuse(ckpt), **kw)
        self._qk_norms = [(layer["q_norm"], layer["k_norm"]) for layer in ckpt.weights["layers"]]
        for layer, norms in zip(self.layers, self._qk_norms):
            layer["_qk_norm"] = norms

    def _qkv(self, layer, h, positions):
        s = self.spec
        t = h.shape[0]
        qn, kn = layer["_qk_norm"]
        q, k, v = (F.linear(h, layer[f"self_attn.{n}_proj"], layer.get(f"self_attn.{n}_proj.bias"))
                   for n in "qkv")
        q = self._rms(q.view(t, s.num_heads, s.head_dim), qn)
        k = self._rms(k.view(t, s.num_kv_heads, s.head_dim), kn)
        v = v.view(t, s.num_kv_heads, s.head_dim)
        cos, sin = self._rope(positions)
        return q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin, v


def build_model(ckpt: Checkpoint):
    """The decoder ModelRuntime runs, on ckpt.device in ckpt.dtype."""
    kw = dict(dtype=ckpt.dtype, device=ckpt.device)
    if ckpt.qk_norm:
        return _QkNormDecoder(ckpt, **kw)
    return LlamaDecoder(ckpt.spec, unfuse(ckpt), **kw)


__all__ = ["build_model", "unfuse"]
