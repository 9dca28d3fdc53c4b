"""The generation engine: checkpoint loading, page allocation, scheduling, streaming, `LLM`.

loader.py (HF directory -> fused weights), model.py (fused weights -> LlamaDecoder),
params.py (SamplingParams, RequestOutput), config.py (EngineConfig), allocator.py (KV pages),
detokenizer.py (text and stop strings), scheduler.py (admission, slots, stops), stream.py,
engine.py (the loop, overlap, background thread), llm.py (the offline API).
"""
from .config import EngineConfig
from .engine import Engine
from .llm import LLM
from .params import RequestOutput, SamplingParams

__all__ = ["LLM", "Engine", "EngineConfig", "SamplingParams", "RequestOutput"]
