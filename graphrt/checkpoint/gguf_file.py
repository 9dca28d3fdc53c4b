"""A GGUF file (llama.cpp's format): where it is, its metadata checked field by field, and the
config.json it stands for (the header read by gguf_header.py; the `gguf` package's types).

    file = find_gguf(path)          # "model.gguf", or a directory holding one .gguf and no config.json; else None
    g = open_gguf(file)             # GGUFFile: the header, metadata getters with one-line errors
    raw, arch = g.config()          # a config.json-shaped dict (transformers' names) and 'llama' | 'qwen2' | 'qwen3'

The metadata keys are llama.cpp's (`{arch}.block_count`, `tokenizer.ggml.tokens`, ...), read as
transformers' GGUF reader maps them to a config: context_length -> max_position_embeddings,
embedding_length -> hidden_size, feed_forward_length -> intermediate_size, attention.head_count
(_kv) -> num_attention_heads (num_key_value_heads), attention.key_length -> head_dim,
rope.freq_base -> rope_theta, attention.layer_norm_rms_epsilon -> rms_norm_eps; no `output.weight`
tensor -> tie_word_embeddings. Llama 3.1-style RoPE (a `rope_freqs.weight` tensor of per-frequency
divisors) is matched against the llama3 rope_scaling it was computed from. Every problem is one
`CheckpointError` line naming the file and the key or tensor.

open_gguf keeps the last file it opened (keyed by path, size and mtime): LLM() reads the dtype,
the weights and the tokenizer from one file, and opening parses every metadata array.
"""
from __future__ import annotations

import dataclasses
import functools
import os
from pathlib import Path

from graphrt.checkpoint.hf_files import CheckpointError, reading

SUFFIX = ".gguf"
ARCHITECTURES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM"}
# llama.cpp's llama3 RoPE presets (Llama 3.1: factor 8; Llama 3.2: factor 32), matched against rope_freqs
LLAMA3_ROPE = tuple({"rope_type": "llama3", "factor": f, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                     "original_max_position_embeddings": 8192} for f in (8.0, 16.0, 32.0))


def find_gguf(path) -> Path | None:
    """The GGUF file `path` names: itself (a file ending .gguf), or the one *.gguf of a directory
    without config.json (a directory with config.json is a HF checkpoint). None otherwise.
    CheckpointError for a directory holding several .gguf files and no config.json."""
    path = Path(path)
    if path.suffix.lower() == SUFFIX and not path.exists():
        raise CheckpointError(f"{path}: no such GGUF file")
    if path.is_file():
        return path if path.suffix.lower() == SUFFIX else None
    if not path.is_dir() or (path / "config.json").exists():
        return None
    found = sorted(p for p in path.iterdir() if p.suffix.lower() == SUFFIX and p.is_file())
    if len(found) > 1:
        raise CheckpointError(f"{path}: {len(found)} GGUF files ({', '.join(p.name for p in found[:4])}"
                              f"{', ...' if len(found) > 4 else ''}); give the one to load as MODEL")
    return found[0] if found else None


def open_gguf(file) -> "GGUFFile":
    """GGUFFile for `file` (the last one opened is reused while its size and mtime are unchanged)."""
    file = Path(file).resolve()
    try:
        st = file.stat()
    except OSError as e:
        raise CheckpointError(f"{file}: cannot read: {e.strerror or e}") from None
    return _open(file, st.st_size, st.st_mtime_ns)


@functools.lru_cache(maxsize=1)
def _open(file: Path, size: int, mtime_ns: int) -> "GGUFFile":
    return GGUFFile(file)


