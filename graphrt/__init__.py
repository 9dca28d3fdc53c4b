"""graphrt: paged-KV decode attention with device-side metadata and planning, replayed as CUDA graphs.

Public API: RuntimeConfig / load_config (config.py), PagedKVCache (kvcache.py),
DecodeRuntime (runtime.py), LLM / SamplingParams (engine/). FlashInfer is imported lazily, only by the FlashInfer backends.
"""
from .buckets import BatchTooLargeError, pick_bucket
from .config import ConfigError, RuntimeConfig, load_config
from .engine import LLM, SamplingParams
from .kvcache import PagedKVCache
from .runtime import DecodeRuntime, DeviceInputError

__version__ = "0.1.0"

__all__ = ["RuntimeConfig", "load_config", "ConfigError", "PagedKVCache", "DecodeRuntime",
           "DeviceInputError", "BatchTooLargeError", "pick_bucket", "LLM", "SamplingParams", "__version__"]
