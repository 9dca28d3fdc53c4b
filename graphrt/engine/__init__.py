"""The generation engine: checkpoint loading, page allocation, scheduling, streaming, `LLM`.

loader.py (HF directory -> fused weights), model.py (fused weights -> LlamaDecoder),
params.py (SamplingParams, RequestOutput), config.py (EngineConfig, the pool from memory),
allocator.py (refcounted KV pages), kv_manager.py (pages per request, the null page),
input_batch.py (the persistent device batch), token_bytes.py + detokenizer.py (text and stop
strings), scheduler.py (admission, growth, preemption, slots, stops), stream.py, engine.py
(the loop, overlap, background thread), llm.py (the offline API).
"""
from graphrt.engine.config import EngineConfig
from graphrt.engine.engine import Engine
from graphrt.engine.llm import LLM
from graphrt.engine.params import RequestOutput, SamplingParams

__all__ = ["LLM", "Engine", "EngineConfig", "SamplingParams", "RequestOutput"]
