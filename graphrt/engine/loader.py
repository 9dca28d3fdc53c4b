"""Load a local HF checkpoint straight into graphrt's fused weight layout on the target device.

    ckpt = load_checkpoint("path/to/dir", device="cuda")   # Checkpoint: spec + fused weights
    tok = load_tokenizer("path/to/dir")                     # transformers AutoTokenizer

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

import time
from dataclasses import dataclass
from pathlib import Path

import torch

from graphrt.engine.hf_files import CheckpointError, check_config, eos_ids, read_json, reading
from graphrt.model.llama import LlamaSpec
from graphrt.model.spec import owned_slice, shard_spec, vocab_rows

ARCHITECTURES = {"LlamaForCausalLM": "llama", "Qwen2ForCausalLM": "qwen2", "Qwen3ForCausalLM": "qwen3"}
FILE_DTYPES = {"BF16": torch.bfloat16, "F16": torch.float16, "F32": torch.float32}
INDEX = "model.safetensors.index.json"
VOCAB_TENSORS = ("model.embed_tokens.weight", "lm_head.weight")   # rows padded under tensor parallel


@dataclass(frozen=True)
class Checkpoint:
    """A loaded checkpoint. weights: {"layers": [dict per layer (fused names)], "embed",
    "final_norm", "lm_head"}, every tensor on `device` in `dtype`. eos_token_ids from
    generation_config.json / config.json; nbytes and load_s describe the tensor copy. With
    world_size > 1, `spec` is the whole model's and `weights` hold rank's tensor-parallel shard
    (graphrt/parallel/shard.py), nbytes only the bytes that rank read."""

    path: Path
    arch: str
    spec: LlamaSpec
    qk_norm: bool
    weights: dict
    dtype: torch.dtype
    device: torch.device
    eos_token_ids: tuple[int, ...]
    max_position_embeddings: int
    nbytes: int
    load_s: float
    rank: int = 0
    world_size: int = 1


def read_config(path: Path) -> tuple[dict, str]:
    """config.json as a dict and the architecture family ('llama', 'qwen2', 'qwen3')."""
    if not path.is_dir():
        raise CheckpointError(f"checkpoint: {str(path)!r} is not a directory")
    cfg_file = path / "config.json"
    if not cfg_file.is_file():
        raise CheckpointError(f"{cfg_file}: missing (a HF checkpoint needs config.json)")
    raw = read_json(cfg_file)
    archs = raw.get("architectures") or []
    if not isinstance(archs, list):
        raise CheckpointError(f"{cfg_file}: architectures: expected a list of names, got {archs!r}")
    known = [ARCHITECTURES[a] for a in archs if a in ARCHITECTURES]
    if not known:
        raise CheckpointError(f"{cfg_file}: architectures {archs} not supported; graphrt loads "
                              f"{sorted(ARCHITECTURES)}")
    check_config(raw, cfg_file)
    return raw, known[0]


def _weight_files(path: Path) -> dict[str, Path]:
    """HF tensor name -> the safetensors file holding it."""
    from safetensors import safe_open
    index = path / INDEX
    if index.is_file():
        weight_map = read_json(index).get("weight_map")
        if not isinstance(weight_map, dict) or not all(isinstance(f, str) for f in weight_map.values()):
            raise CheckpointError(f"{index}: weight_map: expected an object of tensor name -> file name")
        out = {name: path / f for name, f in weight_map.items()}
        for f in sorted(set(out.values())):
            if not f.is_file():
                raise CheckpointError(f"{f}: listed in {INDEX} but missing")
        return out
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise CheckpointError(f"{path}: no *.safetensors file and no {INDEX}")
    out = {}
    for f in files:
        if not f.is_file():
            raise CheckpointError(f"{f}: not a regular file")
        with reading(f, "safetensors header"), safe_open(str(f), framework="pt") as h:
            out.update({name: f for name in h.keys()})
    return out


def _expected(spec: LlamaSpec, arch: str) -> dict[str, tuple[tuple[int, ...], tuple]]:
    """HF tensor name -> (shape implied by config.json, (fused destination, row offset))."""
    s = spec
    h, d, inter = s.hidden_size, s.head_dim, s.intermediate_size
    q, kv = s.num_heads * d, s.num_kv_heads * d
    exp = {"model.embed_tokens.weight": ((s.vocab_size, h), ("embed", 0)),
           "model.norm.weight": ((h,), ("final_norm", 0))}
    if not s.tie_word_embeddings:
        exp["lm_head.weight"] = ((s.vocab_size, h), ("lm_head", 0))
    for i in range(s.num_layers):
        p = f"model.layers.{i}."
        exp |= {p + "input_layernorm.weight": ((h,), (i, "input_norm", 0)),
                p + "post_attention_layernorm.weight": ((h,), (i, "post_attn_norm", 0)),
                p + "self_attn.q_proj.weight": ((q, h), (i, "qkv", 0)),
                p + "self_attn.k_proj.weight": ((kv, h), (i, "qkv", q)),
                p + "self_attn.v_proj.weight": ((kv, h), (i, "qkv", q + kv)),
                p + "self_attn.o_proj.weight": ((h, q), (i, "o", 0)),
                p + "mlp.gate_proj.weight": ((inter, h), (i, "gate_up", 0)),
                p + "mlp.up_proj.weight": ((inter, h), (i, "gate_up", inter)),
                p + "mlp.down_proj.weight": ((h, inter), (i, "down", 0))}
        if s.attention_bias:
            exp |= {p + "self_attn.q_proj.bias": ((q,), (i, "qkv_bias", 0)),
                    p + "self_attn.k_proj.bias": ((kv,), (i, "qkv_bias", q)),
                    p + "self_attn.v_proj.bias": ((kv,), (i, "qkv_bias", q + kv))}
        if arch == "qwen3":
            exp |= {p + "self_attn.q_norm.weight": ((d,), (i, "q_norm", 0)),
                    p + "self_attn.k_norm.weight": ((d,), (i, "k_norm", 0))}
    return exp


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


def _eos_ids(path: Path, raw: dict, vocab_size: int) -> tuple[int, ...]:
    gen = path / "generation_config.json"
    if gen.exists():
        eos = read_json(gen).get("eos_token_id")
        if eos is not None:
            return eos_ids(eos, gen, vocab_size)
    eos = raw.get("eos_token_id")
    return () if eos is None else eos_ids(eos, path / "config.json", vocab_size)


def file_dtype(path) -> torch.dtype:
    """The dtype the checkpoint stores its embedding in (reads one header, no tensor data)."""
    from safetensors import safe_open
    path = Path(path)
    read_config(path)
    f = _weight_files(path).get("model.embed_tokens.weight")
    if f is None:
        raise CheckpointError(f"{path}: tensor 'model.embed_tokens.weight' missing from the safetensors files")
    with reading(f, "safetensors header"), safe_open(str(f), framework="pt") as h:
        kind = h.get_slice("model.embed_tokens.weight").get_dtype()
    if kind not in FILE_DTYPES:
        raise CheckpointError(f"{f.name}: tensor 'model.embed_tokens.weight' has dtype {kind}; "
                              f"supported {sorted(FILE_DTYPES)}")
    return FILE_DTYPES[kind]


def load_checkpoint(path, *, device="cpu", dtype: torch.dtype | None = None, rank: int = 0,
                    world_size: int = 1, quantization: str | None = None) -> Checkpoint:
    """Read `path` (a local HF directory) into the fused layout on `device`.

    dtype: the weights' dtype on the device (default: the checkpoint's, from its embedding).
    rank, world_size: tensor parallelism; the rank reads only its slice of every sharded tensor
    (safetensors get_slice) into the per-rank fused layout (graphrt/parallel/shard.py).
    quantization: "fp8" quantizes a float checkpoint's linear layers while loading; FP8
    checkpoints (config.json `quantization_config`) load as FP8 without it
    (graphrt/engine/quant_loader.py).
    Raises CheckpointError naming the file and tensor for a missing file or tensor, an
    unsupported architecture or dtype, or a shape that does not match config.json.
    """
    from safetensors import safe_open
    from transformers import AutoConfig
    path = Path(path)
    raw, arch = read_config(path)
    with reading(path / "config.json"):
        spec = LlamaSpec.from_hf(AutoConfig.from_pretrained(str(path)))
    for name, v in (("world_size", world_size), ("rank", rank)):
        if isinstance(v, bool) or not isinstance(v, int):
            raise ValueError(f"{name}: expected an int, got {v!r}")
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"rank: {rank} is not in [0, world_size={world_size})")
    if quantization is not None or raw.get("quantization_config") is not None:
        from graphrt.engine.quant_loader import load_quantized   # FP8 (graphrt/model/quant)
        return load_quantized(path, raw, arch, spec, quantization, device=device, dtype=dtype,
                              rank=rank, world_size=world_size)
    local = spec if world_size == 1 else shard_spec(spec, world_size)
    files = _weight_files(path)
    expected = _expected(spec, arch)
    missing = [n for n in expected if n not in files]
    if missing:
        raise CheckpointError(f"{path}: tensor {missing[0]!r} missing from the safetensors files "
                              f"({len(missing)} missing in all)")
    by_file: dict[Path, list[str]] = {}
    for name in expected:
        by_file.setdefault(files[name], []).append(name)
    # check every header (shapes, dtypes) before allocating device memory
    for f, names in by_file.items():
        with reading(f, "safetensors header"), safe_open(str(f), framework="pt") as h:
            for name in names:
                sl = h.get_slice(name)
                shape, kind = tuple(sl.get_shape()), sl.get_dtype()
                if kind not in FILE_DTYPES:
                    raise CheckpointError(f"{f.name}: tensor {name!r} has dtype {kind}; supported "
                                          f"{sorted(FILE_DTYPES)}")
                if shape != expected[name][0]:
                    raise CheckpointError(f"{f.name}: tensor {name!r} has shape {list(shape)}, "
                                          f"config.json implies {list(expected[name][0])}")
                if name == "model.embed_tokens.weight" and dtype is None:
                    dtype = FILE_DTYPES[kind]
    device = torch.device(device)
    weights = _allocate(local, arch, dtype, device)
    placed = expected if world_size == 1 else _expected(local, arch)   # per-rank destinations
    t0, nbytes = time.perf_counter(), 0
    for f, names in by_file.items():
        with reading(f, "tensor data"), safe_open(str(f), framework="pt") as h:
            for name in names:
                if name in VOCAB_TENSORS and world_size > 1:   # padded rows: zero, nothing read
                    a, b = vocab_rows(spec.vocab_size, local.vocab_size, rank)
                    dest = _destination(weights, placed[name][1], local.vocab_size)
                    dest[b - a:].zero_()
                    if b > a:
                        t = h.get_slice(name)[a:b]
                        dest[: b - a].copy_(t)
                        nbytes += t.numel() * t.element_size()
                    continue
                cut = owned_slice(expected[name][0], placed[name][0], rank)
                if cut is None:
                    t = h.get_tensor(name)                # one tensor on the host at a time
                else:                                     # only this rank's block is read
                    dim, a, b = cut
                    sl = h.get_slice(name)
                    t = sl[a:b] if dim == 0 else sl[:, a:b]
                _destination(weights, placed[name][1], t.shape[0]).copy_(t)
                nbytes += t.numel() * t.element_size()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return Checkpoint(path, arch, spec, arch == "qwen3", weights, dtype, device, _eos_ids(path, raw, spec.vocab_size),
                      int(raw.get("max_position_embeddings") or 0), nbytes, time.perf_counter() - t0,
                      rank, world_size)


def load_tokenizer(path):
    """transformers AutoTokenizer from the checkpoint directory (chat template included)."""
    from transformers import AutoTokenizer
    path = Path(path)
    if not any((path / f).is_file() for f in ("tokenizer.json", "tokenizer.model", "vocab.json")):
        raise CheckpointError(f"{path}: no tokenizer files (tokenizer.json, tokenizer.model or vocab.json)")
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        if (path / name).exists():
            read_json(path / name)                     # one line naming the file, line and column
    named = path / "tokenizer.json" if (path / "tokenizer.json").is_file() else path
    with reading(named, "tokenizer"):
        return AutoTokenizer.from_pretrained(str(path))


__all__ = ["Checkpoint", "CheckpointError", "file_dtype", "load_checkpoint", "load_tokenizer", "read_config"]
