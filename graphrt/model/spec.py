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
        """From a transformers LlamaConfig / Qwen2Config / Qwen3Config."""
        heads = cfg.num_attention_heads
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
        kind = getattr(cfg, "model_type", "")
        if kind not in ("llama", "qwen2", "qwen3"):
            raise ValueError(f"model_type: {kind!r} not supported (llama, qwen2, qwen3)")
        if getattr(cfg, "mlp_bias", False):
            raise ValueError("mlp_bias: MLP biases are not supported")
        if getattr(cfg, "use_sliding_window", False):
            raise ValueError("use_sliding_window: sliding-window attention is not supported")
        rope_params = getattr(cfg, "rope_parameters", None) or {}
        theta = getattr(cfg, "rope_theta", None) or rope_params.get("rope_theta", 10000.0)
        scaling = getattr(cfg, "rope_scaling", None) or None
        if scaling is None and rope_params.get("rope_type", "default") != "default":
            scaling = dict(rope_params)
        return cls(vocab_size=cfg.vocab_size, hidden_size=cfg.hidden_size,
                   intermediate_size=cfg.intermediate_size, num_layers=cfg.num_hidden_layers,
                   num_heads=heads, num_kv_heads=cfg.num_key_value_heads, head_dim=head_dim,
                   rms_norm_eps=cfg.rms_norm_eps, rope_theta=float(theta),
                   tie_word_embeddings=bool(cfg.tie_word_embeddings),
                   attention_bias=kind == "qwen2" or bool(getattr(cfg, "attention_bias", False)),
                   rope_scaling=scaling, qk_norm=kind == "qwen3",
                   max_position_embeddings=int(getattr(cfg, "max_position_embeddings", 131072)))


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
