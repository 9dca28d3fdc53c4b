"""Quantized weights next to the model's linear layers: FP8 (e4m3) storage and scales
(`fp8`), int4 weight-only storage (`int4`: packed codes, group scales and zeros), FP8 KV (`kv`), checkpoint formats (`formats`), a tensor-parallel rank's part of the
scales (`shard`). A leaf of graphrt.model: it imports
nothing from the model (whole-model conversion is graphrt/model/fp8_weights.py)."""
from graphrt.model.quant.fp8 import FP8, FP8_MAX, Fp8Weight, cat_rows, quantize_fp8

__all__ = ["FP8", "FP8_MAX", "Fp8Weight", "cat_rows", "quantize_fp8"]
