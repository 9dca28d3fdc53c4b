"""The tensor files of a HF checkpoint directory, shared by the float loader (loader.py) and the
FP8 loader (quant_loader.py): which file holds which tensor, what config.json says each tensor
must be, reading with one-line errors, the values check, and what transformers does with tensors
config.json does not use.

    raw, arch = read_config(path)                    # config.json, checked (hf_files.check_config)
    raw, arch, spec = read_spec(path)                # ... and its LlamaSpec (no transformers import)
    files = TensorFiles(path)                        # HF name -> file; handles opened on first use
    files = open_tensors(path, raw)                  # ... or a GGUF file's (gguf_tensors.py)
    expected = expected_tensors(spec, arch)          # HF name -> (shape, (fused field, row offset))
    warn_unused(path, files.names, used)             # one warning line naming every unused tensor
    check = FiniteCheck(); check.add(name, file, t)  # device reductions, one host sync in check.raise_bad()

Every problem is one `CheckpointError` line naming the file and the tensor (or field).
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from graphrt.checkpoint.gguf_file import find_gguf, open_gguf
from graphrt.checkpoint.hf_files import (CheckpointError, check_config, copy_into, eos_ids, present, read_json,
                                         reading)
from graphrt.model.spec import LlamaSpec

ARCHITECTURES = {"LlamaForCausalLM": "llama", "Qwen2ForCausalLM": "qwen2", "Qwen3ForCausalLM": "qwen3"}
FILE_DTYPES = {"BF16": torch.bfloat16, "F16": torch.float16, "F32": torch.float32}
F8_KIND = "F8_E4M3"
INDEX = "model.safetensors.index.json"
# tensors transformers drops without a word (`_keys_to_ignore_on_load_unexpected` of these models)
SILENTLY_IGNORED = (".rotary_emb.inv_freq",)


@dataclass(frozen=True)
class Checkpoint:
    """A loaded checkpoint. weights: {"layers": [dict per layer (fused names)], "embed",
    "final_norm", "lm_head"}, every tensor on `device` in `dtype` (linear fields may be
    `Fp8Weight`s). eos_token_ids from generation_config.json / config.json; nbytes and load_s
    describe the tensor copy (nbytes: the weights placed, in `dtype`; config_s: reading config.json,
    the start-up line's). With world_size > 1, `spec` is the whole model's and `weights` hold
    rank's tensor-parallel shard (graphrt/parallel/shard.py), nbytes only the bytes that rank placed.
    kv_scales: the checkpoint's FP8 KV cache scales, ((k, v) per layer), or None
    (graphrt/checkpoint/kv_scales.py)."""

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
    kv_scales: tuple[tuple[float, float], ...] | None = None
    config_s: float = 0.0        # config.json -> spec (read_spec)


def read_config(path: Path) -> tuple[dict, str]:
    """config.json as a dict and the architecture family ('llama', 'qwen2', 'qwen3'). A GGUF file
    (or a directory holding one and no config.json): the config.json its metadata stands for
    (graphrt/checkpoint/gguf_file.py), checked the same way."""
    path = Path(path)
    gguf = find_gguf(path)
    if gguf is not None:
        raw, arch = open_gguf(gguf).config()
        check_config(raw, gguf)
        return raw, arch
    if not path.is_dir():
        raise CheckpointError(f"checkpoint: {str(path)!r} is not a directory")
    cfg_file = path / "config.json"
    if not present(cfg_file):
        raise CheckpointError(f"{cfg_file}: missing (a HF checkpoint needs config.json)")
    raw = read_json(cfg_file)
    archs = raw.get("architectures") or []
    if not isinstance(archs, list):
        raise CheckpointError(f"{cfg_file}: architectures: expected a list of names, got {archs!r}")
    known = [ARCHITECTURES[a] for a in archs if isinstance(a, str) and a in ARCHITECTURES]
    if not known:
        raise CheckpointError(f"{cfg_file}: architectures {archs} not supported; graphrt loads "
                              f"{sorted(ARCHITECTURES)}")
    check_config(raw, cfg_file)
    return raw, known[0]


def read_spec(path: Path) -> tuple[dict, str, LlamaSpec]:
    """read_config's (config.json, architecture family) and the LlamaSpec it describes, read
    with the json module (LlamaSpec.from_config: transformers' defaults, without importing it);
    a value LlamaSpec refuses is one CheckpointError naming config.json."""
    raw, arch = read_config(path)
    with reading(find_gguf(path) or path / "config.json"):
        spec = LlamaSpec.from_config(raw)
    return raw, arch, spec


def open_tensors(path: Path, raw: dict):
    """The checkpoint's tensors by HF name: TensorFiles (safetensors), or GGUFTensors for a GGUF
    file (dequantized on the host; gguf_tensors.py); `raw`: read_config's dict."""
    gguf = find_gguf(Path(path))
    if gguf is None:
        return TensorFiles(path)
    from graphrt.checkpoint.gguf_tensors import GGUFTensors
    return GGUFTensors(open_gguf(gguf), raw)


def weight_files(path: Path) -> dict[str, Path]:
    """HF tensor name -> the safetensors file holding it (the index, or every file's header)."""
    from safetensors import safe_open
    index = path / INDEX
    if present(index):
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


def expected_tensors(spec: LlamaSpec, arch: str) -> dict[str, tuple[tuple[int, ...], tuple]]:
    """HF tensor name -> (shape implied by config.json, (fused destination, row offset));
    destinations are (layer, field, offset) or (field, offset) of the loader's fused layout."""
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


def eos_token_ids(path: Path, raw: dict, vocab_size: int) -> tuple[int, ...]:
    """End-of-sequence ids: generation_config.json's, else config.json's, else ()."""
    gen = path / "generation_config.json"
    if present(gen):
        eos = read_json(gen).get("eos_token_id")
        if eos is not None:
            return eos_ids(eos, gen, vocab_size)
    eos = raw.get("eos_token_id")
    return () if eos is None else eos_ids(eos, path / "config.json", vocab_size)


class TensorFiles:
    """The checkpoint's tensors by HF name across its files; a file is opened once, on first
    use, and kept open while loading. Every library error becomes one CheckpointError line
    naming the file and the tensor. Host only."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self.files = weight_files(self.path)          # HF name -> file
        self._handles: dict[Path, tuple[object, set]] = {}

    @property
    def names(self) -> set[str]:
        return set(self.files)

    def file(self, name: str) -> Path:
        if name not in self.files:
            raise CheckpointError(f"{self.path}: tensor {name!r} missing from the safetensors files")
        return self.files[name]

    def _handle(self, name: str):
        from safetensors import safe_open
        f = self.file(name)
        if f not in self._handles:
            with reading(f, f"safetensors header (opening it for tensor {name!r})"):
                h = safe_open(str(f), framework="pt")
                self._handles[f] = (h, set(h.keys()))
        h, keys = self._handles[f]
        if name not in keys:
            raise CheckpointError(f"{f}: tensor {name!r} missing (the index lists it there)")
        return f, h

    def header(self, name: str) -> tuple[Path, tuple[int, ...], str]:
        """(file, shape, safetensors dtype name) of one tensor; reads no tensor data."""
        f, h = self._handle(name)
        with reading(f, f"tensor {name!r} header"):
            sl = h.get_slice(name)
            return f, tuple(sl.get_shape()), sl.get_dtype()

    def tensor(self, name: str, rows: tuple[int, int] | None = None,
               cols: tuple[int, int] | None = None, *, out: torch.Tensor | None = None) -> torch.Tensor:
        """The tensor on the host (CPU), or only rows [a, b) / columns [a, b) of it; with `out` (a
        tensor of that shape, any dtype and device) copied into it, and `out` returned."""
        f, h = self._handle(name)
        with reading(f, f"tensor {name!r} data"):
            if rows is None and cols is None:
                t = h.get_tensor(name)
            else:
                sl = h.get_slice(name)
                t = sl[rows[0]:rows[1]] if rows is not None else sl[:, cols[0]:cols[1]]
        return t if out is None else copy_into(out, t, f, name)


def warn_unused(path: Path, present: set[str], used: set[str], why: str = "") -> list[str]:
    """Warn once (one line) naming every tensor in the files that the load does not use, as
    transformers does ("weights not used" / UNEXPECTED): they are dropped. Returns them."""
    unused = sorted(n for n in present - used if not n.endswith(SILENTLY_IGNORED))
    if unused:
        shown = ", ".join(unused[:64]) + (f", ... ({len(unused) - 64} more)" if len(unused) > 64 else "")
        warnings.warn(f"graphrt: {path}: {len(unused)} tensor(s) in the safetensors files not used by "
                      f"config.json{why}, dropped: {shown}", stacklevel=3)
    return unused


def untie_if_present(spec: LlamaSpec, present: set[str]) -> tuple[LlamaSpec, bool]:
    """tie_word_embeddings with an `lm_head.weight` in the files: load it untied first
    (transformers ties only when the two tensors hold the same values: retie_or_warn)."""
    if spec.tie_word_embeddings and "lm_head.weight" in present:
        return replace(spec, tie_word_embeddings=False), True
    return spec, False


def nest_weights(out: dict, path: Path, spec: LlamaSpec, untie: bool,
                 world_size: int) -> tuple[dict, LlamaSpec]:
    """The quantized loaders' fused tensors as the decoder's weights: `out` maps (layer, field) or
    (field,) to a tensor (or a quantized weight); absent optional fields (qkv_bias, q_norm, k_norm)
    become None and a tied LM head is the embedding. Returns (weights, spec): the spec changes only
    when an untied head is tied back (retie_or_warn)."""
    weights = {"layers": [{} for _ in range(spec.num_layers)]}
    for key, t in out.items():
        if len(key) == 2:
            weights["layers"][key[0]][key[1]] = t
        else:
            weights[key[0]] = t
    for layer in weights["layers"]:
        for f in ("qkv_bias", "q_norm", "k_norm"):
            layer.setdefault(f, None)
    if spec.tie_word_embeddings:
        weights["lm_head"] = weights["embed"]
    elif untie:
        spec = retie_or_warn(path, spec, weights, world_size)
    return weights, spec


def retie_or_warn(path: Path, spec: LlamaSpec, weights: dict, world_size: int) -> LlamaSpec:
    """After an untied load of a tie_word_embeddings checkpoint (weights on the device): the
    same values as the embedding tie again (lm_head is the embed tensor, world_size 1); other
    values are kept untied with a warning, as transformers 5 does. Returns the spec served."""
    head, embed = weights["lm_head"], weights["embed"]
    same = isinstance(head, torch.Tensor) and head.dtype == embed.dtype and torch.equal(head, embed)
    if same and world_size == 1:
        weights["lm_head"] = embed
        return replace(spec, tie_word_embeddings=True)
    if not same:
        warnings.warn(f"graphrt: {path}: config.json sets tie_word_embeddings, but tensor 'lm_head.weight' "
                      f"in the files differs from 'model.embed_tokens.weight': using it untied (as "
                      f"transformers does); set tie_word_embeddings to false to silence this", stacklevel=3)
    return spec


class FiniteCheck:
    """Non-finite weights, found on the device where they landed: one reduction kernel per
    tensor (aminmax, which propagates NaN), no host copy per tensor, and one host sync for the
    whole checkpoint in `raise_bad`."""

    def __init__(self):
        self._names: list[tuple[str, Path]] = []
        self._flags: list[torch.Tensor] = []          # [] bool, device: all values finite

    def add(self, name: str, file: Path, t: torch.Tensor) -> None:
        """t: a float tensor (any device), or float8_e4m3fn data (NaN is its only non-finite)."""
        if t.numel() == 0:
            return
        if t.dtype == torch.float8_e4m3fn:
            ok = ~((t.view(torch.uint8) & 0x7F) == 0x7F).any()
        else:
            lo, hi = torch.aminmax(t)
            ok = torch.isfinite(lo) & torch.isfinite(hi)
        self._names.append((name, file))
        self._flags.append(ok)

    def raise_bad(self) -> None:
        """CheckpointError naming the first tensor with a NaN or an Inf (one host sync)."""
        if not self._flags:
            return
        ok = torch.stack([f.to(self._flags[0].device) for f in self._flags]).cpu()
        if not bool(ok.all()):
            bad = [n for n, good in zip(self._names, ok.tolist()) if not good]
            name, f = bad[0]
            raise CheckpointError(f"{f}: tensor {name!r} holds non-finite values (NaN or Inf)"
                                  + (f"; {len(bad) - 1} more tensor(s) too" if len(bad) > 1 else ""))


def check_scale(name: str, file: Path, s: torch.Tensor) -> None:
    """An FP8 weight scale (host tensor, a few values) must be finite and > 0."""
    s = s.float()
    if not bool(torch.isfinite(s).all()) or not bool((s > 0).all()):
        bad = s[~(torch.isfinite(s) & (s > 0))].flatten()[:4].tolist()
        raise CheckpointError(f"{file}: tensor {name!r}: FP8 scales must be finite and > 0, got {bad}")


__all__ = ["ARCHITECTURES", "Checkpoint", "CheckpointError", "F8_KIND", "FILE_DTYPES", "FiniteCheck",
           "INDEX", "TensorFiles", "check_scale", "eos_token_ids", "expected_tensors", "open_tensors", "read_config",
           "retie_or_warn", "untie_if_present", "warn_unused", "weight_files"]
