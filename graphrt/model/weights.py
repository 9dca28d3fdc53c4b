"""The fused weight layout graphrt's decoder runs from (one qkv and one gate_up weight per layer).

Every producer (`fuse_hf_state_dict` here, a safetensors loader elsewhere) builds exactly this:

    ModelWeights
      embed       [V, H]                  token embedding
      final_norm  [H]                     RMSNorm weight before the LM head
      lm_head     [V, H]                  the same tensor object as `embed` when tied
      layers      tuple[LayerWeights, ...], one per decoder layer

    LayerWeights (field <- HF name under model.layers.N.)
      input_norm      [H]                    <- input_layernorm.weight
      post_attn_norm  [H]                    <- post_attention_layernorm.weight
      qkv             [(Hq + 2*Hkv)*D, H]    <- cat(self_attn.{q,k,v}_proj.weight): rows q, k, v
      qkv_bias        [(Hq + 2*Hkv)*D]|None  <- cat(self_attn.{q,k,v}_proj.bias) (Qwen2), else None
      q_norm          [D] | None             <- self_attn.q_norm.weight (Qwen3), else None
      k_norm          [D] | None             <- self_attn.k_norm.weight (Qwen3), else None
      o               [H, Hq*D]              <- self_attn.o_proj.weight
      gate_up         [2*I, H]               <- cat(mlp.gate_proj.weight, mlp.up_proj.weight): rows gate, up
      down            [H, I]                 <- mlp.down_proj.weight

    Global HF names: model.embed_tokens.weight, model.norm.weight, lm_head.weight (absent or
    ignored when tie_word_embeddings). The "model." prefix is optional.

H = hidden_size, V = vocab_size, I = intermediate_size, Hq / Hkv = num_heads / num_kv_heads,
D = head_dim (need not equal H / Hq). Every tensor: the model dtype (norm weights too), one
device, contiguous; except that qkv / o / gate_up / down / lm_head may be FP8 weights
(`graphrt.model.quant.Fp8Weight`: e4m3 data of the same shape + float32 scales) or int4
weights (`graphrt.model.quant.int4.Int4Weight`: packed codes + group scales / zeros), which the
model's `linear` dequantizes (graphrt/model/quant/). Within a q/k/v block, rows are head-major (head h owns rows h*D .. h*D+D-1),
as in HF. `ModelWeights.check(spec)` validates all of this, naming the field.

A loader builds `ModelWeights(embed=..., final_norm=..., lm_head=..., layers=(LayerWeights(
input_norm=..., ...), ...))` and hands it to `LlamaDecoder(spec, weights)` (which calls check).
"""
from __future__ import annotations

from dataclasses import dataclass, fields

import torch

from graphrt.model.quant.fp8 import Fp8Weight
from graphrt.model.quant.int4 import Int4Weight
from graphrt.model.spec import LlamaSpec

QUANTIZABLE = ("qkv", "o", "gate_up", "down", "lm_head")   # fields that may hold an Fp8Weight / Int4Weight


@dataclass(frozen=True)
class LayerWeights:
    """One decoder layer's fused weights (see module docstring for shapes and row orders)."""
    input_norm: torch.Tensor
    post_attn_norm: torch.Tensor
    qkv: torch.Tensor
    qkv_bias: torch.Tensor | None
    q_norm: torch.Tensor | None
    k_norm: torch.Tensor | None
    o: torch.Tensor
    gate_up: torch.Tensor
    down: torch.Tensor

    def shapes(self, spec: LlamaSpec) -> dict[str, tuple[int, ...] | None]:
        """Expected shape of every field (None: the field must be None)."""
        h, d, i = spec.hidden_size, spec.head_dim, spec.intermediate_size
        return dict(input_norm=(h,), post_attn_norm=(h,), qkv=(spec.qkv_rows, h),
                    qkv_bias=(spec.qkv_rows,) if spec.attention_bias else None,
                    q_norm=(d,) if spec.qk_norm else None, k_norm=(d,) if spec.qk_norm else None,
                    o=(h, spec.num_heads * d), gate_up=(2 * i, h), down=(h, i))


