"""Load a local HF checkpoint straight into graphrt's fused weight layout on the target device.

    ckpt = load_checkpoint("path/to/dir", device="cuda")   # Checkpoint: spec + fused weights
    tok = load_tokenizer("path/to/dir")                     # graphrt/checkpoint/tokenizer.py (no transformers)
    ck = load_checkpoint("model.gguf")                      # a llama.cpp GGUF file (gguf_file.py), dequantized

Reads config.json (architecture, shapes) and the safetensors file(s), single or sharded
(model.safetensors.index.json). Each fused tensor is allocated once on the target device and the
HF tensors are copied into its row slices one at a time: no transformers model, no second full
copy in host memory (at most one HF tensor is materialised on the host at a time).

Fused layout (per layer): input_norm [H], post_attn_norm [H], qkv [(Hq + 2 Hkv) D, H] (rows q, k, v),
qkv_bias [(Hq + 2 Hkv) D] or None (Qwen2), q_norm / k_norm [D] or None (Qwen3), o [H, Hq D],
gate_up [2 I, H] (rows gate, up), down [H, I]; global embed [V, H], final_norm [H], lm_head [V, H]
(the same tensor as embed when tie_word_embeddings).
"""
from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import torch

from graphrt.checkpoint.files import (FILE_DTYPES, Checkpoint, CheckpointError, FiniteCheck,
                                             eos_token_ids, expected_tensors, open_tensors, read_config,
                                             read_spec, retie_or_warn, untie_if_present, warn_unused)
from graphrt.checkpoint.gguf_file import find_gguf, open_gguf
from graphrt.checkpoint.int4_config import is_int4
from graphrt.checkpoint.tokenizer import load_tokenizer as load_hf_tokenizer
from graphrt.model.spec import LlamaSpec, owned_slice, shard_spec, vocab_rows

VOCAB_TENSORS = ("model.embed_tokens.weight", "lm_head.weight")   # rows padded under tensor parallel


def _allocate(spec: LlamaSpec, arch: str, dtype, device) -> dict:
    s = spec
    h, d, inter = s.hidden_size, s.head_dim, s.intermediate_size
    rows = (s.num_heads + 2 * s.num_kv_heads) * d

    def e(*shape):
        return torch.empty(shape, dtype=dtype, device=device)
    layers = [{"input_norm": e(h), "post_attn_norm": e(h), "qkv": e(rows, h),
               "qkv_bias": e(rows) if s.attention_bias else None,
               "q_norm": e(d) if arch == "qwen3" else None, "k_norm": e(d) if arch == "qwen3" else None,
               "o": e(h, s.num_heads * d), "gate_up": e(2 * inter, h), "down": e(h, inter)}
              for _ in range(s.num_layers)]
    embed = e(s.vocab_size, h)
    return {"layers": layers, "embed": embed, "final_norm": e(h),
            "lm_head": embed if s.tie_word_embeddings else e(s.vocab_size, h)}


def _destination(weights: dict, where: tuple, rows: int) -> torch.Tensor:
    if isinstance(where[0], int):
        layer, name, off = where
        return weights["layers"][layer][name][off:off + rows]
    name, off = where
    return weights[name][off:off + rows]


def load_tokenizer(path):
    """The checkpoint's tokenizer: a GGUF file's from its metadata (gguf_tokenizer.py), else the
    directory's tokenizer files (tokenizer.py's load_tokenizer)."""
    gguf = find_gguf(Path(path))
    if gguf is None:
        return load_hf_tokenizer(path)
    from graphrt.checkpoint.gguf_tokenizer import gguf_tokenizer
    return gguf_tokenizer(open_gguf(gguf))


def file_dtype(path) -> torch.dtype:
    """The dtype the checkpoint stores its embedding in (reads one header, no tensor data)."""
    path = Path(path)
    raw, _ = read_config(path)
    f, _, kind = open_tensors(path, raw).header("model.embed_tokens.weight")
    if kind not in FILE_DTYPES:
        raise CheckpointError(f"{f}: tensor 'model.embed_tokens.weight' has dtype {kind}; "
                              f"supported {sorted(FILE_DTYPES)}")
    return FILE_DTYPES[kind]


