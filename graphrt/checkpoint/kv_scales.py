"""A checkpoint's FP8 KV cache scales: one k and one v scale per layer (per tensor).

compressed-tensors checkpoints with a `kv_cache_scheme` (llm-compressor's FP8 KV recipe) store
`model.layers.<i>.self_attn.k_scale` and `.v_scale`, [] or [1] floats, for every layer (older
exports: `self_attn.k_proj.output_scale` / `v_proj.output_scale`). A stored KV value e means
e * scale. They are used with kv_cache_dtype="fp8" (graphrt/model/quant/kv.py); otherwise the
KV cache stays in the model dtype and they are unused. A missing, non-scalar, zero, negative or
non-finite scale is a CheckpointError naming the tensor and the file.
"""
from __future__ import annotations

from graphrt.checkpoint.files import CheckpointError, TensorFiles, check_scale

_NAMES = (("self_attn.k_scale", "self_attn.v_scale"),
          ("self_attn.k_proj.output_scale", "self_attn.v_proj.output_scale"))


def kv_scale_names(rd: TensorFiles, num_layers: int) -> list[tuple[str, str]]:
    """The (k, v) scale tensor names of each layer, as present in the checkpoint's files."""
    out = []
    for i in range(num_layers):
        for k, v in _NAMES:
            names = (f"model.layers.{i}.{k}", f"model.layers.{i}.{v}")
            if all(n in rd.files for n in names):
                out.append(names)
                break
        else:
            raise CheckpointError(f"{rd.path}: quantization_config.kv_cache_scheme is set but layer {i} "
                                  f"has no tensors model.layers.{i}.{_NAMES[0][0]} / .{_NAMES[0][1]}")
    return out


def read_kv_scales(rd: TensorFiles, num_layers: int) -> tuple[tuple[float, float], ...]:
    """((k_scale, v_scale) per layer) as host floats, each checked finite and > 0."""
    out = []
    for names in kv_scale_names(rd, num_layers):
        pair = []
        for name in names:
            t = rd.tensor(name).float()
            if t.numel() != 1:
                raise CheckpointError(f"{rd.file(name)}: tensor {name!r}: a per-tensor KV scale has one "
                                      f"value, got shape {list(t.shape)}")
            check_scale(name, rd.file(name), t)
            pair.append(float(t.reshape(())))
        out.append(tuple(pair))
    return tuple(out)


__all__ = ["kv_scale_names", "read_kv_scales"]
