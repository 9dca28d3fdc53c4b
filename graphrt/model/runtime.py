"""Whole-model decode through graphrt: a user's step function captured per bucket, K steps a graph.

    mrt = ModelRuntime(model, config, device="cuda", steps_per_graph=4)   # keep_logits=False
    mrt.prefill(prompts, block_table)                      # eager; fills every layer's cache
    mrt.capture()
    tokens = mrt.decode(tokens, block_table, seq_lens)     # [K, n] greedy tokens, K steps, 1 replay
    tokens = mrt.decode(..., sampling=SamplingInputs(...))  # sampled (sampling=True captures these)

A graph runs K decode steps: each step prepares the metadata + plan on the device (once for all
layers), runs the model, takes the greedy argmax of its model-dtype logits (or, with per-row
SamplingInputs, samples: see sampling.py) on the device, feeds it back and advances seq_lens on
the device. Float32 logits of the last step are copied out only with `keep_logits=True` (for
`last_logits`). seq_lens count the token being decoded (its K/V go to slot seq_len - 1).

FlashInfer versions whose plan layout the device planner does not know fall back to host
planning, which cannot run K > 1 steps in one graph: ModelRuntime raises, or, with
fallback_to_one_step=True (the engine's choice), warns and runs K = 1 (`mrt.k` says which).

Threads: prefill(), capture() and decode() hold `mrt.lock` (reentrant) for the whole call, so
concurrent calls serialise. decode() returns a view of static buffers that the next call
rewrites: threads pass `out=` (copied under the lock) or hold `mrt.lock` while reading it (and
last_logits()). All calls must use one CUDA stream.
"""
from __future__ import annotations

import threading
import warnings
from dataclasses import dataclass

import torch

from graphrt.attention.backends import make_backend
from graphrt.attention.buckets import pick_bucket
from graphrt.attention.buffers import BucketView, StaticBuffers
from graphrt.config import RuntimeConfig
from graphrt.model.context import AttentionContext
from graphrt.attention.graphs import GraphManager
from graphrt.attention.inputs import check_exclusive_writes, check_host_values, check_prefill, check_tables
from graphrt.attention.kvcache import PagedKVCache
from graphrt.attention.runtime import _device, raise_device_errors
from graphrt.model.prefill import PrefillAttention
from graphrt.model.sampling import SamplingBuffers, SamplingInputs


@dataclass(frozen=True)
class StepBuffers:
    """Per-bucket static model I/O. tokens [B] int64 (input, then the last step's token);
    out_tokens [K, B] int64 (the token of each of the K steps); logits [B, vocab] float32
    of the last step, or None unless the runtime keeps logits; sampling: the per-row sampling
    parameters [B] (read by sampled graphs)."""
    tokens: torch.Tensor
    out_tokens: torch.Tensor
    logits: torch.Tensor | None
    sampling: SamplingBuffers


