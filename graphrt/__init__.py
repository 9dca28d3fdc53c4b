"""graphrt: paged-KV decode attention with device-side metadata and planning, replayed as CUDA graphs.

Layers, top down: serve/ (HTTP) -> engine/ (LLM API) -> parallel/ -> model/ -> attention/ -> cache/
-> config.py, kernels/. Public API: RuntimeConfig / load_config (config.py), PagedKVCache and
DecodeRuntime (attention/), LLM / SamplingParams / RequestOutput / CompletionOutput (engine/). FlashInfer is imported lazily, only by the FlashInfer backends.

The names are resolved on first access (PEP 562), so `import graphrt` loads no Triton kernel:
`LLM(path)` on a CPU can still select Triton's interpreter before the kernels are decorated
(graphrt/engine/device.py).
"""
from importlib import import_module

__version__ = "0.1.0"

_EXPORTS = {  # name -> module that defines it
    "RuntimeConfig": "graphrt.config", "load_config": "graphrt.config", "ConfigError": "graphrt.config",
    "PagedKVCache": "graphrt.attention.kvcache",
    "DecodeRuntime": "graphrt.attention.runtime", "DeviceInputError": "graphrt.attention.runtime",
    "BatchTooLargeError": "graphrt.attention.buckets", "pick_bucket": "graphrt.attention.buckets",
    "LLM": "graphrt.engine.llm", "SamplingParams": "graphrt.engine.params",
    "RequestOutput": "graphrt.engine.params", "CompletionOutput": "graphrt.engine.params",
}

__all__ = [*_EXPORTS, "__version__"]


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'graphrt' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_EXPORTS))
