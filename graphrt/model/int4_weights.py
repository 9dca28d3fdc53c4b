"""Whole-model int4 conversion of the fused layout (graphrt/model/weights.py).

    w4 = quantize_weights_int4(weights)                   # qkv / o / gate_up / down -> Int4Weight (RTN g128)
    w4 = quantize_weights_int4(weights, group_size=-1, symmetric=True, lm_head=True)

Round-to-nearest per (row, group) (`graphrt.model.quant.int4.quantize_int4`): a fused weight's
rows are independent, so quantizing it whole equals quantizing its HF parts and fusing them.
The embedding stays in the model dtype; the LM head too unless `lm_head` (untied heads only).
This is what `quantization="int4"` does while loading (graphrt/checkpoint/int4_loader.py) and
what tools/bench_e2e.py --weights int4 measures.
"""
from __future__ import annotations

from dataclasses import replace

from graphrt.model.quant.int4 import quantize_int4
from graphrt.model.weights import ModelWeights

FIELDS = ("qkv", "o", "gate_up", "down")


def quantize_weights_int4(weights: ModelWeights, *, group_size: int = 128, symmetric: bool = False,
                          lm_head: bool = False) -> ModelWeights:
    """ModelWeights with the decoder linears (and the untied LM head if `lm_head`) as
    Int4Weight on the same device; everything else shared with `weights`."""
    layers = tuple(replace(layer, **{f: quantize_int4(getattr(layer, f), group_size, symmetric=symmetric)
                                     for f in FIELDS}) for layer in weights.layers)
    head = weights.lm_head
    if lm_head and head is not weights.embed:
        head = quantize_int4(head, group_size, symmetric=symmetric)
    return replace(weights, layers=layers, lm_head=head)


__all__ = ["quantize_weights_int4"]
