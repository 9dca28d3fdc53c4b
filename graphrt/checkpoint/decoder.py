"""The loaded checkpoint as graphrt's decoder: the loader's fused tensors, no copies."""
from __future__ import annotations

from dataclasses import fields

from graphrt.model.llama import LlamaDecoder
from graphrt.model.weights import LayerWeights, ModelWeights
from graphrt.checkpoint.files import Checkpoint


def build_model(ckpt: Checkpoint, *, max_positions: int | None = None, tp=None,
                kernels: str | None = None) -> LlamaDecoder:
    """LlamaDecoder over ckpt.weights (the fused layout of model/weights.py, as the loader
    allocated it on the device); max_positions: rows of the RoPE table (default: the spec's).
    tp: the rank's `graphrt.parallel.TensorParallel` when ckpt holds a tensor-parallel shard.
    kernels: LlamaDecoder's (None: torch on a CPU, triton on CUDA; kernels/ops.py)."""
    if (tp.world_size if tp is not None else 1) != ckpt.world_size:
        raise ValueError(f"tp: world_size {tp.world_size if tp is not None else 1} does not match "
                         f"the checkpoint's shard (world_size={ckpt.world_size})")
    w = ckpt.weights
    names = [f.name for f in fields(LayerWeights)]
    layers = tuple(LayerWeights(**{n: layer[n] for n in names}) for layer in w["layers"])
    weights = ModelWeights(embed=w["embed"], final_norm=w["final_norm"], lm_head=w["lm_head"],
                           layers=layers)
    return LlamaDecoder(ckpt.spec, weights, max_positions=max_positions, tp=tp, kernels=kernels)
