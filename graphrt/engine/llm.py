"""`graphrt.LLM`: the offline API (vLLM's shape) over the engine.

    llm = LLM("path/to/checkpoint", device="cuda")         # device="cpu": eager, float32
    outs = llm.generate(["Hello", [1, 2, 3]], SamplingParams(max_tokens=64, temperature=0.0))
    outs[0].text, outs[0].token_ids, outs[0].finish_reason
    llm.chat([{"role": "user", "content": "Hi"}], SamplingParams(...))
    stream = llm.engine.add_request("Hi", params)          # streaming (see engine.py)
    llm = LLM(path, tensor_parallel=2)                     # one process per GPU (graphrt/parallel)
    llm.shutdown()                                         # ends the tensor-parallel workers
"""
from __future__ import annotations

from pathlib import Path

import torch

from graphrt.engine.config import EngineConfig
from graphrt.engine.engine import Engine
from graphrt.engine.loader import file_dtype, load_checkpoint, load_tokenizer, read_config
from graphrt.engine.params import RequestOutput, SamplingParams
from graphrt.engine.model import build_model


def _build_runtime(path, device, config: EngineConfig, dtype: str, *, tp=None):
    """Load (the rank's shard of) the checkpoint, build the rank's model and ModelRuntime
    -> (Checkpoint, max_model_len, ModelRuntime)."""
    from graphrt.parallel.driver import rank_runtime
    world, rank = (1, 0) if tp is None else (tp.world_size, tp.rank)
    ck = load_checkpoint(path, device=device, dtype=getattr(torch, dtype), rank=rank, world_size=world)
    max_len = config.resolve_max_model_len(ck.max_position_embeddings)
    pages = None
    if device.type == "cuda" and config.num_pages is None and tp is None:   # the pool from free memory
        free, total = torch.cuda.mem_get_info(device)
        pages = config.pool_pages_from_memory(ck.spec, max_model_len=max_len, free_bytes=free, total_bytes=total,
                                              dtype_bytes=torch.empty(0, dtype=getattr(torch, dtype)).element_size())
    rc = config.runtime_config(ck.spec, device_type=device.type, dtype=dtype, max_model_len=max_len,
                               num_pages=pages)
    model = build_model(ck, max_positions=rc.max_context_len, tp=tp)
    return ck, max_len, rank_runtime(model, rc, device, steps_per_graph=config.steps_per_graph,
                                     sampling=True, fallback_to_one_step=True)


def _tp_worker(ctx, path, config: EngineConfig, dtype: str) -> None:
    """Ranks 1..n-1 of LLM(..., tensor_parallel=n): build the rank's runtime, follow rank 0."""
    from graphrt.parallel.driver import follow
    _, _, runtime = _build_runtime(path, ctx.device, config, dtype, tp=ctx.tp)
    follow(runtime, ctx.control)


class LLM:
    """Loads a local HF checkpoint onto `device`, builds the runtime (graphs captured on CUDA)
    and the engine. config: an EngineConfig, or its fields as keyword arguments.

    tensor_parallel=n > 1: the model is sharded over n ranks (graphrt/parallel): rank 0 runs
    here (cuda:0, or CPU with gloo), ranks 1..n-1 in spawned processes (cuda:r), each loading
    only its slices; every prefill / decode is broadcast to them. A rank that dies makes the
    next call raise RankError (collectives in flight end at tp_timeout_s). `shutdown()` ends them."""

    def __init__(self, path, device: str = "cuda", config: EngineConfig | None = None, *,
                 tensor_parallel: int = 1, tp_timeout_s: float = 120.0, **overrides):
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
        self.config, self._workers = config, None
        if isinstance(tensor_parallel, bool) or not isinstance(tensor_parallel, int) or tensor_parallel < 1:
            raise ValueError(f"tensor_parallel: expected an int >= 1, got {tensor_parallel!r}")
        if tensor_parallel == 1:
            self.checkpoint, max_len, self.runtime = _build_runtime(path, dev, config, dtype)
        else:
            ck, max_len = self._start_tensor_parallel(path, dev, config, dtype, tensor_parallel, tp_timeout_s)
            self.checkpoint = ck
        try:
            ck = self.checkpoint
            self.tokenizer = load_tokenizer(path)
            if dev.type == "cuda" and config.capture:
                self.runtime.capture()
            tok_eos = self.tokenizer.eos_token_id
            eos = ck.eos_token_ids or ((tok_eos,) if tok_eos is not None else ())
            self.engine = Engine(self.runtime, self.tokenizer, eos_token_ids=eos, max_model_len=max_len,
                                 overlap=config.overlap, seed=config.seed)
        except BaseException:
            self.shutdown()
            raise

    def _start_tensor_parallel(self, path, dev, config, dtype, n: int, timeout_s: float):
        from transformers import AutoConfig

        from graphrt.model.spec import LlamaSpec
        from graphrt.parallel import check_tp_size
        from graphrt.parallel.driver import TPDriver
        from graphrt.parallel.workers import WorkerGroup
        read_config(Path(path))
        check_tp_size(LlamaSpec.from_hf(AutoConfig.from_pretrained(str(path))), n)   # before spawning
        if dev.index not in (None, 0):
            raise ValueError(f"device: tensor_parallel uses cuda:0..cuda:{n - 1}, got {dev}")
        self._workers = WorkerGroup.start(n, backend="nccl" if dev.type == "cuda" else "gloo",
                                          timeout_s=timeout_s, target=_tp_worker,
                                          args=(str(path), config, dtype))
        try:
            ctx = self._workers.ctx
            ck, max_len, local = _build_runtime(path, ctx.device, config, dtype, tp=ctx.tp)
            self.runtime = TPDriver(local, ctx.control, health=self._workers.failure)
            return ck, max_len
        except BaseException:
            self._workers.close()
            raise

    def shutdown(self) -> None:
        """End the tensor-parallel workers (no-op for tensor_parallel=1); idempotent."""
        if self._workers is not None:
            self._workers.close(self.runtime)

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
