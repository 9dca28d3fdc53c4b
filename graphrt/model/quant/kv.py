"""FP8 (e4m3) KV cache values: per-tensor k / v scales, the float32 reading of a cache page.

    kv_scale = kv_scales(k_scale=1.0, v_scale=1.0, device=dev)   # [2] float32 (k, v), device
    rope_append_decode(..., kv_cache=fp8_cache, kv_scale=kv_scale)  # writes x / scale in e4m3
    k = dequantize_kv(fp8_cache.k, kv_scale[0])                   # float32, same shape

A stored element e means e * scale. Scales are per tensor (one k and one v scale per layer,
held by the layer's PagedKVCache as `scale`, [2] float32 on its device). Where they come from:
- the checkpoint, when it has them (compressed-tensors `kv_cache_scheme` with per-layer
  `self_attn.k_scale` / `v_scale`: graphrt/checkpoint/kv_scales.py), set before anything runs;
- else calibrated on the first prefill the runtime runs (`calibrate_layer`, called per layer by
  the decoder's prefill before that layer's first K/V is written): k scale = the largest norm
  of a rotary pair of the prompt's keys (after q/k norm) / 448, the largest value any rotation
  of those keys can take, so keys at later positions of similar magnitude do not saturate;
  v scale = amax(v) / 448. Values beyond a scale later saturate at +-448 (never inf / NaN).
A scale never changes after pages were written with it: calibration runs once, before the
first write, and the runtime logs the scales it chose.

On the GPU, FlashInfer (0.7.x) reads such a cache when its decode / prefill wrappers are
planned with `kv_data_type=torch.float8_e4m3fn` (q stays in the model dtype): graphrt folds
`k_scale` into q (the logits then carry sm_scale * k_scale) and `v_scale` into the output on
the device (attention/backends/flashinfer.py, model/prefill.py).
"""
from __future__ import annotations

import torch

from graphrt.model.quant.fp8 import FP8, FP8_MAX


def kv_scales(k_scale: float = 1.0, v_scale: float = 1.0, *, device="cpu") -> torch.Tensor:
    """[2] float32 (k, v) per-tensor scales on `device`; each must be finite and > 0."""
    for name, v in (("k_scale", k_scale), ("v_scale", v_scale)):
        if not (isinstance(v, (int, float)) and 0 < float(v) < float("inf")):
            raise ValueError(f"{name}: expected a finite float > 0, got {v!r}")
    return torch.tensor([float(k_scale), float(v_scale)], dtype=torch.float32, device=device)


def calibrate_scale(values: torch.Tensor) -> float:
    """amax / 448 of float values (e.g. a prompt batch's rotated k), floored at 1e-6."""
    return max(float(values.abs().max()) / FP8_MAX, 1e-6)


def kv_amax(qkv: torch.Tensor, *, num_q_heads: int, num_kv_heads: int, head_dim: int,
            k_norm: torch.Tensor | None = None, eps: float = 1e-6) -> tuple[float, float]:
    """(k bound, v amax) of T tokens' fused qkv [T, (Hq + 2 Hkv) D] (float, already scaled):
    k bound = max over tokens, heads and rotary pairs (j, j + D/2) of the pair's norm (after the
    per-head k RMSNorm when `k_norm` [D] is given), which bounds |rotated k| at any position."""
    hq, hkv, d = num_q_heads, num_kv_heads, head_dim
    x = qkv.float()
    k = x[:, hq * d:(hq + hkv) * d].reshape(-1, hkv, d)
    v = x[:, (hq + hkv) * d:(hq + 2 * hkv) * d]
    if k_norm is not None:
        k = k * torch.rsqrt(k.pow(2).mean(-1, keepdim=True) + eps) * k_norm.float()
    pair = torch.sqrt(k[..., : d // 2].pow(2) + k[..., d // 2:].pow(2))
    return float(pair.max()) if pair.numel() else 0.0, float(v.abs().max()) if v.numel() else 0.0


def calibrate_layer(scale: torch.Tensor, qkv, *, num_q_heads: int, num_kv_heads: int, head_dim: int,
                    k_norm: torch.Tensor | None = None, eps: float = 1e-6) -> None:
    """Set one layer's [2] float32 (k, v) scale in place from its prefill qkv (a tensor or the FP8
    GEMM's ScaledAcc): bound / 448 each (kv_amax), floored at 1e-6. Call it before the layer's
    first K/V write (one host read: prefill is eager)."""
    from graphrt.kernels.fp8_rows import ScaledAcc
    if isinstance(qkv, ScaledAcc):                     # W8A8 weights: the Triton set's scale kernel
        from graphrt.kernels.fp8 import apply_scales
        qkv = apply_scales(qkv)
    ka, va = kv_amax(qkv, num_q_heads=num_q_heads, num_kv_heads=num_kv_heads, head_dim=head_dim,
                     k_norm=k_norm, eps=eps)
    scale.copy_(torch.tensor([max(ka / FP8_MAX, 1e-6), max(va / FP8_MAX, 1e-6)], dtype=torch.float32))


def quantize_kv(x: torch.Tensor, scale: torch.Tensor | float) -> torch.Tensor:
    """Float values -> e4m3 as the cache stores them: clamp(x / scale, +-448)."""
    return (x.float() / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8)


def dequantize_kv(x: torch.Tensor, scale: torch.Tensor | float) -> torch.Tensor:
    """e4m3 cache values (any shape) -> float32 values (x * scale)."""
    if x.dtype != FP8:
        raise ValueError(f"x: expected {FP8}, got {x.dtype}")
    return x.float() * scale


__all__ = ["calibrate_layer", "calibrate_scale", "dequantize_kv", "kv_amax", "kv_scales", "quantize_kv"]