class GGUFFile:
    """One GGUF file: `fields` (metadata: key -> value), `tensors` by GGUF name (gguf_header's
    TensorInfo: memory-mapped data; host only), typed metadata getters. Opening checks that every
    tensor's data lies inside the file."""

    def __init__(self, file: Path):
        from graphrt.checkpoint.gguf_header import read_header
        self.file = Path(file)
        with reading(self.file, "not a readable GGUF file (truncated or corrupt?)"):
            header = read_header(self.file)
        size = os.path.getsize(self.file)
        self.fields = header.fields
        self.tensors = {t.name: t for t in header.tensors}
        for t in header.tensors:
            if t.data_offset + t.n_bytes > size:
                raise CheckpointError(f"{self.file}: truncated: tensor {t.name!r} needs bytes up to "
                                      f"{t.data_offset + t.n_bytes}, the file has {size}")
        self.arch = self.get("general.architecture", str)

    # --- metadata
    def has(self, key: str) -> bool:
        return key in self.fields

    def get(self, key: str, kind: type, default=...):
        """The value of metadata `key` as `kind` (int, float, bool, str, list); `default` when
        absent (no default: CheckpointError naming the key)."""
        if key not in self.fields:
            if default is ...:
                raise CheckpointError(f"{self.file}: metadata {key!r}: missing")
            return default
        value = self.fields[key]
        ok = isinstance(value, kind) and not (kind in (int, float) and isinstance(value, bool))
        if kind is float and isinstance(value, int) and not isinstance(value, bool):
            value, ok = float(value), True
        if not ok:
            raise CheckpointError(f"{self.file}: metadata {key!r}: expected {kind.__name__}, got {value!r:.80}")
        return value

    def positive_int(self, key: str, default=...) -> int:
        v = self.get(key, int, default)
        if v is not None and v < 1:
            raise CheckpointError(f"{self.file}: metadata {key!r}: expected an int >= 1, got {v}")
        return v

    # --- config
    def config(self) -> tuple[dict, str]:
        """(config.json-shaped dict, architecture family); CheckpointError naming the key for an
        architecture graphrt does not run, a missing shape key, partial rotary or RoPE scaling."""
        a = self.arch
        if a not in ARCHITECTURES:
            raise CheckpointError(f"{self.file}: metadata 'general.architecture': {a!r} not supported; graphrt "
                                  f"loads GGUF {sorted(ARCHITECTURES)}")
        hidden = self.positive_int(f"{a}.embedding_length")
        heads = self.positive_int(f"{a}.attention.head_count")
        head_dim = self.positive_int(f"{a}.attention.key_length", None) or hidden // heads
        rot = self.positive_int(f"{a}.rope.dimension_count", None)
        if rot is not None and rot != head_dim:
            raise CheckpointError(f"{self.file}: metadata '{a}.rope.dimension_count': {rot} (partial rotary) is not "
                                  f"supported; graphrt rotates the whole head ({head_dim})")
        kind = self.get(f"{a}.rope.scaling.type", str, "none")
        if kind not in ("none", "") and self.get(f"{a}.rope.scaling.factor", float, 1.0) != 1.0:
            raise CheckpointError(f"{self.file}: metadata '{a}.rope.scaling.type': {kind!r} is not supported "
                                  f"(RoPE without scaling, or llama3 frequencies)")
        embed = self.tensors.get("token_embd.weight")
        vocab = self.positive_int(f"{a}.vocab_size", None) or (int(embed.shape[-1]) if embed is not None else None)
        if vocab is None:
            raise CheckpointError(f"{self.file}: tensor 'token_embd.weight' missing (and no '{a}.vocab_size')")
        eos = [self.get(f"tokenizer.ggml.{k}_token_id", int, None) for k in ("eos", "eot", "eom")]
        raw = {"architectures": [ARCHITECTURES[a]], "model_type": a, "vocab_size": vocab, "hidden_size": hidden,
               "intermediate_size": self.positive_int(f"{a}.feed_forward_length"),
               "num_hidden_layers": self.positive_int(f"{a}.block_count"),
               "num_attention_heads": heads,
               "num_key_value_heads": self.positive_int(f"{a}.attention.head_count_kv", None) or heads,
               "head_dim": head_dim,
               "max_position_embeddings": self.positive_int(f"{a}.context_length", None),
               "rms_norm_eps": self.get(f"{a}.attention.layer_norm_rms_epsilon", float, 1e-6),
               "rope_theta": self.get(f"{a}.rope.freq_base", float, 10000.0),
               "tie_word_embeddings": "output.weight" not in self.tensors,
               "attention_bias": "blk.0.attn_q.bias" in self.tensors,
               "hidden_act": "silu",
               "eos_token_id": list(dict.fromkeys(i for i in eos if i is not None)) or None,
               "bos_token_id": self.get("tokenizer.ggml.bos_token_id", int, None)}
        if "rope_freqs.weight" in self.tensors:
            raw["rope_scaling"] = self._llama3_rope(raw)
        return {k: v for k, v in raw.items() if v is not None}, a

    def _llama3_rope(self, raw: dict) -> dict:
        """The llama3 rope_scaling whose frequency divisors `rope_freqs.weight` holds."""
        import numpy as np
        import torch

        from graphrt.model.rope import rope_inv_freq
        from graphrt.model.spec import LlamaSpec
        t = self.tensors["rope_freqs.weight"]
        with reading(self.file, "tensor 'rope_freqs.weight'"):
            stored = torch.from_numpy(np.array(t.data, dtype=np.float32)).flatten()
        base = LlamaSpec.from_config(raw)
        for scaling in LLAMA3_ROPE:
            spec = dataclasses.replace(base, rope_scaling=scaling)
            want = rope_inv_freq(base) / rope_inv_freq(spec)
            if want.shape == stored.shape and torch.allclose(want, stored, rtol=1e-3):
                return dict(scaling)
        raise CheckpointError(f"{self.file}: tensor 'rope_freqs.weight': RoPE frequency factors that are not "
                              f"llama3's (factor 8, 16 or 32, low 1, high 4, original 8192) are not supported")


__all__ = ["ARCHITECTURES", "GGUFFile", "SUFFIX", "find_gguf", "open_gguf"]
