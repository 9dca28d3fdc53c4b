"""Test helper: random HF checkpoints written by tools/make_checkpoint.py (the real file path)."""
from __future__ import annotations

import importlib.util
from pathlib import Path

_TOOL = Path(__file__).resolve().parent.parent / "tools" / "make_checkpoint.py"


def make_checkpoint_module():
    spec = importlib.util.spec_from_file_location("make_checkpoint", _TOOL)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def write(tmp_path_factory, name: str, **kw) -> Path:
    """Write a checkpoint (make_checkpoint.write_checkpoint kwargs) under a fresh tmp dir."""
    return make_checkpoint_module().write_checkpoint(tmp_path_factory.mktemp(name), **kw)


BF16_GAP = 2 ** -5     # float32 truth's top-2 gap under this (relative to the top logit, ~4 bf16 ulps): a tie


def assert_greedy_matches_hf(hf, prompt: list[int], out: list[int]) -> None:
    """Greedy tokens `out` after `prompt`, token by token against HF's logits (GPU; `hf` should be
    the float32 truth); a difference is allowed only at a top-2 tie (BF16_GAP), then it stops."""
    import torch
    seq = list(prompt)
    for i, tok in enumerate(out):
        with torch.no_grad():
            logits = hf(torch.tensor([seq], device="cuda")).logits[0, -1].float()
        top2 = torch.topk(logits, 2)
        if tok != int(top2.indices[0]):
            gap = float(top2.values[0] - logits[tok])
            assert gap <= BF16_GAP * abs(float(top2.values[0])) + 1e-3, \
                f"token {i}: graphrt {tok}, HF {int(top2.indices[0])}, gap {gap}"
            return
        seq.append(tok)


# ---- FP8 checkpoints (graphrt/engine/quant_loader.py) ---------------------------------------
LINEAR = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
FP8_MAX = 448.0


def _quantize(w, strategy: str, block, scale_dtype):
    """Independent of graphrt: (fp8 data, on-disk scale, dequantized float32 weight)."""
    import torch
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
              shards=3, scale_dtype=None):
    """Rewrite float checkpoint `src` as an FP8 checkpoint in `dst` (kind: "compressed-tensors"
    or "fp8"), in `shards` files (each weight's scale goes to the next shard). Returns the
    dequantized float32 state dict (the truth the loaded model must reproduce)."""
    import json
    import shutil

    import torch
    from safetensors.torch import load_file, save_file
    scale_dtype = scale_dtype or torch.float32
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
            "quantization_status": "compressed", "kv_cache_scheme": None, "ignore": list(ignore),
            "config_groups": {"group_0": {"targets": ["Linear"], "weights": w, "output_activations": None,
                                          "input_activations": {"num_bits": 8, "type": "float",
                                                                "strategy": "token", "dynamic": True}}}}
    else:
        cfg["quantization_config"] = {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
                                      "weight_block_size": list(block) if strategy == "block" else None,
                                      "modules_to_not_convert": list(ignore)}
    (dst / "config.json").write_text(json.dumps(cfg))
    return truth
