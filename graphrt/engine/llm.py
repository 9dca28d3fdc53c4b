"""`graphrt.LLM`: the offline API (vLLM's shape) over the engine.

    llm = LLM("path/to/checkpoint", device="cuda")         # device="cpu": eager, float32
    outs = llm.generate(["Hello", [1, 2, 3]], SamplingParams(max_tokens=64, temperature=0.0))
    outs[0].text, outs[0].token_ids, outs[0].finish_reason
    llm.chat([{"role": "user", "content": "Hi"}], SamplingParams(...))
    stream = llm.engine.add_request("Hi", params)          # streaming (see engine.py)
"""
from __future__ import annotations

import torch

from ..model_runtime import ModelRuntime
from .config import EngineConfig
from .engine import Engine
from .loader import file_dtype, load_checkpoint, load_tokenizer
from .params import RequestOutput, SamplingParams
from .shim import build_model


class LLM:
    """Loads a local HF checkpoint onto `device`, builds the runtime (graphs captured on CUDA)
    and the engine. config: an EngineConfig, or its fields as keyword arguments."""

    def __init__(self, path, device: str = "cuda", config: EngineConfig | None = None, **overrides):
        if config is not None and overrides:
            raise ValueError(f"config: give an EngineConfig or keyword fields, not both ({sorted(overrides)})")
        config = config or EngineConfig(**overrides)
        if not isinstance(device, (str, torch.device)) or str(device).split(":")[0] not in ("cuda", "cpu"):
            raise ValueError(f"device: {device!r} is not 'cuda' or 'cpu'")
        dev = torch.device(device)
        if dev.type == "cuda" and not torch.cuda.is_available():
            raise ValueError("device: 'cuda' requested but CUDA is not available")
        dtype = config.dtype or ("float32" if dev.type == "cpu" else
                                 {torch.float16: "float16"}.get(file_dtype(path), "bfloat16"))
        self.checkpoint = ck = load_checkpoint(path, device=dev, dtype=getattr(torch, dtype))
        self.tokenizer = load_tokenizer(path)
        self.config = config
        max_len = config.resolve_max_model_len(ck.max_position_embeddings)
        rc = config.runtime_config(ck.spec, device_type=dev.type, dtype=dtype, max_model_len=max_len)
        self.runtime = ModelRuntime(build_model(ck), rc, dev, steps_per_graph=config.steps_per_graph,
                                    sampling=True)
        if dev.type == "cuda" and config.capture:
            self.runtime.capture()
        eos = ck.eos_token_ids or ((self.tokenizer.eos_token_id,) if self.tokenizer.eos_token_id is not None else ())
        self.engine = Engine(self.runtime, self.tokenizer, eos_token_ids=eos, max_model_len=max_len,
                             overlap=config.overlap, seed=config.seed)

    def generate(self, prompts, sampling_params: SamplingParams | list | None = None) -> list[RequestOutput]:
        """prompts: a string, a list of token ids, or a list of those; sampling_params: one for
        all or one per prompt. Returns one finished RequestOutput per prompt, in order."""
        if isinstance(prompts, str) or (isinstance(prompts, (list, tuple)) and prompts
                                        and all(isinstance(t, int) for t in prompts)):
            prompts = [prompts]
        if not isinstance(prompts, (list, tuple)) or not prompts:
            raise ValueError("prompts: expected a string, a list of token ids, or a non-empty list of them")
        params = sampling_params
        if isinstance(params, (list, tuple)):
            if len(params) != len(prompts):
                raise ValueError(f"sampling_params: {len(params)} given for {len(prompts)} prompts")
        else:
            params = [params] * len(prompts)
        streams = []
        try:
            for p, sp in zip(prompts, params):
                streams.append(self.engine.add_request(p, sp))
        except ValueError:
            for s in streams:
                self.engine.abort(s.request_id)
            raise
        return [s.result() for s in streams]

    def chat(self, messages, sampling_params: SamplingParams | None = None) -> RequestOutput:
        """One conversation (a list of {"role", "content"} dicts) through the tokenizer's chat
        template with the generation prompt appended."""
        if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
            raise ValueError("messages: expected a list of {'role': ..., 'content': ...} dicts")
        if not getattr(self.tokenizer, "chat_template", None):
            raise ValueError("messages: the tokenizer has no chat template")
        ids = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
        if isinstance(ids, dict) or hasattr(ids, "input_ids"):
            ids = ids["input_ids"]
        return self.generate([list(ids)], sampling_params)[0]


__all__ = ["LLM"]
