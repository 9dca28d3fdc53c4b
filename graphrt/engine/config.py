"""EngineConfig: what an LLM instance serves (slots, K, pages, context, backend); validated."""
from __future__ import annotations

from dataclasses import dataclass

from graphrt.config import BACKENDS, RuntimeConfig

DEFAULT_MAX_MODEL_LEN = 8192


def _pos_int(key, v, *, optional=False):
    if optional and v is None:
        return
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise ValueError(f"{key}: must be an int >= 1, got {v!r}")


@dataclass(frozen=True, kw_only=True)
class EngineConfig:
    """max_batch: concurrent requests (decode slots; buckets follow vLLM's rule up to it);
    steps_per_graph: K decode steps per graph replay; page_size: tokens per KV page;
    num_pages: KV pool pages (default: every slot can hold max_model_len); max_model_len:
    prompt + max_tokens limit (default: min(max_position_embeddings, 8192)); backend: attention
    backend (default torch-splitkv on CPU, flashinfer on CUDA); dtype: weights and KV (default
    float32 on CPU, the checkpoint's bf16/fp16 on CUDA); overlap: launch block N+1 before reading
    block N (engine.py); capture: capture CUDA graphs (CUDA only); seed: the engine's seed for
    requests that give none (None: random)."""

    max_batch: int = 16
    steps_per_graph: int = 4
    page_size: int = 16
    num_pages: int | None = None
    max_model_len: int | None = None
    backend: str | None = None
    dtype: str | None = None
    overlap: bool = True
    capture: bool = True
    seed: int | None = None

    def __post_init__(self):
        for key in ("max_batch", "steps_per_graph", "page_size"):
            _pos_int(key, getattr(self, key))
        _pos_int("num_pages", self.num_pages, optional=True)
        _pos_int("max_model_len", self.max_model_len, optional=True)
        if self.backend is not None and self.backend not in BACKENDS or self.backend == "auto":
            raise ValueError(f"backend: {self.backend!r} is not one of {[b for b in BACKENDS if b != 'auto']}")
        if self.dtype not in (None, "bfloat16", "float16", "float32"):
            raise ValueError(f"dtype: {self.dtype!r} is not one of ['bfloat16', 'float16', 'float32']")
        for key in ("overlap", "capture"):
            if not isinstance(getattr(self, key), bool):
                raise ValueError(f"{key}: expected a bool, got {getattr(self, key)!r}")

    def resolve_max_model_len(self, max_position_embeddings: int) -> int:
        limit = max_position_embeddings or DEFAULT_MAX_MODEL_LEN
        want = self.max_model_len or min(limit, DEFAULT_MAX_MODEL_LEN)
        if want > limit:
            raise ValueError(f"max_model_len: {want} exceeds the model's max_position_embeddings {limit}")
        return want

    def runtime_config(self, spec, *, device_type: str, dtype: str, max_model_len: int) -> RuntimeConfig:
        """The ModelRuntime's config: room for max_model_len + K tokens per sequence."""
        ctx = max_model_len + self.steps_per_graph
        pages_per_seq = -(-ctx // self.page_size)
        backend = self.backend or ("flashinfer" if device_type == "cuda" else "torch-splitkv")
        return RuntimeConfig(num_qo_heads=spec.num_heads, num_kv_heads=spec.num_kv_heads,
                             head_dim=spec.head_dim, page_size=self.page_size, max_context_len=ctx,
                             buckets={"max": self.max_batch}, dtype=dtype, backend=backend,
                             kv_pool_pages=1 + (self.num_pages or self.max_batch * pages_per_seq))


__all__ = ["EngineConfig"]
