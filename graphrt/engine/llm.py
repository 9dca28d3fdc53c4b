"""`graphrt.LLM`: the offline API (vLLM's shape) over the engine.

    llm = LLM("path/to/checkpoint")                        # cuda if available, else cpu (eager, float32)
    llm = LLM(model="Qwen/Qwen2.5-0.5B-Instruct", revision="main")   # a Hugging Face repo id (its cache)
    outs = llm.generate(["Hello", [1, 2, 3]], SamplingParams(max_tokens=64, temperature=0.0))
    outs[0].outputs[0].text, outs[0].outputs[0].token_ids, outs[0].outputs[0].finish_reason
    outs[0].text, outs[0].token_ids, outs[0].finish_reason     # the same: shortcuts to outputs[0]
    outs = llm.generate("Hi", SamplingParams(n=4, temperature=0.8, seed=1))   # outs[0].outputs[0..3]
    llm.chat([{"role": "user", "content": "Hi"}], SamplingParams(...))        # one conversation
    llm.chat([conversation_a, conversation_b])                               # a list: one output each
    llm = LLM(model=path, tensor_parallel_size=2, max_num_seqs=8)            # vLLM's names (vllm_args.py)
    stream = llm.engine.add_request("Hi", params)          # streaming (see engine.py)
    llm = LLM(path, tensor_parallel=2)                     # one process per GPU (graphrt/parallel)
    llm.shutdown()                                         # ends requests in flight, the workers
    llm = LLM(path, quantization="fp8")                    # FP8 weights from a float checkpoint
    llm = LLM(path, quantization="int4")                   # int4 (RTN, group 128) from a float one: docs/int4.md
    llm = LLM(path, kv_cache_dtype="fp8")                  # FP8 (e4m3) KV cache: docs/fp8.md
    llm = LLM(path, speculative={"method": "ngram", "num_tokens": 4})       # speculative decoding
    llm = LLM(path, speculative={"method": "draft", "num_tokens": 4, "model": DRAFT_DIR})
    llm = LLM(path, speculative={"method": "eagle3", "num_tokens": 4, "model": HEAD_DIR})   # EAGLE-3 head

Thread-safe: generate / chat may be called from any number of threads; each caller's streams
drive the engine's step (one step at a time, engine.step's lock) or wait on the engine's thread
(llm.engine.start()); every caller gets the tokens it gets alone. A Ctrl-C (KeyboardInterrupt) or an error while
generate waits aborts that caller's requests (their pages go back) and the LLM keeps serving; a
Ctrl-C during an engine step takes effect when the step has finished (stream.py). If the engine dies (an error
no single request caused, docs/engine.md), every caller raises EngineDeadError.
"""
from __future__ import annotations

import dataclasses

import logging
import time
from pathlib import Path

import torch

from graphrt.engine.config import EngineConfig
from graphrt.engine.device import available_bytes, check_device_support, resolve_device, select_triton_mode
from graphrt.checkpoint.hub import resolve_model
from graphrt.engine.params import RequestOutput, SamplingParams
from graphrt.engine.startup import StartupTimes
from graphrt.engine.stream import interrupt_after
from graphrt.engine.vllm_args import translate

# The engine, loader and model import graphrt's Triton kernels: they are imported inside the
# functions below, after select_triton_mode (graphrt/engine/device.py) has chosen the mode.

log = logging.getLogger("graphrt.engine")


