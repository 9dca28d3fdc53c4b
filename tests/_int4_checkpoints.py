"""Test helper: rewrite a random float checkpoint as an int4 checkpoint (GPTQ v1 / v2, AWQ GEMM,
compressed-tensors pack-quantized) in its published on-disk layout, with the independently
dequantized float32 truth. Written from the formats' descriptions (AutoGPTQ / GPTQModel,
AutoAWQ's WQLinear_GEMM, compressed-tensors' PackedQuantizationCompressor), not from graphrt's
readers: every packing here is explicit bit arithmetic on numpy uint32 words.

    truth = write_int4(src, dst, "gptq", group_size=32, sym=False, act_order=True)
    truth["model.layers.0.mlp.down_proj.weight"]     # [N, K] float32: (q - zero) * scale
"""
from __future__ import annotations

import json
import shutil

import numpy as np
import torch

LINEAR = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)       # AutoAWQ: word nibble i holds column 8c + AWQ_ORDER[i]


def _pack(vals: np.ndarray, order=(0, 1, 2, 3, 4, 5, 6, 7)) -> np.ndarray:
    """vals [R, 8C] ints 0..15 -> int32 [R, C]: word c = sum_i vals[:, 8c + order[i]] << 4i."""
    v = vals.astype(np.uint32).reshape(vals.shape[0], -1, 8)
    word = np.zeros(v.shape[:2], dtype=np.uint32)
    for i in range(8):
        word |= v[:, :, order[i]] << np.uint32(4 * i)
    return word.view(np.int32)


