"""Test helper: a HF checkpoint directory (tools/make_checkpoint.py's) written as a GGUF file by
the `gguf` package's GGUFWriter, the way llama.cpp's converter lays it out (written here from the
format's published conventions, independently of graphrt's reader):

- tensor names token_embd / output_norm / output and blk.N.{attn_norm, attn_q, attn_k, attn_v,
  attn_output, attn_q_norm, attn_k_norm, ffn_norm, ffn_gate, ffn_up, ffn_down}.{weight,bias};
- the llama architecture's q / k rows permuted per head (w.reshape(h, 2, D/2, ...).swapaxes(1, 2));
- 2-D weights in `qtype` (gguf.quants.quantize), 1-D tensors (norms, biases) in F32;
- Llama 3 RoPE scaling as a `rope_freqs.weight` tensor of per-frequency divisors, computed as
  llama.cpp's converter computes them (original context 8192, low 1, high 4);
- the tokenizer.json's byte-level BPE as tokenizer.ggml.* metadata (added tokens as CONTROL).
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import torch

LAYER = {"input_layernorm.weight": "attn_norm.weight", "post_attention_layernorm.weight": "ffn_norm.weight",
         "self_attn.q_proj.weight": "attn_q.weight", "self_attn.k_proj.weight": "attn_k.weight",
         "self_attn.v_proj.weight": "attn_v.weight", "self_attn.o_proj.weight": "attn_output.weight",
         "self_attn.q_proj.bias": "attn_q.bias", "self_attn.k_proj.bias": "attn_k.bias",
         "self_attn.v_proj.bias": "attn_v.bias", "self_attn.q_norm.weight": "attn_q_norm.weight",
         "self_attn.k_norm.weight": "attn_k_norm.weight", "mlp.gate_proj.weight": "ffn_gate.weight",
         "mlp.up_proj.weight": "ffn_up.weight", "mlp.down_proj.weight": "ffn_down.weight"}
TOP = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
       "lm_head.weight": "output.weight"}


def gguf_name(hf: str) -> str:
    if hf in TOP:
        return TOP[hf]
    _, _, i, rest = hf.split(".", 3)
    return f"blk.{i}.{LAYER[rest]}"


def llama_cpp_permute(w: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp convert_hf_to_gguf's LlamaModel.permute (rotate_half rows -> interleaved)."""
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def llama3_rope_factors(theta: float, head_dim: int, factor: float) -> np.ndarray:
    """llama.cpp's rope_freqs for Llama 3.1 (low 1, high 4, original context 8192)."""
    freqs = 1.0 / (theta ** (np.arange(0, head_dim, 2, dtype=np.float32) / head_dim))
    low_wl, high_wl, out = 8192 / 1.0, 8192 / 4.0, []
    for f in freqs:
        wl = 2 * math.pi / f
        if wl < high_wl:
            out.append(1.0)
        elif wl > low_wl:
            out.append(factor)
        else:
            smooth = (8192 / wl - 1.0) / (4.0 - 1.0)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return np.array(out, dtype=np.float32)


