"""FP8 (e4m3) KV cache values: per-tensor k / v scales, the float32 reading of a cache page.

    kv_scale = kv_scales(k_scale=1.0, v_scale=1.0, device=dev)   # [2] float32 (k, v), device
    rope_append_decode(..., kv_cache=fp8_cache, kv_scale=kv_scale)  # writes x / scale in e4m3
    k = dequantize_kv(fp8_cache.k, kv_scale[0])                   # float32, same shape

A stored element e means e * scale. Scales are per tensor (one k and one v scale per layer):
read from the checkpoint when it has them (compressed-tensors `k_scale` / `v_scale`, not read
yet: the loader refuses `kv_cache_scheme`), else 1.0, which suits K/V whose magnitudes stay
under 448 (e4m3's largest finite value; larger values saturate), or calibrated on a prompt
batch with `calibrate_scale` (amax / 448 of the float values the cache would hold).

On the GPU, FlashInfer (0.7.x) reads such a cache when its decode / prefill wrappers are
planned with `kv_data_type=torch.float8_e4m3fn` (q stays bf16) and run with the scales folded
in: `k_scale` multiplies the logits (equivalently sm_scale * k_scale), `v_scale` the output.
The wiring into RuntimeConfig (`kv_cache_dtype="fp8"`), the pool allocation (twice the tokens
per byte) and the device planner's FP8 plan is left to the attention runtime (see the report).
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


def quantize_kv(x: torch.Tensor, scale: torch.Tensor | float) -> torch.Tensor:
    """Float values -> e4m3 as the cache stores them: clamp(x / scale, +-448)."""
    return (x.float() / scale).clamp(-FP8_MAX, FP8_MAX).to(FP8)


def dequantize_kv(x: torch.Tensor, scale: torch.Tensor | float) -> torch.Tensor:
    """e4m3 cache values (any shape) -> float32 values (x * scale)."""
    if x.dtype != FP8:
        raise ValueError(f"x: expected {FP8}, got {x.dtype}")
    return x.float() * scale


__all__ = ["calibrate_scale", "dequantize_kv", "kv_scales", "quantize_kv"]