def _build_runtime(path, device, config: EngineConfig, dtype: str, *, tp=None, quantization=None, times=None,
                   plans=None):
    """Load (the rank's shard of) the checkpoint, build the rank's model, ModelRuntime and (with
    speculation) speculative runner -> (Checkpoint, max_model_len, LocalExecutor). times: a
    StartupTimes whose runtime phase gets the model, runtime and runner construction; plans:
    ModelRuntime's (decode plans measured by an earlier start, model/plans.py)."""
    from graphrt.worker.local import LocalExecutor
    from graphrt.checkpoint.loader import load_checkpoint
    from graphrt.checkpoint.decoder import build_model
    from graphrt.model.runtime import ModelRuntime
    world, rank = (1, 0) if tp is None else (tp.world_size, tp.rank)
    t = time.perf_counter()
    ck = load_checkpoint(path, device=device, dtype=getattr(torch, dtype), rank=rank, world_size=world,
                         quantization=quantization)
    if times is not None:                              # the files opened, parsed and read
        times.weights_s += time.perf_counter() - t
        times.read_s += getattr(ck, "load_s", 0.0)
        times.config_s += getattr(ck, "config_s", 0.0)
    max_len = config.resolve_max_model_len(ck.max_position_embeddings)
    pages = None
    if device.type == "cuda" and config.num_pages is None and tp is None:   # the pool from free memory
        free, total = torch.cuda.mem_get_info(device)
        pages = config.pool_pages_from_memory(ck.spec, max_model_len=max_len, free_bytes=free, total_bytes=total,
                                              dtype_bytes=torch.empty(0, dtype=getattr(torch, dtype)).element_size())
    elif device.type == "cpu" and config.num_pages is None:               # a share of the host's memory
        pages = config.cpu_pool_pages(ck.spec, max_model_len=max_len, available_bytes=available_bytes(device),
                                      dtype_bytes=torch.empty(0, dtype=getattr(torch, dtype)).element_size(),
                                      num_kv_heads=ck.spec.num_kv_heads // world)
    rc = config.runtime_config(ck.spec, device_type=device.type, dtype=dtype, max_model_len=max_len,
                               num_pages=pages)
    needed = config.memory_needed(ck.spec, max_model_len=max_len, pool_pages=rc.pool_pages,
                                  dtype_bytes=torch.empty(0, dtype=getattr(torch, dtype)).element_size(),
                                  num_kv_heads=ck.spec.num_kv_heads // world)   # this rank's heads
    config.check_memory(needed, available_bytes=available_bytes(device), device=str(device))
    if tp is not None:                                 # one-shot all-reduce where it measures faster
        from graphrt.parallel.allreduce import configure
        tp = configure(tp, hidden=ck.spec.hidden_size, max_tokens=max(rc.buckets), dtype=getattr(torch, dtype),
                       device=device)
    t = time.perf_counter()
    model = build_model(ck, max_positions=rc.max_context_len, tp=tp, kernels=config.kernels)
    if tp is not None:                                 # the rank's own heads
        from graphrt.parallel.shard import shard_runtime_config
        rc = shard_runtime_config(rc, tp.world_size)
    spec = config.speculative
    mrt = ModelRuntime(model, rc, device, options=config.runtime_options(tensor_parallel=tp is not None),
                       kv_scales=kv_scales_for(ck, rc), plans=plans)
    runner = None
    if spec is not None:
        from graphrt.engine.speculation import build_runner
        runner = build_runner(mrt, spec, rounds=config.spec_rounds, dtype=dtype, target=ck)
    if times is not None:
        times.runtime_s += time.perf_counter() - t
    return ck, max_len, LocalExecutor(mrt, runner)


def kv_scales_for(ck, rc):
    """The checkpoint's FP8 KV scales when the pool is FP8 (else None: calibrated on the first
    prefill); scales in a checkpoint served with a model-dtype KV cache are unused (logged)."""
    if ck.kv_scales is not None and not rc.kv_fp8:
        log.info("kv_cache_dtype: %s; the checkpoint's FP8 KV scales are unused (kv_cache_dtype='fp8' "
                 "uses them)", rc.kv_cache_dtype)
    return ck.kv_scales if rc.kv_fp8 else None


def _tp_worker(ctx, path, config: EngineConfig, dtype: str, quantization: str | None = None) -> None:
    """Ranks 1..n-1 of LLM(..., tensor_parallel=n): build the rank's runtime, follow rank 0."""
    from graphrt.parallel.driver import follow
    select_triton_mode(ctx.device)                     # a spawned process: before its kernels load
    _, _, ex = _build_runtime(path, ctx.device, config, dtype, tp=ctx.tp, quantization=quantization)
    follow(ex, ctx.control, runtime=ex.runtime)


class LLM:
    """Loads a HF checkpoint onto `device`, builds the runtime (graphs captured on CUDA) and the
    engine. config: an EngineConfig, or its fields as keyword arguments.

    model (positional or keyword): a local checkpoint directory, or a Hugging Face repo id ("org/name") resolved through
    huggingface_hub's cache (downloaded if missing; `HF_HUB_OFFLINE=1`: the cache only) at
    `revision` (branch, tag or commit; default main); an existing directory always wins.
    device: None (default) = cuda if available, else cpu; on cpu graphrt's Triton kernels run
    through Triton's interpreter, selected here before they are imported (graphrt/engine/device.py),
    and the dtype is float32 (another dtype is a ValueError naming dtype). CUDA needs FlashInfer
    (`pip install "graphrt[gpu]"`; ImportError with that line, before anything loads).

    tensor_parallel=n > 1: the model is sharded over n ranks (graphrt/parallel): rank 0 runs
    here (cuda:0, or CPU with gloo), ranks 1..n-1 in spawned processes (cuda:r), each loading
    only its slices; every prefill / decode is broadcast to them. A rank that dies makes the
    next call raise RankError (collectives in flight end at tp_timeout_s). `shutdown()` ends them.
    quantization="fp8": a float checkpoint's linear layers as FP8 (per channel) while loading;
    FP8 checkpoints load as FP8 without it (graphrt/checkpoint/fp8_loader.py); with
    tensor_parallel, each rank loads its shard of the FP8 weights and scales.
    quantization="int4": a float checkpoint's linear layers as int4 (round-to-nearest, group
    128, asymmetric); GPTQ, AWQ and compressed-tensors W4A16 checkpoints load as int4 without it
    (graphrt/checkpoint/int4_loader.py, docs/int4.md; one GPU: tensor_parallel is refused).
    plans: decode plans measured by an earlier start (`llm.runtime.runtime.measured_plans()`; a graph
    cache's manifest keeps its capture's, which `graphrt serve --graph-cache` passes): split-K and
    "auto"'s K are taken from them instead of measured (graphrt/model/plans.py; one GPU only).

    vLLM's constructor names work too (engine/vllm_args.py, docs/engine.md): tensor_parallel_size,
    max_num_seqs (max_batch), block_size (page_size), enforce_eager (capture=False), dtype "auto" /
    "half" / "float"; trust_remote_code is accepted and ignored (graphrt runs no checkpoint code);
    a vLLM name for a feature graphrt lacks is a ValueError naming it unless given vLLM's default.

    `llm.config` is the EngineConfig as this LLM runs it (EngineConfig.resolved): steps_per_graph
    the K its decode graphs run ("auto": chosen from the decode step measured at capture,
    model/steps.py; `llm.runtime.runtime.steps` says why, the start-up line too) and max_prefill_stall
    "auto" resolved for that K."""

    def __init__(self, model=None, device: str | None = None, config: EngineConfig | None = None, *,
                 tensor_parallel: int = 1, tp_timeout_s: float = 120.0, revision: str | None = None,
                 quantization: str | None = None, plans: dict | None = None, **overrides):
        if model is None:
            raise ValueError("model: expected a checkpoint directory or a Hugging Face repo id")
        path, overrides = model, translate(overrides, model=model)      # vLLM's names -> graphrt's
        if "tensor_parallel" in overrides:                              # given as tensor_parallel_size
            if tensor_parallel != 1:
                raise ValueError("tensor_parallel: given twice (as tensor_parallel and tensor_parallel_size)")
            tensor_parallel = overrides.pop("tensor_parallel")
        if config is not None and overrides:
            raise ValueError(f"config: give an EngineConfig or keyword fields, not both ({sorted(overrides)})")
        config = config or EngineConfig(**overrides)
        times = StartupTimes()                         # the one start-up line (startup.py)
        dev = resolve_device(device)
        check_device_support(dev, config.dtype)        # before anything loads: dtype, FlashInfer
        select_triton_mode(dev)                        # before any kernel module is imported
        path = resolve_model(path, revision=revision)  # local directory, or the hub snapshot's
        from graphrt.engine.engine import Engine
        from graphrt.checkpoint.loader import file_dtype, load_tokenizer
        dtype = config.dtype or ("float32" if dev.type == "cpu" else
                                 {torch.float16: "float16"}.get(file_dtype(path), "bfloat16"))
        self.config, self._workers = config, None
        if isinstance(tensor_parallel, bool) or not isinstance(tensor_parallel, int) or tensor_parallel < 1:
            raise ValueError(f"tensor_parallel: expected an int >= 1, got {tensor_parallel!r}")
        if tensor_parallel != 1:                       # what the TP executor declares it lacks
            from graphrt.parallel.executor import check_config
            check_config(config, tensor_parallel)
        times.setup_s = time.perf_counter() - times.t0     # imports, device checks, the model's files
        if plans and tensor_parallel != 1:
            log.info("plans: not taken with tensor_parallel > 1 (each start measures its own)")
        if tensor_parallel == 1:
            self.checkpoint, max_len, self.runtime = _build_runtime(path, dev, config, dtype,
                                                                    quantization=quantization, times=times,
                                                                    plans=plans)
        else:
            ck, max_len = self._start_tensor_parallel(path, dev, config, dtype, tensor_parallel, tp_timeout_s,
                                                      quantization, times)
            self.checkpoint = ck
        try:
            ck = self.checkpoint
            engine_t = time.perf_counter()
            with times.phase("tokenizer"):
                self.tokenizer = load_tokenizer(path)
            if len(self.tokenizer) > ck.spec.vocab_size:   # HF loads it too; such ids are refused per request
                log.warning("tokenizer: %d ids but the model's vocab_size is %d; prompts that tokenize to "
                            "ids >= %d are refused (400 naming 'prompt')", len(self.tokenizer),
                            ck.spec.vocab_size, ck.spec.vocab_size)
            if dev.type == "cuda" and config.capture:
                engine_t -= time.perf_counter()
                with times.phase("capture"):
                    self.runtime.capture()
                engine_t += time.perf_counter()
                graphs = self.runtime.runtime.graphs    # rank 0's ModelRuntime
                times.from_capture(graphs.stats.values() if graphs is not None else ())
            # K is fixed now ("auto": measured by the capture): the config as this LLM runs it
            self.config = config = config.resolved(self.runtime.caps.steps_per_graph)
            times.from_steps(self.runtime.runtime.steps)
            times.plans = dict(self.runtime.runtime.plan_seconds)
            tok_eos = self.tokenizer.eos_token_id
            eos = ck.eos_token_ids or ((tok_eos,) if tok_eos is not None else ())
            self.engine = Engine(self.runtime, self.tokenizer, eos_token_ids=eos, max_model_len=max_len,
                                 overlap=config.overlap, seed=config.seed,
                                 enable_prefix_caching=config.enable_prefix_caching,
                                 max_num_batched_tokens=config.max_num_batched_tokens,
                                 max_prefill_stall=config.max_prefill_stall)
            times.engine_s = time.perf_counter() - engine_t
        except BaseException:
            self.shutdown()
            raise
        from graphrt.cache.triton_cache import active
        graph_cache = active()                         # a graph cache Triton reads through, if any
        if graph_cache is not None:
            times.kernels_loaded, times.kernels_compiled = graph_cache.counts()
        times.finish()
        self.startup = times
        log.info("%s", times.line(pages=self.engine.scheduler.allocator.num_pages, pool_bytes=_pool_bytes(self.runtime.runtime)))

    def _start_tensor_parallel(self, path, dev, config, dtype, n: int, timeout_s: float, quantization,
                               times=None):
        from graphrt.checkpoint.files import read_spec
        from graphrt.parallel import check_tp_size
        from graphrt.parallel.executor import TPExecutor
        from graphrt.parallel.launch import RankError
        from graphrt.parallel.workers import WorkerGroup
        check_tp_size(read_spec(Path(path))[2], n)    # before spawning
        if dev.index not in (None, 0):
            raise ValueError(f"device: tensor_parallel uses cuda:0..cuda:{n - 1}, got {dev}")
        self._workers = WorkerGroup.start(n, backend="nccl" if dev.type == "cuda" else "gloo",
                                          timeout_s=timeout_s, target=_tp_worker,
                                          args=(str(path), config, dtype, quantization))
        try:
            ctx = self._workers.ctx
            ck, max_len, local = _build_runtime(path, ctx.device, config, dtype, tp=ctx.tp,
                                                quantization=quantization, times=times)
            self.runtime = TPExecutor(local, ctx.control, health=self._workers.failure)
            if self._workers.failure() is not None:      # a worker failed while building its rank
                raise RankError(self._workers.failure())
            return ck, max_len
        except BaseException:
            self._workers.close()
            raise

    def get_tokenizer(self):
        """The checkpoint's tokenizer (vLLM's LLM.get_tokenizer): graphrt.checkpoint.tokenizer's
        Tokenizer, or transformers' AutoTokenizer for a checkpoint without tokenizer.json."""
        return self.tokenizer

    def shutdown(self) -> None:
        """End the LLM: every request in flight ends (a generate() or chat() running on another
        thread returns, its unfinished outputs with finish_reason "abort"; pages back), the
        engine's thread stops, the tensor-parallel workers end, and later generate / chat calls
        raise RuntimeError. Idempotent."""
        engine = getattr(self, "engine", None)
        if engine is not None:
            engine.close()
        if self._workers is not None:
            self._workers.close(self.runtime)

    def generate(self, prompts, sampling_params: SamplingParams | list | None = None, *,
                 use_tqdm: bool = True) -> list[RequestOutput]:
        """prompts: a string, a list of token ids, or a list of those; sampling_params: one for
        all or one per prompt. Returns one finished RequestOutput per prompt, in order.
        use_tqdm: a progress bar on stderr over the prompts (with prompt / output tokens per
        second) while more than one prompt is generated; False turns it off."""
        if not isinstance(use_tqdm, bool):
            raise ValueError(f"use_tqdm: expected a bool, got {use_tqdm!r}")
        if isinstance(prompts, (str, dict)) or (isinstance(prompts, (list, tuple)) and prompts
                                                and all(isinstance(t, int) for t in prompts)):
            prompts = [prompts]
        if isinstance(prompts, (list, tuple)):          # vLLM's {"prompt": ...} / {"prompt_token_ids": ...}
            prompts = [_prompt_of(p) if isinstance(p, dict) else p for p in prompts]
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
        try:
            return _collect(streams, progress=use_tqdm and len(streams) > 1)
        except BaseException:                      # Ctrl-C (KeyboardInterrupt) or a request's error
            self._abort(streams)
            raise

    def _abort(self, streams) -> None:
        """Abort the caller's own requests (a no-op for those that finished). Without the engine's
        thread one step applies the aborts here, so their pages are back when generate returns;
        with it, the engine's loop applies them within a step."""
        for s in streams:
            self.engine.abort(s.request_id)
        if not self.engine.threaded and self.engine.error is None:
            with interrupt_after():
                self.engine.step()

    def chat(self, messages, sampling_params: SamplingParams | list | None = None, *,
             use_tqdm: bool = True, tools: list | None = None, tool_choice=None) -> "ChatOutputs":
        """Conversations through the tokenizer's chat template with the generation prompt
        appended: one conversation (a list of {"role", "content"} dicts) or a list of them;
        sampling_params: one for all or one per conversation. Returns one RequestOutput per
        conversation in a list (as vLLM's chat does, also for a single conversation); for one
        conversation the list also answers RequestOutput's attributes (`llm.chat(msgs).text`, as
        graphrt's chat returned one RequestOutput before).

        tools (OpenAI's [{"type": "function", "function": {name, description, parameters}}]):
        rendered by the chat template; tool_choice "required" or {"type": "function", "function":
        {"name": N}} constrains each output to one call in the checkpoint's format (Llama 3.x JSON
        or Hermes `<tool_call>`: engine/tool_calls.py), "auto" / "none" / None leave it free.
        engine.tool_calls.parse_tool_calls(text, tool_format(llm.tokenizer), check_tools(tools))
        reads the calls back. ValueError naming tools / tool_choice."""
        convs = [messages] if isinstance(messages, list) and messages and isinstance(messages[0], dict) else messages
        if (not isinstance(convs, (list, tuple)) or not convs
                or not all(isinstance(c, list) and c and all(isinstance(m, dict) for m in c) for c in convs)):
            raise ValueError("messages: expected a conversation (a non-empty list of {'role': ..., "
                             "'content': ...} dicts) or a list of them")
        if not getattr(self.tokenizer, "chat_template", None):
            raise ValueError("messages: the tokenizer has no chat template")
        prompts = []
        if tools is not None:
            from graphrt.engine.tool_calls import check_tools, template_messages, tool_constraint, tool_format
            so = tool_constraint(check_tools(tools), tool_choice, tool_format(self.tokenizer))
            convs = [template_messages(c) for c in convs]
            if so is not None:
                sps = sampling_params if isinstance(sampling_params, list) else [sampling_params] * len(convs)
                sampling_params = [dataclasses.replace(p or SamplingParams(), structured_outputs=so) for p in sps]
        elif tool_choice is not None:
            raise ValueError("tool_choice: needs tools")
        for c in convs:
            ids = self.tokenizer.apply_chat_template(c, add_generation_prompt=True, tokenize=True, tools=tools)
            if isinstance(ids, dict) or hasattr(ids, "input_ids"):
                ids = ids["input_ids"]
            prompts.append(list(ids))
        return ChatOutputs(self.generate(prompts, sampling_params, use_tqdm=use_tqdm))


class ChatOutputs(list):
    """LLM.chat's list of RequestOutput; with one element, its attributes (text, token_ids,
    finish_reason, outputs, ...) read through to it."""

    def __getattr__(self, name):
        if name.startswith("__") or len(self) != 1:
            raise AttributeError(f"{name}: LLM.chat returned {len(self)} outputs (a list); index it first")
        return getattr(self[0], name)


def _prompt_of(p: dict):
    """vLLM's prompt dicts: {"prompt": str} (TextPrompt) or {"prompt_token_ids": [...]} (TokensPrompt)."""
    keys = set(p)
    if keys == {"prompt"}:
        return p["prompt"]
    if keys == {"prompt_token_ids"}:
        return p["prompt_token_ids"]
    raise ValueError(f"prompts: a prompt dict takes 'prompt' or 'prompt_token_ids' alone, got keys {sorted(keys)}")


def _pool_bytes(runtime) -> int:
    """Bytes of this process's KV pool (K and V of every layer) of a ModelRuntime."""
    return sum(t.numel() * t.element_size() for c in runtime.kv_caches for t in c.as_tuple())


def _collect(streams, *, progress: bool) -> list[RequestOutput]:
    """Each stream's whole output, in order; with progress, a tqdm bar advanced as each is read
    (read in order: a request that finishes early is counted when its turn comes)."""
    if not progress:
        return [s.result() for s in streams]
    import time

    from tqdm.auto import tqdm
    outs, n_in, n_out, t0 = [], 0, 0, time.perf_counter()
    with tqdm(total=len(streams), desc="generate", unit="prompt", dynamic_ncols=True) as bar:
        for s in streams:
            out = s.result()
            outs.append(out)
            n_in, n_out = n_in + len(out.prompt_token_ids), n_out + sum(len(o.token_ids) for o in out.outputs)
            dt = max(time.perf_counter() - t0, 1e-9)
            bar.set_postfix_str(f"input {n_in / dt:.1f} tok/s, output {n_out / dt:.1f} tok/s", refresh=False)
            bar.update(1)
    return outs


__all__ = ["LLM", "ChatOutputs"]
