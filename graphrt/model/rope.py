"""Rotary position embedding tables, built once at model load (never per layer or per step).

`cos_sin_cache(spec, max_positions)` -> [max_positions, head_dim] float32: row p holds
cos(p * inv_freq) in columns [0, D/2) and sin(p * inv_freq) in [D/2, D) (FlashInfer's
`cos_sin_cache` layout). With HF's rotate_half convention a head x = (x1, x2) rotates to
(x1 cos - x2 sin, x2 cos + x1 sin), which is all the kernels need: HF's own cos/sin tables are
these halves repeated twice. Angles are float32 products p * inv_freq, as HF computes them.
"""
from __future__ import annotations

import math

import torch


def rope_inv_freq(spec) -> torch.Tensor:
    """[head_dim / 2] float32 inverse frequencies (default, or Llama-3 frequency scaling).

    Computed in float32 as HF transformers and Meta's reference code compute them (a float64
    computation differs by an ulp, which is ~1e-3 rad of angle at position 32k)."""
    d = spec.head_dim
    inv = 1.0 / (spec.rope_theta ** (torch.arange(0, d, 2, dtype=torch.int64).float() / d))
    s = spec.rope_scaling
    kind = (s or {}).get("rope_type", (s or {}).get("type", "default"))
    if kind == "default":
        return inv
    if kind != "llama3":
        raise ValueError(f"rope_scaling: type {kind!r} not supported (default, llama3)")
    factor, low, high = s["factor"], s["low_freq_factor"], s["high_freq_factor"]
    old = s["original_max_position_embeddings"]
    wavelen = 2 * math.pi / inv
    low_wl, high_wl = old / low, old / high
    smooth = (old / wavelen - low) / (high - low)
    scaled = torch.where(wavelen > low_wl, inv / factor, inv)
    mid = (wavelen <= low_wl) & (wavelen >= high_wl)
    return torch.where(mid, (1 - smooth) * inv / factor + smooth * inv, scaled)


def cos_sin_cache(spec, max_positions: int, device="cpu") -> torch.Tensor:
    """[max_positions, head_dim] float32 on `device`: cos half then sin half (see module doc)."""
    if isinstance(max_positions, bool) or not isinstance(max_positions, int) or max_positions < 1:
        raise ValueError(f"max_positions: must be an int >= 1, got {max_positions!r}")
    inv = rope_inv_freq(spec).to(device)
    angles = torch.arange(max_positions, device=device, dtype=torch.float32)[:, None] * inv[None, :]
    return torch.cat((angles.cos(), angles.sin()), dim=-1).contiguous()