@dataclass(frozen=True)
class ModelWeights:
    """All weights of a decoder (see module docstring)."""
    embed: torch.Tensor
    final_norm: torch.Tensor
    lm_head: torch.Tensor
    layers: tuple[LayerWeights, ...]

    @property
    def dtype(self) -> torch.dtype:
        return self.embed.dtype

    @property
    def device(self) -> torch.device:
        return self.embed.device

    def check(self, spec: LlamaSpec) -> None:
        """Raise ValueError naming the first field whose shape/dtype/device/layout is wrong."""
        h, v = spec.hidden_size, spec.vocab_size
        if len(self.layers) != spec.num_layers:
            raise ValueError(f"layers: {len(self.layers)} layers, spec has num_layers={spec.num_layers}")
        items = [("embed", self.embed, (v, h)), ("final_norm", self.final_norm, (h,)),
                 ("lm_head", self.lm_head, (v, h))]
        for n, layer in enumerate(self.layers):
            want = layer.shapes(spec)
            items += [(f"layers[{n}].{f.name}", getattr(layer, f.name), want[f.name])
                      for f in fields(layer)]
        for name, t, shape in items:
            _check_tensor(name, t, shape, self.dtype, self.device)
        if spec.tie_word_embeddings and self.lm_head is not self.embed:
            raise ValueError("lm_head: tie_word_embeddings is set, lm_head must be the embed tensor")


def _check_tensor(name, t, shape, dtype, device) -> None:
    if shape is None:
        if t is not None:
            raise ValueError(f"{name}: must be None for this model, got a tensor {tuple(t.shape)}")
        return
    if isinstance(t, (Fp8Weight, Int4Weight)) and name.rsplit(".", 1)[-1] in QUANTIZABLE:
        kind = "FP8" if isinstance(t, Fp8Weight) else "int4"
        if tuple(t.shape) != shape:
            raise ValueError(f"{name}: {kind} weight of shape {tuple(t.shape)}, expected {shape}")
        if t.device != device or not t.is_contiguous():
            raise ValueError(f"{name}: {kind} weight on {t.device} (contiguous: {t.is_contiguous()}), "
                             f"expected contiguous on {device} (embed's)")
        return
    if not isinstance(t, torch.Tensor):
        raise ValueError(f"{name}: expected a tensor of shape {shape}, got {type(t).__name__}")
    if tuple(t.shape) != shape:
        raise ValueError(f"{name}: shape {tuple(t.shape)}, expected {shape}")
    if t.dtype != dtype or t.device != device:
        raise ValueError(f"{name}: {t.dtype} on {t.device}, expected {dtype} on {device} (embed's)")
    if not t.is_contiguous():
        raise ValueError(f"{name}: must be contiguous")


def fuse_hf_state_dict(spec: LlamaSpec, state_dict: dict, dtype: torch.dtype = torch.float32,
                       device="cpu") -> ModelWeights:
    """HF LlamaForCausalLM / Qwen2ForCausalLM / Qwen3ForCausalLM state dict -> ModelWeights.

    Tensors are moved to `device` / `dtype` one at a time before concatenation (the peak extra
    memory is one layer's fused weights). Raises KeyError naming a missing HF key.
    """
    sd = {k.removeprefix("model."): v for k, v in state_dict.items()}
    device = torch.device(device)

    def w(name):
        if name not in sd:
            raise KeyError(f"state_dict: missing {name!r}")
        return sd[name].to(device=device, dtype=dtype)

    def cat(*names):
        return torch.cat([w(n) for n in names]).contiguous()

    layers = []
    for i in range(spec.num_layers):
        p = f"layers.{i}."
        attn = [p + f"self_attn.{x}_proj" for x in "qkv"]
        layers.append(LayerWeights(
            input_norm=w(p + "input_layernorm.weight").contiguous(),
            post_attn_norm=w(p + "post_attention_layernorm.weight").contiguous(),
            qkv=cat(*(a + ".weight" for a in attn)),
            qkv_bias=cat(*(a + ".bias" for a in attn)) if spec.attention_bias else None,
            q_norm=w(p + "self_attn.q_norm.weight").contiguous() if spec.qk_norm else None,
            k_norm=w(p + "self_attn.k_norm.weight").contiguous() if spec.qk_norm else None,
            o=w(p + "self_attn.o_proj.weight").contiguous(),
            gate_up=cat(p + "mlp.gate_proj.weight", p + "mlp.up_proj.weight"),
            down=w(p + "mlp.down_proj.weight").contiguous()))
    embed = w("embed_tokens.weight").contiguous()
    lm_head = embed if spec.tie_word_embeddings else w("lm_head.weight").contiguous()
    weights = ModelWeights(embed=embed, final_norm=w("norm.weight").contiguous(), lm_head=lm_head,
                           layers=tuple(layers))
    weights.check(spec)
    return weights