def quantize(w: torch.Tensor, g: int, sym: bool, order: torch.Tensor | None, zero_min: int = 0):
    """RTN of w [N, K] with groups of g input channels taken in `order` (act-order: channel
    order[j] is in group j // g; None: natural). Returns codes [N, K] (0..15, channel order),
    scale float16 [N, G], zero [N, G] ints, g_idx [K], truth [N, K] float32."""
    w = w.float()
    n, k = w.shape
    order = torch.arange(k) if order is None else order
    g_idx = torch.empty(k, dtype=torch.int32)
    g_idx[order] = (torch.arange(k) // g).to(torch.int32)
    wg = w[:, order].reshape(n, k // g, g)
    if sym:
        scale = (wg.abs().amax(-1) / 7).clamp(min=1e-6).half()
        zero = torch.full(scale.shape, 8.0)
    else:
        lo, hi = wg.amin(-1).clamp(max=0), wg.amax(-1).clamp(min=0)
        scale = ((hi - lo) / 15).clamp(min=1e-6).half()
        zero = torch.round(-lo / scale.float()).clamp(zero_min, 15)
    q = (torch.round(wg / scale.float()[..., None]) + zero[..., None]).clamp(0, 15)
    deq = ((q - zero[..., None]) * scale.float()[..., None]).reshape(n, k)
    codes, truth = torch.empty(n, k), torch.empty(n, k)
    codes[:, order], truth[:, order] = q.reshape(n, k), deq
    return codes.to(torch.int64), scale, zero.to(torch.int64), g_idx, truth


def _gptq(name, w, g, sym, order, v2):
    codes, scale, zero, g_idx, truth = quantize(w, g, sym, order, zero_min=0 if v2 else 1)
    stored = zero if v2 else zero - 1                            # v1 stores zero - 1
    t = {"qweight": torch.from_numpy(np.ascontiguousarray(_pack(codes.numpy()).T)),   # [K/8, N]: along K
         "qzeros": torch.from_numpy(_pack(stored.T.numpy())),   # [G, N/8]: pack along N
         "scales": scale.T.contiguous(), "g_idx": g_idx}
    return t, truth


def _awq(name, w, g, sym, order, v2):
    codes, scale, zero, _, truth = quantize(w, g, sym, None)
    t = {"qweight": torch.from_numpy(_pack(codes.T.numpy(), AWQ_ORDER)),    # [K, N/8]: pack along N
         "qzeros": torch.from_numpy(_pack(zero.T.numpy(), AWQ_ORDER)),      # [G, N/8]
         "scales": scale.T.contiguous()}
    return t, truth


def _ct(name, w, g, sym, order, v2):
    codes, scale, zero, g_idx, truth = quantize(w, g, sym, order)
    q = codes - 8                                                # signed value; stored as q + 8
    t = {"weight_packed": torch.from_numpy(_pack((q + 8).numpy())),            # [N, K/8]
         "weight_scale": scale.bfloat16() if sym else scale,
         "weight_shape": torch.tensor(list(w.shape), dtype=torch.int64)}
    if sym:                                                      # bf16 scales: truth follows them
        truth = (codes.float() - 8) * t["weight_scale"].float()[:, g_idx.long()]
    else:
        zp = zero - 8
        t["weight_zero_point"] = torch.from_numpy(_pack((zp + 8).T.numpy())).T.contiguous()   # [N/8, G]
    if order is not None:
        t["weight_g_idx"] = g_idx
    return t, truth


WRITERS = {"gptq": _gptq, "gptq_v2": _gptq, "awq": _awq, "compressed-tensors": _ct}


def write_int4(src, dst, kind: str, *, group_size: int = 32, sym: bool = True, act_order: bool = False,
               label: str | None = None, seed: int = 0) -> dict[str, torch.Tensor]:
    """Rewrite float checkpoint `src` into `dst` as `kind` ("gptq" = v1 zeros, "gptq_v2", "awq",
    "compressed-tensors"); group_size -1 = per channel. act_order: a random channel order per
    layer input (GPTQ desc_act g_idx / compressed-tensors actorder "group"), shared by the
    modules that read one input. label: GPTQ checkpoint_format written into config.json
    (default: kind's; "gptq" over v2 zeros is the mislabelled case). Returns the float32 truth
    (HF names) of every tensor."""
    from safetensors.torch import load_file, save_file
    dst.mkdir()
    for f in src.iterdir():
        if not f.name.endswith(".safetensors") and f.name != "model.safetensors.index.json":
            shutil.copy(f, dst / f.name)
    sd = {}
    for f in sorted(src.glob("*.safetensors")):
        sd |= load_file(str(f))
    gen = torch.Generator().manual_seed(seed)
    orders: dict[tuple, torch.Tensor] = {}
    out, truth = {}, {}
    for name, t in sd.items():
        module = name.removesuffix(".weight")
        if not (name.endswith(".weight") and module.endswith(LINEAR)):
            out[name], truth[name] = t, t.float()
            continue
        k = t.shape[1]
        g = k if group_size == -1 else group_size
        order = None
        if act_order:                      # one order per (layer, input): q/k/v share, gate/up share
            key = (module.rsplit(".", 1)[0], module.endswith(("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj")))
            order = orders.setdefault(key, torch.randperm(k, generator=gen))
        tensors, deq = WRITERS[kind](module, t, g, sym, order, kind == "gptq_v2")
        out |= {f"{module}.{s}": v for s, v in tensors.items()}
        truth[name] = deq
    save_file(out, str(dst / "model.safetensors"), metadata={"format": "pt"})
    cfg = json.loads((src / "config.json").read_text())
    if kind in ("gptq", "gptq_v2"):
        cfg["quantization_config"] = {"quant_method": "gptq", "bits": 4, "group_size": group_size,
                                      "desc_act": act_order, "sym": sym, "true_sequential": True,
                                      "checkpoint_format": label or kind}
    elif kind == "awq":
        cfg["quantization_config"] = {"quant_method": "awq", "bits": 4, "group_size": group_size,
                                      "zero_point": not sym, "version": "gemm", "modules_to_not_convert": None}
    else:
        w = {"num_bits": 4, "type": "int", "symmetric": sym, "dynamic": False,
             "strategy": "channel" if group_size == -1 else "group",
             "group_size": None if group_size == -1 else group_size, "actorder": "group" if act_order else None}
        cfg["quantization_config"] = {"quant_method": "compressed-tensors", "format": "pack-quantized",
                                      "quantization_status": "compressed", "ignore": ["lm_head"],
                                      "config_groups": {"group_0": {"targets": ["Linear"], "weights": w,
                                                                    "input_activations": None}}}
    (dst / "config.json").write_text(json.dumps(cfg))
    return truth