def hf_tensors(hf_dir: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file
    out = {}
    for f in sorted(Path(hf_dir).glob("*.safetensors")):
        out |= load_file(str(f))
    return out


def write_gguf(hf_dir, out_file, *, qtype: str = "F32", arch: str | None = None, pre: str = "default",
               drop: tuple[str, ...] = (), skip_tokenizer: bool = False, extra=None) -> Path:
    """hf_dir (a make_checkpoint directory) -> out_file (.gguf). qtype: the 2-D weights' GGML type
    name ("F32", "F16", "Q8_0", "Q4_0", "Q4_1", ...); arch: general.architecture (default the
    config's model_type); drop: HF tensor names left out; extra(writer): more metadata / tensors."""
    import gguf
    from gguf.quants import quantize
    hf_dir, out_file = Path(hf_dir), Path(out_file)
    cfg = json.loads((hf_dir / "config.json").read_text())
    arch = arch or cfg["model_type"]
    heads, kv, d = cfg["num_attention_heads"], cfg["num_key_value_heads"], cfg["head_dim"]
    w = gguf.GGUFWriter(str(out_file), arch)
    w.add_block_count(cfg["num_hidden_layers"])
    w.add_context_length(cfg["max_position_embeddings"])
    w.add_embedding_length(cfg["hidden_size"])
    w.add_feed_forward_length(cfg["intermediate_size"])
    w.add_head_count(heads)
    w.add_head_count_kv(kv)
    w.add_key_length(d)
    w.add_value_length(d)
    w.add_rope_dimension_count(d)
    w.add_rope_freq_base(cfg["rope_theta"])
    w.add_layer_norm_rms_eps(cfg["rms_norm_eps"])
    w.add_vocab_size(cfg["vocab_size"])
    if not skip_tokenizer:
        _tokenizer(w, hf_dir, pre)
    qt = gguf.GGMLQuantizationType[qtype]
    for name, t in hf_tensors(hf_dir).items():
        if name in drop:
            continue
        a = t.float().numpy()
        if arch == "llama" and name.endswith(("q_proj.weight", "q_proj.bias")):
            a = llama_cpp_permute(a, heads)
        elif arch == "llama" and name.endswith(("k_proj.weight", "k_proj.bias")):
            a = llama_cpp_permute(a, kv)
        if a.ndim == 1 or qt == gguf.GGMLQuantizationType.F32:
            w.add_tensor(gguf_name(name), np.ascontiguousarray(a, dtype=np.float32))
        elif qt == gguf.GGMLQuantizationType.F16:
            w.add_tensor(gguf_name(name), a.astype(np.float16))
        else:
            w.add_tensor(gguf_name(name), quantize(a, qt), raw_dtype=qt)
    scaling = cfg.get("rope_scaling")
    if scaling and scaling.get("rope_type") == "llama3":
        w.add_tensor("rope_freqs.weight", llama3_rope_factors(cfg["rope_theta"], d, scaling["factor"]))
    if extra is not None:
        extra(w)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return out_file


def _tokenizer(w, hf_dir: Path, pre: str) -> None:
    tj = json.loads((hf_dir / "tokenizer.json").read_text())
    tc = json.loads((hf_dir / "tokenizer_config.json").read_text())
    vocab = dict(tj["model"]["vocab"])
    for t in tj["added_tokens"]:
        vocab[t["content"]] = t["id"]
    tokens = [None] * (max(vocab.values()) + 1)
    for t, i in vocab.items():
        tokens[i] = t
    added = {t["content"] for t in tj["added_tokens"]}
    merges = [m if isinstance(m, str) else " ".join(m) for m in tj["model"]["merges"]]
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre(pre)
    w.add_token_list(tokens)
    w.add_token_types([3 if t in added else 1 for t in tokens])
    w.add_token_merges(merges)
    w.add_bos_token_id(vocab[tc["bos_token"]])
    w.add_eos_token_id(vocab[tc["eos_token"]])
    w.add_pad_token_id(vocab[tc["pad_token"]])
    w.add_add_bos_token(False)
    template = hf_dir / "chat_template.jinja"
    w.add_chat_template(template.read_text() if template.is_file() else tc["chat_template"])


def roundtrip(t: torch.Tensor, qtype: str) -> torch.Tensor:
    """What a 2-D weight reads back as after write_gguf's quantization (float32)."""
    import gguf
    from gguf.quants import dequantize, quantize
    qt = gguf.GGMLQuantizationType[qtype]
    a = t.float().numpy()
    if t.ndim == 1 or qtype == "F32":
        return torch.from_numpy(a.copy())
    if qtype == "F16":
        return torch.from_numpy(a.astype(np.float16).astype(np.float32))
    return torch.from_numpy(dequantize(quantize(a, qt), qt).reshape(a.shape).copy())
