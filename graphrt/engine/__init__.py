"""The generation engine: page allocation, scheduling, streaming, the offline `LLM` API.

params.py (SamplingParams, RequestOutput, CompletionOutput), group.py (n > 1: samples sharing a
prefill), vllm_args.py (vLLM's LLM argument names), config.py (EngineConfig, the pool from memory),
allocator.py (refcounted KV pages), kv_manager.py (pages per request, the null page),
token_bytes.py + detokenizer.py (text and stop strings), scheduler.py (admission, growth, preemption, slots, stops), stream.py, engine.py
(the loop, overlap, background thread), llm.py (the offline API),
device.py (default device, Triton interpreter on CPU). Checkpoints (files, loaders, tokenizer,
chat template, hub ids) are read by `graphrt.checkpoint`; the device is driven through
`graphrt.worker`'s Executor protocol (the local executor; every launch carries the scheduler's
slot changes), below `parallel`.

Names resolve on first access (PEP 562): importing the package loads no Triton kernel.
"""
from importlib import import_module

_EXPORTS = {"LLM": "graphrt.engine.llm", "Engine": "graphrt.engine.engine",
            "EngineConfig": "graphrt.engine.config", "SamplingParams": "graphrt.engine.params",
            "RequestOutput": "graphrt.engine.params", "CompletionOutput": "graphrt.engine.params"}

__all__ = list(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'graphrt.engine' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_EXPORTS))