def load_checkpoint(path, *, device="cpu", dtype: torch.dtype | None = None, rank: int = 0,
                    world_size: int = 1, quantization: str | None = None) -> Checkpoint:
    """Read `path` (a local HF directory, or a GGUF file / a directory holding one GGUF file and
    no config.json: graphrt/checkpoint/gguf_file.py) into the fused layout on `device`.

    dtype: the weights' dtype on the device (default: the checkpoint's, from its embedding).
    rank, world_size: tensor parallelism; the rank reads only its slice of every sharded tensor
    (safetensors get_slice) into the per-rank fused layout (graphrt/parallel/shard.py).
    quantization: "fp8" / "int4" quantizes a float checkpoint's linear layers while loading; FP8
    and int4 checkpoints (config.json `quantization_config`: GPTQ, AWQ, compressed-tensors) load
    as such without it (graphrt/checkpoint/fp8_loader.py, int4_loader.py).
    Raises CheckpointError naming the file and tensor for a missing, unreadable or truncated
    file or tensor, an unsupported architecture, activation, RoPE setting or dtype, a shape that
    does not match config.json, or a weight holding NaN / Inf (checked on `device`).
    Tensors config.json does not use are dropped with one warning line naming them; with
    tie_word_embeddings, an `lm_head.weight` that differs from the embedding is used untied
    (with a warning), as transformers does.
    """
    t_config = time.perf_counter()
    path = Path(path)
    raw, arch, spec = read_spec(path)
    config_s = time.perf_counter() - t_config
    for name, v in (("world_size", world_size), ("rank", rank)):
        if isinstance(v, bool) or not isinstance(v, int):
            raise ValueError(f"{name}: expected an int, got {v!r}")
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"rank: {rank} is not in [0, world_size={world_size})")
    files = open_tensors(path, raw)                   # safetensors, or a GGUF file dequantized on the host
    spec, untie = untie_if_present(spec, files.names)
    if is_int4(raw, quantization):
        from graphrt.checkpoint.int4_loader import load_int4         # GPTQ / AWQ / W4A16 / RTN int4
        return dataclasses.replace(load_int4(path, raw, arch, spec, quantization, files, device=device,
                                             dtype=dtype, untie=untie, rank=rank, world_size=world_size),
                                   config_s=config_s)
    if quantization is not None or raw.get("quantization_config") is not None:
        from graphrt.checkpoint.fp8_loader import load_quantized   # FP8 (graphrt/model/quant)
        return dataclasses.replace(load_quantized(path, raw, arch, spec, quantization, files, device=device,
                                                  dtype=dtype, untie=untie, rank=rank, world_size=world_size),
                                   config_s=config_s)
    local = spec if world_size == 1 else shard_spec(spec, world_size)
    expected = expected_tensors(spec, arch)
    missing = [n for n in expected if n not in files.names]
    if missing:
        raise CheckpointError(f"{path}: tensor {missing[0]!r} missing from the tensor files "
                              f"({len(missing)} missing in all)")
    # check every header (shapes, dtypes) before allocating device memory
    for name, (shape_want, _) in expected.items():
        f, shape, kind = files.header(name)
        if kind not in FILE_DTYPES:
            raise CheckpointError(f"{f}: tensor {name!r} has dtype {kind}; supported {sorted(FILE_DTYPES)}")
        if shape != shape_want:
            raise CheckpointError(f"{f}: tensor {name!r} has shape {list(shape)}, config.json implies "
                                  f"{list(shape_want)}")
        if name == "model.embed_tokens.weight" and dtype is None:
            dtype = FILE_DTYPES[kind]
    warn_unused(path, files.names, set(expected), f" (num_hidden_layers={spec.num_layers})")
    device = torch.device(device)
    weights = _allocate(local, arch, dtype, device)
    placed = expected if world_size == 1 else expected_tensors(local, arch)   # per-rank destinations
    finite = FiniteCheck()
    t0, nbytes = time.perf_counter(), 0
    for name in sorted(expected, key=lambda n: (str(files.file(n)), n)):     # file by file
        f = files.file(name)
        if name in VOCAB_TENSORS and world_size > 1:   # padded rows: zero, nothing read
            a, b = vocab_rows(spec.vocab_size, local.vocab_size, rank)
            dest = _destination(weights, placed[name][1], local.vocab_size)
            dest[b - a:].zero_()
            if b > a:
                t = files.tensor(name, rows=(a, b), out=dest[: b - a])
                nbytes += t.numel() * t.element_size()
                finite.add(name, f, t)
            continue
        cut = owned_slice(expected[name][0], placed[name][0], rank)
        dest = _destination(weights, placed[name][1], placed[name][0][0])
        if cut is None:                               # one tensor on the host at a time, read into dest
            t = files.tensor(name, out=dest)
        else:                                         # only this rank's block is read
            dim, a, b = cut
            t = files.tensor(name, **{"rows" if dim == 0 else "cols": (a, b)}, out=dest)
        nbytes += t.numel() * t.element_size()
        finite.add(name, f, t)
    finite.raise_bad()                                # one host sync for the whole checkpoint
    if untie:
        spec = retie_or_warn(path, spec, weights, world_size)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return Checkpoint(path, arch, spec, arch == "qwen3", weights, dtype, device,
                      eos_token_ids(path, raw, spec.vocab_size), int(raw.get("max_position_embeddings") or 0),
                      nbytes, time.perf_counter() - t0, rank, world_size, config_s=config_s)


__all__ = ["Checkpoint", "CheckpointError", "file_dtype", "load_checkpoint", "load_tokenizer", "read_config"]
