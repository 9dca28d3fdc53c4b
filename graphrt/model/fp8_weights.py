"""Whole-model FP8 conversion of `ModelWeights` (graphrt/model/weights.py), both directions; it sits
above both weights.py and the FP8 storage of graphrt/model/quant/, so imports point one way
(quant/ imports nothing from the model).

    w8 = quantize_weights(w, "channel")        # qkv / o / gate_up / down -> Fp8Weight
    w8 = quantize_weights(w, "fused-tensor")   # one scale per fused GEMM weight (tensor_scale)
    ref = dequantize_weights(w8)               # float32 ModelWeights: the reference model

Per-tensor and per-channel quantization of a fused weight quantizes each HF part (q, k, v;
gate, up) on its own, so a fused weight holds exactly what an FP8 checkpoint stores for its
parts (per-tensor parts become per-channel rows). Block quantization works on the fused rows
(the parts' row counts are multiples of the block rows in the models that ship block scales).
"fused-tensor" quantizes each fused weight (qkv, gate_up, o, down, lm_head) with one scale: its
W8A8 GEMM then applies the scale itself and the consuming kernels read no column scales (the
fastest FP8 decode step); its quality is measured, not assumed (tools/eval_ppl.py).
"""
from __future__ import annotations

from dataclasses import replace

import torch

from graphrt.model.quant.fp8 import Fp8Weight, cat_rows, quantize_fp8
from graphrt.model.quant.int4 import Int4Weight
from graphrt.model.spec import LlamaSpec
from graphrt.model.weights import ModelWeights


def part_rows(spec: LlamaSpec, field: str) -> tuple[int, ...]:
    """Row counts of the HF parts a fused field concatenates (rank-local spec under TP)."""
    d = spec.head_dim
    if field == "qkv":
        return (spec.num_heads * d, spec.num_kv_heads * d, spec.num_kv_heads * d)
    if field == "gate_up":
        return (spec.intermediate_size,) * 2
    return ()


def quantize_weights(weights: ModelWeights, spec: LlamaSpec, strategy: str = "channel", *,
                     lm_head: bool = False, block: tuple[int, int] = (128, 128)) -> ModelWeights:
    """ModelWeights with qkv / o / gate_up / down (and lm_head if `lm_head` and untied) as
    Fp8Weight on the same device; everything else shared with `weights`."""
    def q(t, field):
        if strategy == "fused-tensor":
            return quantize_fp8(t, "tensor")
        rows = part_rows(spec, field)
        if strategy == "block" or not rows:
            return quantize_fp8(t, strategy, block=block)
        return cat_rows([quantize_fp8(p, strategy) for p in torch.split(t, rows)])
    layers = tuple(replace(layer, **{f: q(getattr(layer, f), f) for f in ("qkv", "o", "gate_up", "down")})
                   for layer in weights.layers)
    head = weights.lm_head
    if lm_head and head is not weights.embed:
        head = quantize_fp8(head, "tensor" if strategy == "fused-tensor" else strategy, block=block)
    return replace(weights, layers=layers, lm_head=head)


def dequantize_weights(weights: ModelWeights, dtype: torch.dtype = torch.float32) -> ModelWeights:
    """Every tensor in `dtype`; Fp8Weight / Int4Weight fields dequantized (computed in float32)."""
    def d(t):
        if t is None:
            return None
        return t.dequantize(dtype) if isinstance(t, (Fp8Weight, Int4Weight)) else t.to(dtype)
    layers = tuple(replace(layer, **{f: d(getattr(layer, f)) for f in layer.__dataclass_fields__})
                   for layer in weights.layers)
    embed = d(weights.embed)
    head = embed if weights.lm_head is weights.embed else d(weights.lm_head)
    return ModelWeights(embed=embed, final_norm=d(weights.final_norm), lm_head=head, layers=layers)


__all__ = ["dequantize_weights", "part_rows", "quantize_weights"]
