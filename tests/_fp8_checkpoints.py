"""Test helper: rewrite a random float checkpoint as an FP8 checkpoint (compressed-tensors or
transformers fp8) in its on-disk layout, with the independently dequantized float32 truth."""
from __future__ import annotations

import json
import shutil

import torch

LINEAR = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
FP8_MAX = 448.0


def _quantize(w: torch.Tensor, strategy: str, block, scale_dtype):
    """Independent of graphrt: (fp8 data, on-disk scale, dequantized float32 weight)."""
    w = w.float()
    n, k = w.shape
    if strategy == "block":
        bn, bk = block
        s = torch.stack([torch.stack([w[i:i + bn, j:j + bk].abs().max() for j in range(0, k, bk)])
                         for i in range(0, n, bn)]) / FP8_MAX
        full = s.repeat_interleave(bn, 0)[:n].repeat_interleave(bk, 1)[:, :k]
    elif strategy == "channel":
        s = (w.abs().amax(1, keepdim=True) / FP8_MAX).to(scale_dtype)            # [N, 1]
        full = s.float().expand(n, k)
    else:
        s = (w.abs().max() / FP8_MAX).reshape(1).to(scale_dtype)                  # [1]
        full = s.float().expand(n, k)
    data = (w / full).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn)
    return data, s, data.float() * full


def write_fp8(src, dst, kind: str, *, strategy="channel", block=(64, 64), ignore=("lm_head",),
              shards=3, scale_dtype=torch.float32, kv_scales=None):
    """Rewrite float checkpoint `src` as an FP8 checkpoint in `dst` (kind: "compressed-tensors"
    or "fp8"), in `shards` files (each weight's scale goes to the next shard). Returns the
    dequantized float32 state dict (the truth the loaded model must reproduce). kv_scales
    (compressed-tensors only): [(k, v)] per layer, written as self_attn.k_scale / v_scale [] float32
    tensors with a static per-tensor kv_cache_scheme."""
    from safetensors.torch import load_file, save_file
    dst.mkdir()
    for f in src.iterdir():
        if not f.name.endswith(".safetensors") and f.name != "model.safetensors.index.json":
            shutil.copy(f, dst / f.name)
    sd = {}
    for f in sorted(src.glob("*.safetensors")):
        sd |= load_file(str(f))
    out, truth = {}, {}
    for name, t in sd.items():
        module = name.removesuffix(".weight")
        if name.endswith(".weight") and (module.endswith(LINEAR) or module == "lm_head") \
                and module not in ignore:
            data, s, deq = _quantize(t, strategy, block, scale_dtype)
            out[name] = data
            out[module + (".weight_scale" if kind == "compressed-tensors" else ".weight_scale_inv")] = s
            truth[name] = deq
        else:
            out[name], truth[name] = t, t.float()
    for i, (ks, vs) in enumerate(kv_scales or ()):
        out[f"model.layers.{i}.self_attn.k_scale"] = torch.tensor(ks, dtype=torch.float32)
        out[f"model.layers.{i}.self_attn.v_scale"] = torch.tensor(vs, dtype=torch.float32)
    names = list(out)
    files = [{} for _ in range(shards)]
    for i, name in enumerate(names):
        files[(i + name.count("scale")) % shards][name] = out[name]   # a scale lands apart from its weight
    weight_map = {}
    for i, tensors in enumerate(files):
        fname = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        save_file(tensors, str(dst / fname), metadata={"format": "pt"})
        weight_map |= {n: fname for n in tensors}
    (dst / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    cfg = json.loads((src / "config.json").read_text())
    if kind == "compressed-tensors":
        w = {"num_bits": 8, "type": "float", "symmetric": True, "strategy": strategy, "dynamic": False}
        if strategy == "block":
            w["block_structure"] = list(block)
        cfg["quantization_config"] = {
            "quant_method": "compressed-tensors", "format": "float-quantized",
            "quantization_status": "compressed", "ignore": list(ignore),
            "kv_cache_scheme": None if kv_scales is None else {
                "num_bits": 8, "type": "float", "strategy": "tensor", "dynamic": False, "symmetric": True},
            "config_groups": {"group_0": {"targets": ["Linear"], "weights": w, "output_activations": None,
                                          "input_activations": {"num_bits": 8, "type": "float",
                                                                "strategy": "token", "dynamic": True}}}}
    else:
        cfg["quantization_config"] = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                                      "weight_block_size": list(block) if strategy == "block" else None,
                                      "modules_to_not_convert": list(ignore)}
    (dst / "config.json").write_text(json.dumps(cfg))
    return truth
