"""Geometry of a Llama-family decoder (Llama 3.x, Qwen2/2.5, Qwen3), read from a HF config."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass


@dataclass(frozen=True)
class LlamaSpec:
    """Model geometry. head_dim may differ from hidden_size / num_heads (Qwen3).

    attention_bias: q/k/v projections carry biases (Qwen2); qk_norm: per-head RMSNorm of q and k
    before RoPE (Qwen3); max_position_embeddings: rows of the RoPE cos/sin table built at load.
    """
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    rope_theta: float
    tie_word_embeddings: bool
    attention_bias: bool
    rope_scaling: dict | None = None
    qk_norm: bool = False
    max_position_embeddings: int = 131072

    def __post_init__(self):
        for name in ("vocab_size", "hidden_size", "intermediate_size", "num_layers", "num_heads",
                     "num_kv_heads", "head_dim", "max_position_embeddings"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name}: must be an int >= 1, got {v!r}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_heads: {self.num_heads} is not a multiple of num_kv_heads "
                             f"{self.num_kv_heads}")
        if self.head_dim % 2:
            raise ValueError(f"head_dim: must be even for RoPE, got {self.head_dim}")

    @property
    def qkv_rows(self) -> int:
        """Rows of the fused qkv weight: (Hq + 2 * Hkv) * D."""
        return (self.num_heads + 2 * self.num_kv_heads) * self.head_dim

    @classmethod
    def from_hf(cls, cfg) -> "LlamaSpec":
        """From a transformers LlamaConfig / Qwen2Config / Qwen3Config object: its `to_dict()`
        through from_config (the one reader; transformers has already filled in its defaults)."""
        return cls.from_config(cfg.to_dict() | {"model_type": getattr(cfg, "model_type", "")})

    @classmethod
    def from_config(cls, raw: dict) -> "LlamaSpec":
        """From config.json as a dict (json.load), without transformers: the fields a config
        leaves out take the defaults transformers' LlamaConfig / Qwen2Config / Qwen3Config give
        them (HF_DEFAULTS; num_key_value_heads null: num_attention_heads; head_dim absent or
        null: hidden_size / num_attention_heads, except Qwen3's default 128). RoPE: rope_scaling,
        else rope_parameters (transformers 5's spelling); its rope_theta before the top-level
        one; rope_scaling is None for the default (unscaled) type. ValueError naming the field
        for a model_type graphrt does not run, MLP biases or sliding-window attention."""
        kind = raw.get("model_type", "")
        if kind not in HF_DEFAULTS:
            raise ValueError(f"model_type: {kind!r} not supported ({', '.join(HF_DEFAULTS)})")
        cfg = HF_DEFAULTS[kind] | {k: v for k, v in raw.items() if k in HF_DEFAULTS[kind] and v is not None}
        if raw.get("mlp_bias"):
            raise ValueError("mlp_bias: MLP biases are not supported")
        if raw.get("use_sliding_window"):
            raise ValueError("use_sliding_window: sliding-window attention is not supported")
        heads = cfg["num_attention_heads"]
        kv_heads = raw.get("num_key_value_heads", cfg["num_key_value_heads"]) or heads   # null: heads
        head_dim = raw.get("head_dim") or (cfg["head_dim"] if "head_dim" not in raw else None) \
            or cfg["hidden_size"] // heads
        params = dict(raw.get("rope_scaling") or raw.get("rope_parameters") or {})
        theta = params.pop("rope_theta", None) or raw.get("rope_theta") or 10000.0
        rope_type = params.pop("rope_type", None) or params.pop("type", None) or "default"
        params.pop("type", None)
        scaling = None if rope_type == "default" else {**params, "rope_type": rope_type}
        if rope_type == "llama3":
            scaling.setdefault("original_max_position_embeddings", cfg["max_position_embeddings"])
        return cls(vocab_size=cfg["vocab_size"], hidden_size=cfg["hidden_size"],
                   intermediate_size=cfg["intermediate_size"], num_layers=cfg["num_hidden_layers"],
                   num_heads=heads, num_kv_heads=kv_heads, head_dim=head_dim,
                   rms_norm_eps=float(cfg["rms_norm_eps"]), rope_theta=float(theta),
                   tie_word_embeddings=bool(cfg["tie_word_embeddings"]),
                   attention_bias=kind == "qwen2" or bool(raw.get("attention_bias", False)),
                   rope_scaling=scaling, qk_norm=kind == "qwen3",
                   max_position_embeddings=int(cfg["max_position_embeddings"]))


# transformers' LlamaConfig / Qwen2Config / Qwen3Config defaults for the fields from_config reads
# when config.json leaves them out (checked against the installed transformers by
# tests/model/test_spec_config.py); None: derived (num_key_value_heads -> num_attention_heads,
# head_dim -> hidden_size / num_attention_heads)
_COMMON = dict(vocab_size=32000, hidden_size=4096, intermediate_size=11008, num_hidden_layers=32,
               num_attention_heads=32, num_key_value_heads=None, head_dim=None, rms_norm_eps=1e-6,
               tie_word_embeddings=False, max_position_embeddings=2048)
_QWEN = dict(_COMMON, vocab_size=151936, intermediate_size=22016, num_key_value_heads=32,
             max_position_embeddings=32768)
HF_DEFAULTS = {"llama": _COMMON, "qwen2": _QWEN, "qwen3": dict(_QWEN, head_dim=128)}


def check_tp_size(spec: LlamaSpec, world_size: int) -> None:
    """ValueError naming both numbers when world_size does not divide the KV heads, the heads
    or the MLP width (the vocabulary is padded to a multiple of world_size: shard_spec)."""
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise ValueError(f"tensor_parallel: expected an int >= 1, got {world_size!r}")
    for name in ("num_kv_heads", "num_heads", "intermediate_size"):   # the vocabulary is padded
        v = getattr(spec, name)
        if v % world_size:
            raise ValueError(f"tensor_parallel: {world_size} does not divide {name}={v}")


def shard_spec(spec: LlamaSpec, world_size: int) -> LlamaSpec:
    """The geometry one rank holds: heads, KV heads, MLP width divided by n; vocabulary rows
    ceil(V / n) (the last ranks' rows past V are zero padding, their logits are dropped)."""
    check_tp_size(spec, world_size)
    n = world_size
    return dataclasses.replace(spec, num_heads=spec.num_heads // n, num_kv_heads=spec.num_kv_heads // n,
                               intermediate_size=spec.intermediate_size // n,
                               vocab_size=-(-spec.vocab_size // n))   # padded: rows past V are zero


def owned_slice(full: tuple[int, ...], local: tuple[int, ...], rank: int) -> tuple[int, int, int] | None:
    """(dim, start, stop) of rank's block of a tensor of shape `full` whose shard is `local`
    (None: replicated). Raises ValueError if the shapes differ in more than one dim."""
    dims = [d for d, (a, b) in enumerate(zip(full, local)) if a != b]
    if len(full) != len(local) or len(dims) > 1:
        raise ValueError(f"shard: shape {list(local)} is not a one-dim block of {list(full)}")
    if not dims:
        return None
    d = dims[0]
    if full[d] % local[d]:
        raise ValueError(f"shard: dim {d} of {list(full)} is not a multiple of {local[d]}")
    return d, rank * local[d], (rank + 1) * local[d]


def vocab_rows(vocab_size: int, local_rows: int, rank: int) -> tuple[int, int]:
    """[start, stop) of the real vocabulary rows rank holds (stop - start <= local_rows; the rest
    of its local_rows are padding)."""
    start = min(rank * local_rows, vocab_size)
    return start, min(start + local_rows, vocab_size)
