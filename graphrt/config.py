"""Runtime configuration: attention geometry, KV cache, buckets, backend.

`RuntimeConfig` is a frozen dataclass validated on construction; `load_config` reads the
same keys from YAML and refuses unknown keys. Every error names the key, the value and
what is allowed.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import yaml

SUPPORTED_HEAD_DIMS = (64, 128, 256)
SUPPORTED_DTYPES = ("bfloat16", "float16", "float32")
KV_LAYOUTS = ("NHD", "HND")
BACKENDS = ("reference", "torch", "torch-splitkv", "flashinfer", "flashinfer-hostplan", "xqa", "triton-decode", "auto")
FLOAT32_BACKENDS = ("reference", "torch", "torch-splitkv", "triton-decode", "auto")   # the others: bf16 / fp16
DECODE_KERNELS = ("tensor-core", "cuda-core")
PLANNERS = ("device", "host")
XQA_PAGE_SIZES = (16, 32, 64, 128)
KV_CACHE_DTYPES = ("auto", "fp8") + SUPPORTED_DTYPES   # "auto": the model dtype; "fp8": e4m3
_KV_ALIASES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32", "fp8_e4m3": "fp8",
               "float8_e4m3fn": "fp8"}


class ConfigError(ValueError):
    """A config key holds a value graphrt cannot use; the message names key and limits."""


MAX_JSON_DEPTH = 64   # nesting of the JSON files graphrt reads (config.json, manifest.json, ...)
_JSON_STRING = re.compile(r'"(?:[^"\\]|\\.)*"')
_NOT_BRACKET = re.compile(r"[^\[\]{}]+")


def json_depth(text: str) -> int:
    """Deepest nesting of arrays / objects in JSON `text` (strings skipped), without parsing it
    (no recursion: the parser's own recursion is what a deep document would exhaust)."""
    brackets = _NOT_BRACKET.sub("", _JSON_STRING.sub("", text))
    depth = deepest = 0
    for c in brackets:
        depth += 1 if c in "[{" else -1
        deepest = depth if depth > deepest else deepest
    return deepest


def check_json_depth(text: str, source: str, max_depth: int = MAX_JSON_DEPTH) -> None:
    """ValueError naming `source` when `text` nests deeper than `max_depth` (call before json.loads)."""
    depth = json_depth(text)
    if depth > max_depth:
        raise ValueError(f"{source}: JSON nested {depth} levels deep; at most {max_depth} allowed")


MAX_MIXED_TOKENS = 2048   # a decode block's prompt chunk (model/mixed.py): beyond this its compute dwarfs the weights


def check_mixed_tokens(v, *, key: str = "mixed_prefill_tokens") -> int:
    """v: an int in [0, MAX_MIXED_TOKENS] (prompt tokens a decode block's first step also
    prefills; 0 = off) -> v; else ValueError naming `key`."""
    if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= MAX_MIXED_TOKENS:
        raise ValueError(f"{key}: must be an int in [0, {MAX_MIXED_TOKENS}] (prompt tokens a decode block's "
                         f"first step also prefills; 0 = off), got {v!r}")
    return v


STEPS_AUTO = "auto"     # steps_per_graph: K chosen from the measured decode step (model/steps.py)
AUTO_STEPS = 4           # ... "auto"'s K where no step is measured, and for a short step


def check_steps(v, *, most: int | None = None):
    """steps_per_graph (decode steps per graph replay): "auto" or an int in [1, most] (no bound
    when most is None) -> v; else ValueError naming steps_per_graph (bools and floats too)."""
    if isinstance(v, str) and v == STEPS_AUTO:
        return v
    if isinstance(v, bool) or not isinstance(v, int) or v < 1 or (most is not None and v > most):
        bound = "an int >= 1" if most is None else f"an int in [1, {most}]"
        raise ValueError(f"steps_per_graph: must be 'auto' or {bound} (decode steps per graph replay), "
                         f"got {v!r}")
    return v


def max_steps(v) -> int:
    """The most decode steps a block may run under steps_per_graph `v`: K, or for "auto" the
    largest K it may choose (AUTO_STEPS): what the KV lookahead is sized for before K is measured."""
    return AUTO_STEPS if isinstance(check_steps(v), str) else v


def bucket_rule(max_batch: int) -> tuple[int, ...]:
    """vLLM's capture sizes: [1, 2, 4] then every multiple of 8 up to `max_batch`; `max_batch`
    itself is always the largest bucket (so {max: 12} serves batches of 12)."""
    sizes = [b for b in (1, 2, 4) if b <= max_batch] + list(range(8, max_batch + 1, 8))
    if sizes[-1] != max_batch:
        sizes.append(max_batch)
    return tuple(sizes)


def _positive_int(key: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError(f"{key}: expected a positive int, got {value!r} ({type(value).__name__})")
    if value <= 0:
        raise ConfigError(f"{key}: must be > 0, got {value}")
    return value


def _choice(key: str, value: Any, allowed: tuple) -> Any:
    if value not in allowed:
        raise ConfigError(f"{key}: {value!r} is not one of {list(allowed)}")
    return value


@dataclass(frozen=True, kw_only=True)
class RuntimeConfig:
    """What one decode runtime serves. Keyword-only; validated on construction.

    Exactly one of `max_context_len` (tokens) and `max_pages_per_seq` must be given;
    the other is derived (`max_pages_per_seq = ceil(max_context_len / page_size)`).
    `buckets` is a sorted list of batch sizes, or a dict `{"max": N}` for vLLM's rule.
    """

    num_qo_heads: int
    num_kv_heads: int
    head_dim: int
    page_size: int
    buckets: tuple[int, ...] | Mapping[str, int]
    max_context_len: int | None = None
    max_pages_per_seq: int | None = None
    name: str = "unnamed"
    kv_layout: str = "NHD"
    dtype: str = "bfloat16"
    backend: str = "reference"
    decode_kernel: str = "tensor-core"
    planner: str = "device"
    workspace_mb: int = 128
    kv_pool_pages: int | None = None
    seed: int = 0
    kv_cache_dtype: str = "auto"

    def __post_init__(self) -> None:
        for key in ("num_qo_heads", "num_kv_heads", "head_dim", "page_size", "workspace_mb"):
            _positive_int(key, getattr(self, key))
        if isinstance(self.seed, bool) or not isinstance(self.seed, int):
            raise ConfigError(f"seed: expected an int, got {self.seed!r}")
        if self.num_qo_heads % self.num_kv_heads:
            raise ConfigError(
                f"num_qo_heads: {self.num_qo_heads} is not a multiple of num_kv_heads "
                f"{self.num_kv_heads}")
        _choice("head_dim", self.head_dim, SUPPORTED_HEAD_DIMS)
        _choice("kv_layout", self.kv_layout, KV_LAYOUTS)
        _choice("dtype", self.dtype, SUPPORTED_DTYPES)
        _choice("backend", self.backend, BACKENDS)
        _choice("decode_kernel", self.decode_kernel, DECODE_KERNELS)
        _choice("planner", self.planner, PLANNERS)
        if self.dtype == "float32" and self.backend not in FLOAT32_BACKENDS:
            raise ConfigError(f"dtype: float32 runs only on the torch backends and 'triton-decode' "
                              f"({list(FLOAT32_BACKENDS)}), got {self.backend!r}")
        if self.backend == "xqa":
            _choice("page_size (backend xqa)", self.page_size, XQA_PAGE_SIZES)
        self._resolve_kv_dtype()
        self._resolve_context()
        object.__setattr__(self, "buckets", self._resolve_buckets(self.buckets))
        if self.kv_pool_pages is not None:
            _positive_int("kv_pool_pages", self.kv_pool_pages)
        if not isinstance(self.name, str):
            raise ConfigError(f"name: expected a string, got {self.name!r}")

    def _resolve_kv_dtype(self) -> None:
        """kv_cache_dtype: "auto" (or the model dtype) -> the model dtype; "fp8" -> e4m3 pages."""
        kv = self.kv_cache_dtype
        kv = _KV_ALIASES.get(kv, kv) if isinstance(kv, str) else kv
        _choice("kv_cache_dtype", kv, KV_CACHE_DTYPES + tuple(_KV_ALIASES))
        kv = self.dtype if kv == "auto" else kv
        if kv not in ("fp8", self.dtype):
            raise ConfigError(f"kv_cache_dtype: {self.kv_cache_dtype!r} differs from dtype {self.dtype!r}; "
                              f"the KV cache is kept in the model dtype ('auto') or in FP8 ('fp8')")
        if kv == "fp8" and self.backend == "xqa":
            raise ConfigError("kv_cache_dtype: 'fp8' is not supported by backend 'xqa'; use 'flashinfer'")
        object.__setattr__(self, "kv_cache_dtype", kv)

    def _resolve_context(self) -> None:
        ctx, pages = self.max_context_len, self.max_pages_per_seq
        if (ctx is None) == (pages is None):
            raise ConfigError("max_context_len / max_pages_per_seq: give exactly one of the two")
        if ctx is not None:
            _positive_int("max_context_len", ctx)
            object.__setattr__(self, "max_pages_per_seq", -(-ctx // self.page_size))
        else:
            _positive_int("max_pages_per_seq", pages)
            object.__setattr__(self, "max_context_len", pages * self.page_size)

    @staticmethod
    def _resolve_buckets(value: Any) -> tuple[int, ...]:
        if isinstance(value, Mapping):
            if set(value) != {"max"}:
                raise ConfigError(f"buckets: a rule is {{max: N}}, got keys {sorted(value)}")
            return bucket_rule(_positive_int("buckets.max", value["max"]))
        if not isinstance(value, (list, tuple)) or not value:
            raise ConfigError(f"buckets: expected a non-empty list of ints or {{max: N}}, got {value!r}")
        out = tuple(_positive_int(f"buckets[{i}]", b) for i, b in enumerate(value))
        for a, b in zip(out, out[1:]):
            if b <= a:
                raise ConfigError(f"buckets: must be strictly increasing, got {list(out)}")
        return out

    # ---- derived values -------------------------------------------------------------
    @property
    def group_size(self) -> int:
        return self.num_qo_heads // self.num_kv_heads

    @property
    def max_batch(self) -> int:
        return self.buckets[-1]

    @property
    def pool_pages(self) -> int:
        """Pages of the KV pool the capture tool allocates (runtime users bring their own)."""
        return self.kv_pool_pages or max(4 * self.max_pages_per_seq, 64)

    @property
    def torch_dtype(self):
        import torch
        return getattr(torch, self.dtype)

    @property
    def kv_fp8(self) -> bool:
        """Are the KV pages float8_e4m3fn (with per-layer k / v scales)?"""
        return self.kv_cache_dtype == "fp8"

    @property
    def kv_torch_dtype(self):
        """The dtype of the KV pages: the model dtype, or torch.float8_e4m3fn."""
        import torch
        return torch.float8_e4m3fn if self.kv_fp8 else self.torch_dtype

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["buckets"] = list(self.buckets)
        d.pop("max_pages_per_seq")  # derived again from max_context_len
        if d["kv_cache_dtype"] == self.dtype:
            d.pop("kv_cache_dtype")  # the default (KV in the model dtype) follows dtype on replace()
        return d

    def digest(self) -> str:
        """Stable hash of the resolved config (graph caches are keyed by it)."""
        blob = json.dumps(self.to_dict(), sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:16]

    def replace(self, **changes) -> "RuntimeConfig":
        d = self.to_dict()
        d.update(changes)
        if "max_pages_per_seq" in changes:
            d.pop("max_context_len", None)
        return RuntimeConfig(**d)


_FIELDS = {f.name for f in dataclasses.fields(RuntimeConfig)}
_REQUIRED = {f.name for f in dataclasses.fields(RuntimeConfig)
             if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING}


def config_from_dict(data: Mapping[str, Any], *, source: str = "<dict>") -> RuntimeConfig:
    """Build a RuntimeConfig from plain data, refusing unknown and missing keys."""
    if not isinstance(data, Mapping):
        raise ConfigError(f"{source}: top level must be a mapping, got {type(data).__name__}")
    unknown = sorted(set(data) - _FIELDS)
    if unknown:
        raise ConfigError(f"{source}: unknown key(s) {unknown}; allowed keys are {sorted(_FIELDS)}")
    missing = sorted(_REQUIRED - set(data))
    if missing:
        raise ConfigError(f"{source}: missing required key(s) {missing}")
    try:
        return RuntimeConfig(**data)
    except ConfigError as e:
        raise ConfigError(f"{source}: {e}") from None


def load_config(path: str | Path) -> RuntimeConfig:
    """Read a YAML config file into a validated RuntimeConfig."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config: no such file {str(path)!r}")
    with path.open() as f:
        data = yaml.safe_load(f)
    return config_from_dict(data, source=str(path))


__all__ = ["RuntimeConfig", "ConfigError", "KV_CACHE_DTYPES", "load_config", "config_from_dict", "bucket_rule", "check_json_depth",
           "json_depth", "MAX_JSON_DEPTH"]
