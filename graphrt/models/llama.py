"""A Llama-family decoder (Llama, Qwen2) that decodes through graphrt's AttentionContext.

Weights come from a HF transformers `LlamaForCausalLM` / `Qwen2ForCausalLM` state dict. Decode
(`decode_step`) is a pure tensor function of the context and the current tokens, so it can be
captured in a CUDA graph per bucket; prefill (`prefill`) runs eagerly in torch and fills the paged
KV caches. RMSNorm, RoPE (default or Llama-3 scaling) from device positions, GQA, SwiGLU, tied or
untied LM head, q/k/v biases (Qwen2).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass(frozen=True)
class LlamaSpec:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    tie_word_embeddings: bool
    attention_bias: bool
    rope_scaling: dict | None = None

    @classmethod
    def from_hf(cls, cfg) -> "LlamaSpec":
        """From a transformers LlamaConfig / Qwen2Config."""
        heads = cfg.num_attention_heads
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
        qwen = getattr(cfg, "model_type", "") == "qwen2"
        rope_params = getattr(cfg, "rope_parameters", None) or {}
        theta = getattr(cfg, "rope_theta", None) or rope_params.get("rope_theta", 10000.0)
        scaling = getattr(cfg, "rope_scaling", None) or None
        if scaling is None and rope_params.get("rope_type", "default") != "default":
            scaling = dict(rope_params)
        return cls(vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size,
                   intermediate_size=cfg.intermediate_size, num_layers=cfg.num_hidden_layers,
                   num_heads=heads, num_kv_heads=cfg.num_key_value_heads, head_dim=head_dim,
                   rms_norm_eps=cfg.rms_norm_eps, rope_theta=float(theta),
                   tie_word_embeddings=bool(cfg.tie_word_embeddings),
                   attention_bias=qwen or bool(getattr(cfg, "attention_bias", False)),
                   rope_scaling=scaling)


def rope_inv_freq(spec: LlamaSpec) -> torch.Tensor:
    """[head_dim / 2] float32 inverse frequencies (default, or Llama-3 frequency scaling)."""
    d = spec.head_dim
    inv = 1.0 / (spec.rope_theta ** (torch.arange(0, d, 2, dtype=torch.float64) / d))
    s = spec.rope_scaling
    kind = (s or {}).get("rope_type", (s or {}).get("type", "default"))
    if kind == "default":
        return inv.float()
    if kind != "llama3":
        raise ValueError(f"rope_scaling: type {kind!r} not supported (default, llama3)")
    factor, low, high = s["factor"], s["low_freq_factor"], s["high_freq_factor"]
    old = s["original_max_position_embeddings"]
    wavelen = 2 * math.pi / inv
    low_wl, high_wl = old / low, old / high
    smooth = (old / wavelen - low) / (high - low)
    scaled = torch.where(wavelen > low_wl, inv / factor, inv)
    mid = (wavelen <= low_wl) & (wavelen >= high_wl)
    return torch.where(mid, (1 - smooth) * inv / factor + smooth * inv, scaled).float()


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    a, b = x.chunk(2, dim=-1)
    return torch.cat((-b, a), dim=-1)


class LlamaDecoder:
    """Weights on one device in one dtype; no autograd. See module docstring."""

    def __init__(self, spec: LlamaSpec, state_dict: dict, *, dtype=torch.float32, device="cpu"):
        self.spec = spec
        self.dtype = dtype
        sd = {k.removeprefix("model."): v for k, v in state_dict.items()}

        def w(name):
            if name not in sd:
                raise KeyError(f"state_dict: missing {name!r}")
            return sd[name].to(device=device, dtype=dtype).contiguous()
        self.embed = w("embed_tokens.weight")
        self.norm = w("norm.weight")
        self.lm_head = self.embed if spec.tie_word_embeddings else w("lm_head.weight")
        self.layers = []
        for i in range(spec.num_layers):
            p = f"layers.{i}."
            layer = {n: w(p + n + ".weight") for n in (
                "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
                "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj", "input_layernorm",
                "post_attention_layernorm")}
            if spec.attention_bias:
                for n in ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"):
                    layer[n + ".bias"] = w(p + n + ".bias")
            self.layers.append(layer)
        self.inv_freq = rope_inv_freq(spec).to(device)

    @classmethod
    def from_hf(cls, hf_model, *, dtype=torch.float32, device="cpu") -> "LlamaDecoder":
        return cls(LlamaSpec.from_hf(hf_model.config), hf_model.state_dict(), dtype=dtype, device=device)

    # ---- pieces -------------------------------------------------------------------------------
    def _rms(self, x, weight):
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.spec.rms_norm_eps)
        return weight * xf.to(self.dtype)

    def _rope(self, positions: torch.Tensor):
        """positions [T] int64 -> cos, sin [T, 1, head_dim] in the model dtype."""
        freqs = positions.float()[:, None] * self.inv_freq[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)[:, None, :]
        return emb.cos().to(self.dtype), emb.sin().to(self.dtype)

    def _qkv(self, layer, h, positions):
        """h [T, hidden] -> q [T, Hq, D], k/v [T, Hkv, D] with RoPE applied to q, k."""
        s = self.spec
        t = h.shape[0]
        q = F.linear(h, layer["self_attn.q_proj"], layer.get("self_attn.q_proj.bias"))
        k = F.linear(h, layer["self_attn.k_proj"], layer.get("self_attn.k_proj.bias"))
        v = F.linear(h, layer["self_attn.v_proj"], layer.get("self_attn.v_proj.bias"))
        q = q.view(t, s.num_heads, s.head_dim)
        k = k.view(t, s.num_kv_heads, s.head_dim)
        v = v.view(t, s.num_kv_heads, s.head_dim)
        cos, sin = self._rope(positions)
        return q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin, v

    def _mlp(self, layer, x):
        h = self._rms(x, layer["post_attention_layernorm"])
        g = F.silu(F.linear(h, layer["mlp.gate_proj"])) * F.linear(h, layer["mlp.up_proj"])
        return x + F.linear(g, layer["mlp.down_proj"])

    # ---- decode (graph-capturable) ------------------------------------------------------------
    def decode_step(self, ctx, tokens: torch.Tensor) -> torch.Tensor:
        """tokens [B] int64 (device) -> logits [B, vocab] float32. ctx.prepare() must have run."""
        b = tokens.shape[0]
        positions = ctx.positions()
        x = self.embed[tokens]
        for i, layer in enumerate(self.layers):
            q, k, v = self._qkv(layer, self._rms(x, layer["input_layernorm"]), positions)
            ctx.write_kv(i, k, v)
            o = ctx.attention(i, q).reshape(b, -1)
            x = x + F.linear(o, layer["self_attn.o_proj"])
            x = self._mlp(layer, x)
        return F.linear(self._rms(x, self.norm), self.lm_head).float()

    # ---- prefill (eager) ----------------------------------------------------------------------
    @torch.no_grad()
    def prefill(self, prompts: list[torch.Tensor], kv_caches, block_table: torch.Tensor) -> torch.Tensor:
        """Causal forward over each prompt (eager torch), K/V written into the paged caches.

        prompts: list of [T_i] int64 token tensors (row i of block_table); returns [n, vocab]
        float32 logits of each prompt's last token.
        """
        s = self.spec
        out = []
        for row, toks in enumerate(prompts):
            t = toks.shape[0]
            positions = torch.arange(t, device=toks.device)
            x = self.embed[toks]
            for i, layer in enumerate(self.layers):
                q, k, v = self._qkv(layer, self._rms(x, layer["input_layernorm"]), positions)
                _write_prompt_kv(kv_caches[i], block_table[row], k, v)
                rep = s.num_heads // s.num_kv_heads
                attn = F.scaled_dot_product_attention(
                    q.transpose(0, 1).float(), k.repeat_interleave(rep, 1).transpose(0, 1).float(),
                    v.repeat_interleave(rep, 1).transpose(0, 1).float(), is_causal=True)
                x = x + F.linear(attn.transpose(0, 1).reshape(t, -1).to(self.dtype),
                                 layer["self_attn.o_proj"])
                x = self._mlp(layer, x)
            out.append(F.linear(self._rms(x[-1:], self.norm), self.lm_head).float()[0])
        return torch.stack(out)


def _write_prompt_kv(cache, table_row: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    """k, v [T, Hkv, D] -> token positions 0..T-1 of one request's pages."""
    kc, vc = cache.as_tuple()
    page_size = kc.shape[1] if cache.layout == "NHD" else kc.shape[2]
    pos = torch.arange(k.shape[0], device=k.device)
    pages, slots = table_row.long()[pos // page_size], pos % page_size
    if cache.layout == "NHD":
        kc[pages, slots] = k.to(kc.dtype)
        vc[pages, slots] = v.to(vc.dtype)
    else:
        kc[pages, :, slots] = k.to(kc.dtype)
        vc[pages, :, slots] = v.to(vc.dtype)
