"""EngineConfig: what an LLM instance serves (slots, K, pages, context, backend); validated."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from graphrt.config import (BACKENDS, KV_CACHE_DTYPES, STEPS_AUTO as AUTO, RuntimeConfig, check_mixed_tokens,
                            check_steps, max_steps)
from graphrt.engine.pacing import check_max_stall
from graphrt.engine.params import MAX_LOGPROBS
from graphrt.kernels.ops import check_kernels
from graphrt.speculative.config import SpeculativeConfig

DEFAULT_MAX_MODEL_LEN = 8192
INT32_MAX = 2**31 - 1       # page ids, seq lens and block-table widths are int32 on the device
MAX_SEED = 2**63 - 1        # seeds are int64 on the device (SamplingParams' bound too)
DEFAULT_PREFILL_STALL = 1.0  # max_prefill_stall "auto" where K > 1: a chunk may add one block's time
CPU_KV_FRACTION = 0.1        # a CPU's default KV pool: this share of the host's available memory,
CPU_KV_MAX_BYTES = 1 << 30   # at most 1 GiB (a CPU decodes a few streams; the pool is filled at start)


def _pos_int(key, v, *, optional=False, most: int = INT32_MAX):
    if optional and v is None:
        return
    if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= most:
        raise ValueError(f"{key}: must be an int in [1, {most}], got {v!r}")


@dataclass(frozen=True, kw_only=True)
class EngineConfig:
    """max_batch: concurrent requests (decode slots; buckets follow vLLM's rule up to it);
    steps_per_graph: K decode steps per graph replay, or "auto" (the default): chosen at start-up
    from the measured decode step on CUDA, 1 where one step takes >= 2 ms (8B-class models), else
    4; 4 where nothing is measured (CPU, capture=False); model/steps.py says why; with speculation,
    K is the plain blocks' (a speculative block runs spec_rounds rounds); page_size: tokens per KV page;
    num_pages: KV pages requests can hold (the pool has one more, the null page; default on CUDA:
    what gpu_memory_utilization leaves after the weights (pool_pages_from_memory), capped at
    every slot holding max_model_len; on CPU: CPU_KV_FRACTION of the host's available memory
    up to CPU_KV_MAX_BYTES, at least one sequence of max_model_len and at most that cap (cpu_pool_pages)); gpu_memory_utilization: the fraction
    of the GPU's memory the process may use (weights, activations and the KV pool); max_model_len:
    prompt + max_tokens limit (default: min(max_position_embeddings, 8192)); backend: attention
    backend (default torch on CPU: attention in torch, no plan; flashinfer on CUDA); dtype: weights and KV (default
    float32 on CPU, the checkpoint's bf16/fp16 on CUDA); overlap: launch block N+1 before reading
    block N (engine.py); capture: capture CUDA graphs (CUDA only); seed: the engine's seed for
    requests that give none (None: random); kv_cache_dtype: "auto" (the KV pages in the model
    dtype) or "fp8" (e4m3 pages with per-layer k / v scales: twice the tokens per byte;
    docs/fp8.md); enable_prefix_caching: reuse the KV pages of a
    prompt's cached prefix (engine/prefix_cache.py); max_num_batched_tokens: prompt tokens
    prefilled between two decode blocks while requests decode (long prompts run in chunks so
    running streams keep their pace; None: no limit); max_prefill_stall: while requests decode,
    a prompt chunk may add at most this share of a decode block's measured time (its token
    budget follows the measured prefill cost per token, capped by max_num_batched_tokens;
    engine/pacing.py; None: max_num_batched_tokens alone; "auto", the default: 1.0, or None where
    K is 1, since a chunk then runs between every two steps: prefill_stall); prefill_graph_tokens: on CUDA, prompts
    run as captured prefill graphs in pieces of at most this many tokens (one replay a piece,
    model/prefill_graphs.py; 0: eager prefill, as prompt log-probs always are);
    mixed_prefill_tokens: C > 0: while requests decode, a greedy or sampled decode block carries
    up to C tokens of a prompt in its first step instead of a separate chunk between blocks
    (model/mixed.py: the weights streamed once for both; every piece rides a block, whatever
    max_prefill_stall would allow between blocks), and the request decodes in the block
    that carries its last piece; not with speculation or tensor parallelism; 0: off); kernels:
    the model's per-layer kernels (kernels/ops.py): "torch" (their torch references: a CPU's
    default, PyTorch's speed, no Triton needed), "triton" (CUDA's default; on a CPU Triton's
    interpreter), None / "auto" for the default (triton wherever the weights are W8A8 FP8)."""

    max_batch: int = 16
    steps_per_graph: int | str = AUTO
    page_size: int = 16
    num_pages: int | None = None
    gpu_memory_utilization: float = 0.9
    max_model_len: int | None = None
    backend: str | None = None
    dtype: str | None = None
    overlap: bool = True
    capture: bool = True
    seed: int | None = None
    speculative: SpeculativeConfig | None = None
    spec_rounds: int = 4
    kv_cache_dtype: str = "auto"
    enable_prefix_caching: bool = True
    max_num_batched_tokens: int | None = 2048
    max_prefill_stall: float | str | None = AUTO
    prefill_graph_tokens: int = 512
    mixed_prefill_tokens: int = 0
    kernels: str | None = None

    def __post_init__(self):
        for key in ("max_batch", "page_size"):
            _pos_int(key, getattr(self, key))
        check_steps(self.steps_per_graph, most=INT32_MAX)
        _pos_int("num_pages", self.num_pages, optional=True)
        _pos_int("max_model_len", self.max_model_len, optional=True)
        u = self.gpu_memory_utilization
        if isinstance(u, bool) or not isinstance(u, (int, float)) or not 0 < u <= 1:
            raise ValueError(f"gpu_memory_utilization: must be a number in (0, 1], got {u!r}")
        if self.backend is not None and (not isinstance(self.backend, str) or self.backend not in BACKENDS
                                         or self.backend == "auto"):
            raise ValueError(f"backend: {self.backend!r} is not one of {[b for b in BACKENDS if b != 'auto']}")
        if self.dtype is not None and (not isinstance(self.dtype, str)
                                       or self.dtype not in ("bfloat16", "float16", "float32")):
            raise ValueError(f"dtype: {self.dtype!r} is not one of ['bfloat16', 'float16', 'float32']")
        _pos_int("max_num_batched_tokens", self.max_num_batched_tokens, optional=True)
        if not (isinstance(self.max_prefill_stall, str) and self.max_prefill_stall == AUTO):
            check_max_stall(self.max_prefill_stall)
        p = self.prefill_graph_tokens
        if isinstance(p, bool) or not isinstance(p, int) or not 0 <= p <= 8192:
            raise ValueError(f"prefill_graph_tokens: must be an int in [0, 8192] (0 = eager prefill), got {p!r}")
        if check_mixed_tokens(self.mixed_prefill_tokens):
            if self.speculative is not None:
                raise ValueError("mixed_prefill_tokens: not with speculative decoding (its blocks verify "
                                 "proposals; use 0)")
            if self.max_num_batched_tokens is None:
                raise ValueError("mixed_prefill_tokens: needs chunked prefill (max_num_batched_tokens "
                                 "set); use 0")
            if self.mixed_prefill_tokens > self.max_num_batched_tokens:
                raise ValueError(f"mixed_prefill_tokens: {self.mixed_prefill_tokens} exceeds "
                                 f"max_num_batched_tokens={self.max_num_batched_tokens} (the prompt "
                                 f"tokens a block may carry are at most those)")
        check_kernels(self.kernels)
        for key in ("overlap", "capture", "enable_prefix_caching"):
            if not isinstance(getattr(self, key), bool):
                raise ValueError(f"{key}: expected a bool, got {getattr(self, key)!r}")
        if self.seed is not None and (isinstance(self.seed, bool) or not isinstance(self.seed, int)
                                      or not 0 <= self.seed <= MAX_SEED):
            raise ValueError(f"seed: must be None or an int in [0, 2**63 - 1], got {self.seed!r}")
        _pos_int("spec_rounds", self.spec_rounds)
        kv = {"bf16": "bfloat16", "fp16": "float16", "fp8_e4m3": "fp8"}.get(self.kv_cache_dtype, self.kv_cache_dtype) \
            if isinstance(self.kv_cache_dtype, str) else self.kv_cache_dtype
        if kv not in KV_CACHE_DTYPES:
            raise ValueError(f"kv_cache_dtype: {self.kv_cache_dtype!r} is not one of {list(KV_CACHE_DTYPES)}")
        if kv not in ("auto", "fp8") and self.dtype is not None and kv != self.dtype:
            raise ValueError(f"kv_cache_dtype: {kv!r} differs from dtype {self.dtype!r}; the KV cache is "
                             f"kept in the model dtype ('auto') or in FP8 ('fp8')")
        object.__setattr__(self, "kv_cache_dtype", kv)
        spec = self.speculative
        if spec is not None and not isinstance(spec, SpeculativeConfig):
            object.__setattr__(self, "speculative", SpeculativeConfig.from_dict(spec))   # "auto" resolved

    @property
    def kv_fp8(self) -> bool:
        return self.kv_cache_dtype == "fp8"

    def kv_dtype_bytes(self, dtype_bytes: int) -> int:
        """Bytes of one KV element: 1 for FP8 pages, else the model dtype's `dtype_bytes`."""
        return 1 if self.kv_fp8 else dtype_bytes

    @property
    def lookahead(self) -> int:
        """Positions past a sequence's max_model_len tokens a block may write K/V for: K decode
        steps (for "auto", the largest K it may choose), or the k proposals a verify writes ahead."""
        k = self.speculative.num_tokens if self.speculative is not None else 0
        return max(max_steps(self.steps_per_graph), k)

    def prefill_stall(self, k: int) -> float | None:
        """max_prefill_stall as an engine of K decode steps per block runs it: "auto" is None
        where K = 1 (a paced chunk would run between every two steps, each no longer than one
        step: measured on an 8B model, unpaced chunks gave K = 1 its first-token and throughput
        lead, model/steps.py), else DEFAULT_PREFILL_STALL; a value given is kept."""
        v = self.max_prefill_stall
        if isinstance(v, str) and v == AUTO:
            return None if k == 1 else DEFAULT_PREFILL_STALL
        return v

    def resolved(self, k: int) -> "EngineConfig":
        """A copy as an engine running K decode steps per block runs it: steps_per_graph = k (what
        "auto" chose, or 1 where host planning forced it) and max_prefill_stall = prefill_stall(k)."""
        return dataclasses.replace(self, steps_per_graph=k, max_prefill_stall=self.prefill_stall(k))

    def resolve_max_model_len(self, max_position_embeddings: int) -> int:
        limit = max_position_embeddings or DEFAULT_MAX_MODEL_LEN
        want = self.max_model_len or min(limit, DEFAULT_MAX_MODEL_LEN)
        if want > limit:
            raise ValueError(f"max_model_len: {want} exceeds the model's max_position_embeddings {limit}")
        return want

    def pages_per_seq(self, max_model_len: int) -> int:
        """Pages of one sequence at max_model_len + lookahead tokens."""
        return -(-(max_model_len + self.lookahead) // self.page_size)

    def pool_pages_from_memory(self, spec, *, max_model_len: int, dtype_bytes: int, free_bytes: int,
                               total_bytes: int, num_kv_heads: int | None = None) -> int:
        """Pages requests can hold when the KV pool takes what gpu_memory_utilization leaves:
        total * utilization - (total - free) [in use: weights, other processes] - a reserve for
        activations (reserve_bytes), over the bytes of one page in every layer (K and V).
        Capped at every slot holding max_model_len. ValueError naming gpu_memory_utilization
        when the pool would not hold one sequence of max_model_len. dtype_bytes: the model dtype's
        (activations); a page counts kv_dtype_bytes (1 with FP8 KV). Pure: tested on CPU."""
        kv_heads = num_kv_heads or spec.num_kv_heads
        page_bytes = 2 * spec.num_layers * self.page_size * kv_heads * spec.head_dim * self.kv_dtype_bytes(dtype_bytes)
        budget = total_bytes * self.gpu_memory_utilization - (total_bytes - free_bytes) \
            - self.reserve_bytes(spec, dtype_bytes=dtype_bytes)
        per_seq = self.pages_per_seq(max_model_len)
        pages = min(int(budget // page_bytes) - 1, self.max_batch * per_seq)   # - 1: the null page
        if pages < per_seq:
            raise ValueError(
                f"gpu_memory_utilization: {self.gpu_memory_utilization} leaves {max(budget, 0) / 2**30:.2f} GiB "
                f"for the KV pool ({free_bytes / 2**30:.1f} of {total_bytes / 2**30:.1f} GiB free), less than "
                f"one sequence of max_model_len={max_model_len} needs ({per_seq} pages of "
                f"{page_bytes / 2**20:.1f} MiB); raise it, lower max_model_len, or give num_pages")
        return pages

    def cpu_pool_pages(self, spec, *, max_model_len: int, dtype_bytes: int, available_bytes: int,
                       num_kv_heads: int | None = None) -> int:
        """A CPU's default pool: the pages CPU_KV_FRACTION of the host's available memory (at most
        CPU_KV_MAX_BYTES) holds (K and V in every layer), at least one sequence of max_model_len (check_memory then says
        whether that fits) and at most every slot holding max_model_len. Pure: tested."""
        kv_heads = num_kv_heads or spec.num_kv_heads
        page_bytes = 2 * spec.num_layers * self.page_size * kv_heads * spec.head_dim * self.kv_dtype_bytes(dtype_bytes)
        per_seq = self.pages_per_seq(max_model_len)
        share = int(min(available_bytes * CPU_KV_FRACTION, CPU_KV_MAX_BYTES) // page_bytes) - 1   # - 1: null page
        return max(per_seq, min(share, self.max_batch * per_seq))

    def reserve_bytes(self, spec, *, dtype_bytes: int, prefill_tokens: int = 8192) -> int:
        """Memory kept out of the KV pool for what runs beside it: a prefill chunk's activations
        (hidden, qkv, gate_up per token), the decode's [B, vocab] float32 logits with the sampler's
        sort (values and int64 indices), the slots' logits-processing rows (model/processing.py:
        [B, vocab] int32 counts, bool prompt mask, float32 rule scratch) and 256 MiB for
        workspaces, graphs and the allocator."""
        qkv = (spec.num_heads + 2 * spec.num_kv_heads) * spec.head_dim
        per_token = (4 * spec.hidden_size + qkv + 3 * spec.intermediate_size) * dtype_bytes
        logits = self.max_batch * spec.vocab_size * (4 + 4 + 8)
        processing = self.max_batch * spec.vocab_size * (4 + 1 + 4)
        return prefill_tokens * per_token + 2 * logits + processing + (256 << 20)

    def memory_needed(self, spec, *, max_model_len: int, dtype_bytes: int, pool_pages: int,
                      num_kv_heads: int | None = None) -> dict[str, int]:
        """Bytes of the big buffers a runtime of this config allocates on its device, by name:
        the KV pool (pool_pages pages, null page included, K and V in every layer), the block
        tables (the runtime's two and the engine's batch: [max_batch, pages per sequence] int32),
        and what runs beside the pool (reserve_bytes: a prefill chunk, the decode logits and
        sort). KV pages count kv_dtype_bytes (1 with FP8 KV). Pure: tested on CPU."""
        kv_heads = num_kv_heads or spec.num_kv_heads
        page_bytes = 2 * spec.num_layers * self.page_size * kv_heads * spec.head_dim * self.kv_dtype_bytes(dtype_bytes)
        tables = 3 * self.max_batch * self.pages_per_seq(max_model_len) * 4
        return {"kv_pool": pool_pages * page_bytes, "block_tables": tables,
                "activations": self.reserve_bytes(spec, dtype_bytes=dtype_bytes)}

    def check_memory(self, needed: dict[str, int], *, available_bytes: int, device: str) -> None:
        """ValueError with the numbers (bytes needed, by buffer, and available on `device`) and
        the fields that size them, before anything is allocated."""
        total = sum(needed.values())
        if total <= available_bytes:
            return
        parts = ", ".join(f"{k} {v / 2**30:.2f} GiB" for k, v in needed.items())
        raise ValueError(
            f"max_batch / page_size / num_pages / max_model_len: the runtime needs {total} bytes "
            f"({total / 2**30:.2f} GiB: {parts}) on {device}, {available_bytes} bytes "
            f"({available_bytes / 2**30:.2f} GiB) are available (max_batch={self.max_batch}, "
            f"page_size={self.page_size}, num_pages={self.num_pages}, max_model_len={self.max_model_len}, "
            f"steps_per_graph={self.steps_per_graph}); lower them")

    def runtime_config(self, spec, *, device_type: str, dtype: str, max_model_len: int,
                       num_pages: int | None = None) -> RuntimeConfig:
        """The ModelRuntime's config: room for max_model_len + lookahead tokens per sequence; a
        pool of num_pages (default: self.num_pages, else every slot at max_model_len) + the null page."""
        ctx = max_model_len + self.lookahead
        pages = num_pages or self.num_pages or self.max_batch * self.pages_per_seq(max_model_len)
        backend = self.backend or ("flashinfer" if device_type == "cuda" else "torch")
        return RuntimeConfig(num_qo_heads=spec.num_heads, num_kv_heads=spec.num_kv_heads,
                             head_dim=spec.head_dim, page_size=self.page_size, max_context_len=ctx,
                             buckets={"max": self.max_batch}, dtype=dtype, backend=backend,
                             kv_pool_pages=1 + pages, kv_cache_dtype=self.kv_cache_dtype)

    def runtime_options(self, *, tensor_parallel: bool = False):
        """How the engine's ModelRuntime runs (model/options.py; the environment's GRAPHRT_*
        variables override these when the runtime is built): every graph family the engine
        launches (sampled; with speculation the token history; one GPU: logits processing and
        log-probabilities up to MAX_LOGPROBS), K = 1 with a warning where the attention backend
        plans on the host, this config's K, prefill graphs (none with capture=False),
        mixed prompt chunks, and with n-gram speculation a token mask per verified position
        (constrained rows' grammar-checked proposals)."""
        from graphrt.model.options import RuntimeOptions   # here: graphrt.model imports the kernels,
        #                                                   after LLM has chosen Triton's mode
        spec = self.speculative
        return RuntimeOptions(steps_per_graph=self.steps_per_graph, sampling=True, fallback_to_one_step=True,
                              token_history=spec is not None, processing=not tensor_parallel,
                              logprobs_width=MAX_LOGPROBS, prefill_graph_tokens=self.prefill_graph_tokens,
                              graphed_prefill=None if self.capture else False,
                              mixed_prefill_tokens=self.mixed_prefill_tokens,
                              mask_positions=1 + spec.num_tokens if spec is not None and spec.method == "ngram" else 1)


__all__ = ["EngineConfig"]
