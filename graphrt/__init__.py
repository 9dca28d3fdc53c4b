"""graphrt: paged-KV decode attention with device-side metadata and planning, replayed as CUDA graphs.

Layers, top down: serve/ (HTTP) -> engine/ (LLM API) -> parallel/ -> model/ -> attention/ -> cache/
-> config.py, kernels/. Public API: RuntimeConfig / load_config (config.py), PagedKVCache and
DecodeRuntime (attention/), LLM / SamplingParams (engine/). FlashInfer is imported lazily, only by the FlashInfer backends.
"""
from graphrt.attention.buckets import BatchTooLargeError, pick_bucket
from graphrt.config import ConfigError, RuntimeConfig, load_config
from graphrt.engine import LLM, SamplingParams
from graphrt.attention.kvcache import PagedKVCache
from graphrt.attention.runtime import DecodeRuntime, DeviceInputError

__version__ = "0.1.0"

__all__ = ["RuntimeConfig", "load_config", "ConfigError", "PagedKVCache", "DecodeRuntime",
           "DeviceInputError", "BatchTooLargeError", "pick_bucket", "LLM", "SamplingParams", "__version__"]