class ModelRuntime:
    def __init__(self, model, config: RuntimeConfig, device="cuda", *, backend: str | None = None,
                 steps_per_graph: int = 1, num_pages: int | None = None, sampling: bool = False,
                 keep_logits: bool = False, prefill_chunk_tokens: int = 8192,
                 fallback_to_one_step: bool = False):
        s = model.spec
        heads = getattr(model, "local_spec", s)  # a tensor-parallel rank's model: its own heads
        want = (heads.num_heads, heads.num_kv_heads, heads.head_dim)
        got = (config.num_qo_heads, config.num_kv_heads, config.head_dim)
        if want != got:
            raise ValueError(f"config: (num_qo_heads, num_kv_heads, head_dim) {got} do not match the "
                             f"model's {want}" + ("" if heads is s else " (this tensor-parallel rank's "
                             "heads: use graphrt.parallel.shard_runtime_config)"))
        rope_rows = getattr(model, "max_positions", None)
        if rope_rows is not None and config.max_context_len > rope_rows:
            raise ValueError(f"config: max_context_len={config.max_context_len} exceeds the model's "
                             f"RoPE table of max_positions={rope_rows}")
        if isinstance(prefill_chunk_tokens, bool) or not isinstance(prefill_chunk_tokens, int) \
                or prefill_chunk_tokens < 1:
            raise ValueError(f"prefill_chunk_tokens: must be an int >= 1, got {prefill_chunk_tokens!r}")
        if steps_per_graph < 1:
            raise ValueError(f"steps_per_graph: must be >= 1, got {steps_per_graph}")
        self.model, self.config, self.k = model, config, steps_per_graph
        for name, flag in (("keep_logits", keep_logits), ("sampling", sampling),
                           ("fallback_to_one_step", fallback_to_one_step)):
            if not isinstance(flag, bool):
                raise TypeError(f"{name}: expected a bool, got {flag!r}")
        self.keep_logits = keep_logits
        if num_pages is not None and (isinstance(num_pages, bool) or not isinstance(num_pages, int)
                                      or num_pages < 1):
            raise ValueError(f"num_pages: must be an int >= 1, got {num_pages!r}")
        self.device = _device(device)
        pages = num_pages or config.pool_pages
        self.kv_caches = [PagedKVCache.allocate(config, pages, self.device, seed=config.seed + i)
                          for i in range(s.num_layers)]
        self.buffers = StaticBuffers(config, self.device)
        self._views: dict = {}  # bucket -> BucketView (slices of self.buffers), filled on first use
        self.backend = make_backend(config, self.kv_caches[0], self.device, name=backend)
        self.graphs: GraphManager | None = None
        self.lock = threading.RLock()  # held for a whole call: see the module docstring
        self.prefill_chunk_tokens = prefill_chunk_tokens
        self._prefill_attention: PrefillAttention | None = None  # built on first prefill
        self.sampling = sampling  # capture() also captures the sampled graph of every bucket
        self.sample_graphs: GraphManager | None = None
        self.backend.setup([self.buffers.view(x) for x in reversed(config.buckets)])
        if steps_per_graph > 1 and self.backend.needs_host_inputs:  # after setup: fallback too
            if not fallback_to_one_step:
                raise ValueError("steps_per_graph: backend plans on the host (planner 'host' or a "
                                 "device-planner fallback), which cannot run several steps in one "
                                 "graph; use steps_per_graph=1")
            reason = getattr(self.backend, "fallback_reason", None) or "host planning"
            warnings.warn(f"graphrt: steps_per_graph={steps_per_graph} needs device planning ({reason}); "
                          f"running 1 step per graph with host planning", stacklevel=2)
            self.k = 1
        b = config.max_batch
        tokens = torch.zeros(b, dtype=torch.int64, device=self.device)
        out = torch.zeros((self.k, b), dtype=torch.int64, device=self.device)
        logits = (torch.zeros((b, s.vocab_size), dtype=torch.float32, device=self.device)
                  if self.keep_logits else None)
        samp = SamplingBuffers.allocate(b, self.device)
        self._io = {size: StepBuffers(tokens[:size], out[:, :size],
                                      None if logits is None else logits[:size], samp.view(size))
                    for size in config.buckets}

    @property
    def num_pages(self) -> int:
        return self.kv_caches[0].num_pages

    @property
    def _graph_options(self) -> dict:
        """A tensor-parallel model's graphs hold NCCL collectives: the process group's watchdog
        thread queries CUDA events during capture, which the default "global" mode would refuse."""
        return {} if getattr(self.model, "tp", None) is None else {"capture_error_mode": "thread_local"}

    @property
    def uses_graphs(self) -> bool:
        return self.device.type == "cuda" and self.backend.capturable

    def prefill(self, prompts: list[torch.Tensor], block_table: torch.Tensor) -> torch.Tensor:
        """Eager prefill of each prompt into rows of block_table; returns [n, vocab] float32
        last-token logits. prompts: n [T_i] int64 tensors (1 <= T_i <= max_context_len);
        block_table [n, w] int32 with pages for every prompt token, ids in the pool, no page in
        two rows (each row writes all its pages). Runtime device or CPU; checked before writing."""
        check_prefill(self.config, self.device, self.num_pages, self.model.spec.vocab_size,
                      prompts, block_table)
        prompts = [p.to(self.device) for p in prompts]
        with self.lock:
            if self._prefill_attention is None:
                self._prefill_attention = PrefillAttention(self.config, self.device)
            return self.model.prefill(prompts, self.kv_caches, block_table.to(self.device),
                                      attention=self._prefill_attention,
                                      max_tokens=self.prefill_chunk_tokens)

    def _steps(self, view: BucketView, io: StepBuffers, sampled: bool = False) -> None:
        """K decode steps over the bucket (pure device work: capturable). sampled: draw each
        token with io.sampling's per-row parameters instead of the argmax."""
        ctx = AttentionContext(self.backend, view, self.kv_caches)
        for step in range(self.k):
            ctx.prepare()
            logits = self.model.decode_step(ctx, io.tokens)          # [B, vocab] model dtype
            if sampled:
                io.sampling.sample(logits, io.out_tokens[step])
                nxt = io.out_tokens[step]
            else:
                nxt = torch.argmax(logits, dim=-1)
                io.out_tokens[step].copy_(nxt)
            io.tokens.copy_(nxt)
            if step + 1 == self.k:
                if io.logits is not None:
                    io.logits.copy_(logits)                          # float32, only on request
            else:
                view.seq_lens.add_((view.seq_lens > 0).to(view.seq_lens.dtype))

    def capture(self) -> dict:
        """Capture every bucket not yet captured (idempotent, like DecodeRuntime.capture);
        returns the CaptureStats of every captured bucket ({} on CPU). The warm-up steps write
        K/V into page 0 of every layer (their block table is all zeros); page 0 is saved before
        and restored after."""
        if not self.uses_graphs:
            return {}
        with self.lock:
            self.graphs = self.graphs or GraphManager(self.device, **self._graph_options)
            saved = [(c.k[0].clone(), c.v[0].clone()) for c in self.kv_caches]
            try:
                self._capture_all()
            finally:
                for c, (k0, v0) in zip(self.kv_caches, saved):
                    c.k[0].copy_(k0)
                    c.v[0].copy_(v0)
            return dict(self.graphs.stats)

    def _capture_all(self) -> None:
        for size in reversed(self.config.buckets):
            if size in self.graphs:
                continue
            view, io = self.buffers.view(size), self._io[size]
            view.block_table.zero_()
            view.seq_lens.fill_(1)
            io.tokens.zero_()
            if self.backend.needs_host_inputs:  # host planner: the workspace must hold a plan
                self.backend.host_prepare(view, view.seq_lens.cpu())
            self.graphs.capture(size, lambda v=view, i=io: self._steps(v, i))
            if self.sampling:
                self.sample_graphs = self.sample_graphs or GraphManager(
                    self.device, **self._graph_options)
                self.sample_graphs.capture(size, lambda v=view, i=io: self._steps(v, i, True))
            view.seq_lens.zero_()

    def decode(self, tokens: torch.Tensor, block_table: torch.Tensor, seq_lens: torch.Tensor, *,
               out: torch.Tensor | None = None,
               sampling: SamplingInputs | None = None) -> torch.Tensor:
        """K decode steps for n requests; returns [K, n] int64 tokens (a view of a static
        buffer, valid until the next call; with out= [K, n] int64 on the runtime device, copied
        there under mrt.lock and out returned). Greedy, or sampled with `sampling` ([n] per-row
        parameters; needs sampling=True once captured).

        tokens [n] int64: each row's current token; seq_lens [n] int32 include it; block_table
        [n, w] int32 must already hold pages for K more tokens (checked on the host for CPU
        seq_lens, by the device guard otherwise). Leaves the caches holding the K new K/V.

        Forked requests (copy-on-write contract): rows may share read-only prefix pages, but the
        pages a row writes (those holding slots seq_len - 1 .. seq_len + K - 2) must be its own.
        With a CPU block_table and seq_lens this is checked (ValueError naming the rows and the
        page); for a device-resident table the caller must copy a shared partly filled page first.
        """
        if not isinstance(tokens, torch.Tensor):
            raise TypeError(f"tokens: expected a torch.Tensor, got {type(tokens).__name__}")
        n = tokens.shape[0] if tokens.dim() else 0
        c = self.config
        if tokens.dtype != torch.int64 or tokens.dim() != 1 or n < 1:
            raise ValueError(f"tokens: expected [n >= 1] int64, got {tuple(tokens.shape)} {tokens.dtype}")
        if tokens.device not in (self.device, torch.device("cpu")):
            raise ValueError(f"tokens: on {tokens.device}, expected {self.device} or cpu")
        if tokens.device.type == "cpu" and not 0 <= int(tokens.min()) <= int(tokens.max()) < self.model.spec.vocab_size:
            raise ValueError(f"tokens: ids in [{int(tokens.min())}, {int(tokens.max())}], vocabulary "
                             f"has {self.model.spec.vocab_size}")
        check_tables(c, self.device, self.num_pages, n, block_table, seq_lens)
        if sampling is not None:
            sampling.check(n, self.device)
            if self.graphs is not None and self.sample_graphs is None:
                raise ValueError("sampling: this ModelRuntime was captured with sampling=False "
                                 "(argmax graphs only)")
        if seq_lens.device.type == "cpu":
            last = seq_lens + (seq_lens > 0).to(seq_lens.dtype) * (self.k - 1)
            if int(last.max()) > c.max_context_len:
                raise ValueError(f"seq_lens: K={self.k} steps reach {int(last.max())} tokens, "
                                 f"beyond max_context_len={c.max_context_len}")
            check_host_values(c, self.num_pages, block_table, last)  # pages for all K tokens
            if block_table.device.type == "cpu":
                check_exclusive_writes(c, block_table, (seq_lens - 1).clamp_min(0), last)
        if out is not None and (not isinstance(out, torch.Tensor) or out.dtype != torch.int64
                                or tuple(out.shape) != (self.k, n) or out.device != self.device):
            got = (f"{list(out.shape)} {out.dtype} on {out.device}" if isinstance(out, torch.Tensor)
                   else type(out).__name__)
            raise ValueError(f"out: expected [{self.k}, {n}] torch.int64 on {self.device}, got {got}")
        with self.lock:
            rows = self._decode(tokens, block_table, seq_lens, sampling)
            return rows if out is None else out.copy_(rows)

    def decode_trusted(self, n: int, tokens: torch.Tensor, block_table: torch.Tensor,
                       seq_lens: torch.Tensor, *, sampling: SamplingInputs | None = None) -> torch.Tensor:
        """decode() for an engine's persistent input batch, without the host checks: K steps over
        rows [0, n); returns [K, n] int64 tokens (a view of a static buffer, valid until the next
        call; hold mrt.lock to read it from another thread).

        Trusted inputs, all on the runtime device and owned by the caller, who built them for
        this runtime: tokens [>= n] int64, block_table [>= n, max_pages_per_seq] int32, seq_lens
        [>= n] int32 (0 = padding row), sampling rows [n] (see SamplingInputs) or None (argmax).
        Only rows [0, n) are read (device-to-device copies into the bucket's static buffers). The
        device guard still neutralises bad rows and raises the sticky flag that
        check_device_errors() reports; nothing is checked on the host and nothing syncs (except
        a host-planning backend, which reads seq_lens on the host)."""
        if sampling is not None and self.graphs is not None and self.sample_graphs is None:
            raise ValueError("sampling: this ModelRuntime was captured with sampling=False "
                             "(argmax graphs only)")
        with self.lock:
            return self._decode(tokens[:n], block_table[:n], seq_lens[:n], sampling)

    def _decode(self, tokens, block_table, seq_lens, sampling) -> torch.Tensor:
        n, c = tokens.shape[0], self.config
        size = pick_bucket(c.buckets, n)
        view = self._views.get(size)
        if view is None:                    # the bucket's views of the static buffers, made once
            view = self._views[size] = self.buffers.view(size)
        io = self._io[size]
        width = block_table.shape[1]
        view.block_table[:n, :width].copy_(block_table, non_blocking=True)
        if width < c.max_pages_per_seq:
            view.block_table[:n, width:].fill_(-1)
        view.seq_lens[:n].copy_(seq_lens, non_blocking=True)
        if n < size:
            view.seq_lens[n:].fill_(0)
        io.tokens[:n].copy_(tokens, non_blocking=True)
        if sampling is not None:
            io.sampling.load(sampling, n)
        if self.backend.needs_host_inputs:  # the engines' pattern: plan() on the host, then replay
            self.backend.host_prepare(view, seq_lens.cpu())
        graphs = self.graphs if sampling is None else self.sample_graphs
        if graphs is not None and size in graphs:
            graphs.replay(size)
        else:
            self._steps(view, io, sampled=sampling is not None)
        return io.out_tokens[:, :n]

    def last_logits(self, n: int) -> torch.Tensor:
        """[n, vocab] float32 logits of the last decode step of the bucket serving n rows
        (needs ModelRuntime(..., keep_logits=True))."""
        if not self.keep_logits:
            raise ValueError("last_logits: this runtime was built with keep_logits=False; pass "
                             "keep_logits=True to ModelRuntime to keep each step's float32 logits")
        return self._io[pick_bucket(self.config.buckets, n)].logits[:n]

    def check_device_errors(self) -> None:
        """Raise DeviceInputError if the prepare or K/V-append kernels flagged bad device inputs."""
        raise_device_errors(self.buffers.device_error, self.config, self.num_pages)
