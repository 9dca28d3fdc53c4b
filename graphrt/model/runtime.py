"""Whole-model decode through graphrt: a user's step function captured per bucket, K steps a graph.

    mrt = ModelRuntime(model, config, "cuda", options=RuntimeOptions(steps_per_graph=4))
    mrt = ModelRuntime(model, config, "cuda", steps_per_graph=4)   # the same: fields by keyword
    mrt.prefill(prompts, block_table)                      # eager; fills every layer's cache
    mrt.capture()
    tokens = mrt.decode(tokens, block_table, seq_lens)     # [K, n] greedy tokens, K steps, 1 replay
    tokens = mrt.decode(..., sampling=SamplingInputs(...))  # sampled (sampling=True captures these)
    tokens = mrt.decode_slots(n, sampled=False)            # the engine's path: no input copy
    tokens = mrt.decode_slots(n, sampled=True, processed=True)   # processing=True: penalties,
    tok, rank, ids, vals = mrt.logprobs.view(n)            # bias, bans, min_p + log-probabilities
    mrt.decode_slots(n, sampled=True, processed=True, part="forward")   # one step split in two:
    tokens = mrt.decode_slots(n, sampled=True, processed=True, part="draw")   # [1, n] (masks between)

config (graphrt/config.py's RuntimeConfig) is what the runtime serves; options
(model/options.py's RuntimeOptions) is how it runs it: every knob below is one of its fields, and
the environment's GRAPHRT_* variables override them once, here (`mrt.options` is the result).

The graphs read the runtime's persistent per-slot state `mrt.slots` (model/slots.py) in place:
the public decode() copies its arguments into it first (the one explicit input copy); an engine's
executor writes it through its input batch (`mrt.slots.apply(update)`) and calls decode_slots(),
which copies nothing. Each block advances the slots on the device: seq_lens by K, the current token,
the draw index of sampled rows, and the token history (token_history=True, for speculation).
Capture and replay go through the one graph runner (attention/graphs.py), keyed
GraphKey("decode", bucket, steps=K, sampled=..., filtered=...); speculative rounds
(speculative/runner.py) share the same runner, pool and slots.

processing=True adds two graphs per bucket (processed=True; filtered: with the sort that top-k /
top-p need, or without when no row of the block uses them): each step processes
the float32 logits with the slots' processing rows (model/processing.py: penalties over the
per-slot token counts, logit bias, banned tokens, min_tokens, min_p), draws with the sampler from
the result (greedy rows: its argmax), records log-probabilities of the drawn token and its top-N
alternatives into `mrt.logprobs` (model/logprobs.py; of the raw logits, or with
logprobs_mode="processed" of the distribution drawn from) and counts the drawn token. Blocks
whose rows need none of it keep the greedy / sampled graphs, which do none of this work.

Split steps (processing=True): a block with constrained rows runs one step as two launches,
decode_slots(n, ..., part="forward") (the model, logits into `split_logits`; graph
GraphKey("decode_forward", bucket)) then part="draw" (masks, processing, draw, slots advanced;
GraphKey("decode_draw", bucket, filtered=...); also each row's argmax before masks and processing
into `split_argmax`), so the host can read the previous step's tokens,
advance its grammar matchers and write the next masks while the forward runs (engine/constrained.py).

A graph runs K decode steps: each step prepares the metadata + plan on the device (once for all
layers), runs the model, takes the greedy argmax of its model-dtype logits (kernels/argmax.py's
chunked pass: torch.argmax's ids; or, with per-row SamplingInputs, samples: see sampling.py) on
the device, feeds it back and advances seq_lens on
the device (by one per step, K per block). Float32 logits of the last step are copied out only with `keep_logits=True` (for
`last_logits`). seq_lens count the token being decoded (its K/V go to slot seq_len - 1).

mixed_prefill_tokens=C (> 0): greedy and sampled blocks also have a graph whose first step
prefills a prompt chunk of up to C tokens for one slot with the decode rows (model/mixed.py:
one weight stream for both): `stage_chunk(slot, tokens, start)`, then
`decode_slots(n, sampled=..., chunk=True)`.

Split-K (model/splitk.py): the o and down GEMMs of each decode bucket run split S (one GEMM of
split views, summed by the add+RMSNorm that reads them), S per bucket fixed once before the first
capture (`mrt.splitk`, a SplitKPlan): measured on CUDA by default, off on CPU; options.splitk
(0, 1, 2, 4 or "auto"; GRAPHRT_SPLITK) sets it.

`plans=` (model/plans.py, e.g. a graph cache's, from an earlier start's `measured_plans()`): the
split-K table and "auto"'s K taken as measured instead of measuring them again (source "cached").

The fused-GEMV decode layer (norms, residual adds and SiLU-mul in the GEMVs) measured 2.6x
slower than cuBLAS plus the separate kernels on the H200; removed.

FP8 KV cache (config.kv_cache_dtype="fp8"): e4m3 pages with per-layer k / v scales, given as
`kv_scales` (the checkpoint's, [(k, v)] per layer) or calibrated on the first prefill this
runtime runs (graphrt/model/quant/kv.py), once, before any page is written with them; the
scales chosen are logged ("graphrt.model" logger, INFO) and kept in `mrt.kv_scale_source`.

steps_per_graph="auto" (model/steps.py): K is fixed by the first capture(), before any graph is
kept: the bucket-1 greedy graph is captured at K = 1, timed over a few replays with CUDA events
(GraphRunner.time_us), and dropped; K = 1 where that step takes >= 2 ms, else 4. Under tensor
parallelism every rank takes the ranks' mean step, so all choose the same K. Until then, and
where nothing is captured (CPU, a runtime never captured), "auto" runs K = 4. `mrt.steps` (a
StepsPlan) says which K and why; `mrt.k` is K.

FlashInfer versions whose plan layout the device planner does not know fall back to host
planning, which cannot run K > 1 steps in one graph: ModelRuntime raises, or, with
fallback_to_one_step=True (the engine's choice), warns and runs K = 1 (`mrt.k` says which;
"auto" runs K = 1 there without a warning).

Threads: prefill(), capture() and decode() hold `mrt.lock` (reentrant) for the whole call, so
concurrent calls serialise. decode() returns a view of static buffers that the next call
rewrites: threads pass `out=` (copied under the lock) or hold `mrt.lock` while reading it (and
last_logits()). All calls must use one CUDA stream.
"""
from __future__ import annotations

import logging
import threading
import time
import warnings
from dataclasses import dataclass

import torch

from graphrt.attention.backends import make_backend
from graphrt.attention.buckets import pick_bucket
from graphrt.attention.buffers import StaticBuffers
from graphrt.attention.graphs import GraphKey, GraphRunner
from graphrt.attention.inputs import check_exclusive_writes, check_host_values, check_prefill, check_tables
from graphrt.attention.kvcache import PagedKVCache
from graphrt.attention.runtime import raise_device_errors, runtime_device
from graphrt.config import RuntimeConfig
from graphrt.kernels.launch_options import pdl_scope
from graphrt.kernels.transfer import to_device
from graphrt.model.context import AttentionContext
from graphrt.model.draw import Draw, DrawRows, draw
from graphrt.model.logprobs import LogprobBuffers
from graphrt.model.prefill import PrefillAttention
from graphrt.model import prefill_graphs
from graphrt.model.prefill_graphs import PrefillGraphs
from graphrt.model.sampling import SamplingInputs
from graphrt.model.quant.kv import kv_scales as _kv_scale_tensor
from graphrt.model.mixed import MixedChunk
from graphrt.model.options import RuntimeOptions
from graphrt.model.persistent import PersistentPlan, choose as choose_persistent
from graphrt.model.slots import SlotState
from graphrt.model.token_mask import TokenMask
from graphrt.model.plans import check_plans, plans_dict
from graphrt.model.splitk import GEMMS as SPLITK_GEMMS, MAX_ROWS as SPLITK_MAX_ROWS, SplitKPlan, plan_splitk, \
    splittable
from graphrt.model.steps import AUTO, AUTO_STEPS, StepsPlan, steps_for_step_us

log = logging.getLogger("graphrt.model")


@dataclass(frozen=True)
class DecodeKind:
    """One decode graph family: how its steps draw (model/draw.py's Draw, normalised by
    Draw.key), whether its first step also prefills a staged prompt chunk (model/mixed.py), and
    which part of a step it runs (None: K whole steps; "forward" / "draw": one step split in two
    launches, for blocks with constrained rows: see "Split steps" in the module docstring)."""

    draw: Draw = Draw()
    chunk: bool = False
    part: str | None = None      # None: K steps; "forward": one step's model; "draw": its draw


GREEDY, SAMPLED = DecodeKind(Draw()), DecodeKind(Draw(sampled=True))
PROCESSED, PROCESSED_FILTERED = DecodeKind(Draw(True, True, False)), DecodeKind(Draw(True, True, True))
# a step split in two launches (constrained rows): the forward (draw-independent), then the processed draw
FORWARD = DecodeKind(PROCESSED.draw, part="forward")
DRAW, DRAW_FILTERED = DecodeKind(PROCESSED.draw, part="draw"), DecodeKind(PROCESSED_FILTERED.draw, part="draw")
PARTS = (None, "forward", "draw")
GREEDY_CHUNK, SAMPLED_CHUNK = DecodeKind(Draw(), chunk=True), DecodeKind(Draw(sampled=True), chunk=True)


class ModelRuntime:
    def __init__(self, model, config: RuntimeConfig, device="cuda", *, options: RuntimeOptions | None = None,
                 kv_scales: list[tuple[float, float]] | None = None, plans: dict | None = None, **fields):
        """config: what it serves (graphrt/config.py); options: how it runs (model/options.py;
        default RuntimeOptions()); fields: RuntimeOptions fields by keyword, a shorthand for
        options.replace(**fields). The environment's GRAPHRT_* variables then override them
        (RuntimeOptions.with_env): `self.options` is what this runtime runs with. kv_scales: the
        checkpoint's FP8 KV scales; plans: an earlier start's measured plans (model/plans.py)."""
        if options is None:
            options = RuntimeOptions()
        if not isinstance(options, RuntimeOptions):
            raise ValueError(f"options: expected a RuntimeOptions, got {type(options).__name__}")
        opts = self.options = options.replace(**fields).with_env()
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
        tp = getattr(model, "tp", None)
        self.model, self.config = model, config
        # K: fixed, or "auto" at AUTO_STEPS until the first capture() measures (_plan_steps)
        self.steps = (StepsPlan(AUTO_STEPS, "default") if opts.steps_per_graph == AUTO
                      else StepsPlan(opts.steps_per_graph, "fixed"))
        self.k = self.steps.k
        self.keep_logits = opts.keep_logits
        self._logprobs_width = min(opts.logprobs_width, s.vocab_size)   # top-n of a vocabulary holds at most V
        self.processing, self.logprobs_mode = opts.processing, opts.logprobs_mode
        self.device = runtime_device(device)
        pages = opts.num_pages or config.pool_pages
        self.kv_caches = [PagedKVCache.allocate(config, pages, self.device, seed=config.seed + i)
                          for i in range(s.num_layers)]
        self.kv_scale_source = self._set_kv_scales(kv_scales)   # None: not FP8
        b = config.max_batch
        self.slots = SlotState.allocate(b, config.max_pages_per_seq, self.device,
                                        history_width=config.max_context_len if opts.token_history else None,
                                        vocab=s.vocab_size if opts.processing else None)
        # constrained decoding's allowed-token masks (model/token_mask.py): read by the processed draws
        # (mask_positions: 1 + the most proposals a speculative round verifies under a grammar)
        self.token_mask = (TokenMask.allocate(b, s.vocab_size, self.device, positions=opts.mask_positions)
                           if opts.processing else None)
        self.buffers = StaticBuffers(config, self.device, block_table=self.slots.block_table,
                                     seq_lens=self.slots.seq_lens)   # the graphs read the slots
        self.backend = make_backend(config, self.kv_caches[0], self.device, name=opts.backend)
        # a tensor-parallel model's graphs hold NCCL collectives: the process group's watchdog
        # thread queries CUDA events during capture, which the default "global" mode would refuse
        self.graphs = GraphRunner(self.device, capture_error_mode="global" if tp is None else "thread_local",
                                  warmup_steps=opts.graph_warmup, pdl=opts.pdl)
        self.lock = threading.RLock()  # held for a whole call: see the module docstring
        self.prefill_chunk_tokens = opts.prefill_chunk_tokens
        graphed_prefill = opts.graphed_prefill
        if graphed_prefill is None:          # auto: where decode graphs are captured, one GPU (a
            graphed_prefill = (self.device.type == "cuda" and opts.prefill_graph_tokens > 0   # tensor-parallel
                               and tp is None)                                                 # one: not yet run)
        self.prefill_graphs = (PrefillGraphs(model, config, self.device, max_tokens=opts.prefill_graph_tokens)
                               if graphed_prefill and opts.prefill_graph_tokens > 0 else None)
        self._prefill_attention: PrefillAttention | None = None  # built on first prefill
        if opts.mixed_prefill_tokens and tp is not None:
            raise ValueError("mixed_prefill_tokens: not under tensor parallelism (use 0)")
        # a prompt chunk in the first step of a greedy / sampled decode block (model/mixed.py)
        self.mixed = (MixedChunk(model, config, self.device, max_tokens=opts.mixed_prefill_tokens)
                      if opts.mixed_prefill_tokens else None)
        self.sampling = opts.sampling  # capture() also captures the sampled graph of every bucket
        self._plans = check_plans(plans)      # split-K / K measured by an earlier start (model/plans.py)
        self.splitk: SplitKPlan | None = None   # decode buckets' split-K: chosen once, before the first graph
        self.plan_seconds: dict[str, float] = {}  # host seconds of the measured plans at capture (start-up line)
        self.persistent: PersistentPlan | None = None   # greedy buckets <= 16 rows: persistent step or sequence
        self._captured = False
        self.backend.setup([self.buffers.view(x) for x in reversed(config.buckets)])
        if self.backend.needs_host_inputs and self.steps.source == "default":   # "auto": one step
            self.steps = StepsPlan(1, "host planning")
        elif self.k > 1 and self.backend.needs_host_inputs:  # after setup: fallback too
            if not opts.fallback_to_one_step:
                raise ValueError("steps_per_graph: backend plans on the host (planner 'host' or a "
                                 "device-planner fallback), which cannot run several steps in one "
                                 "graph; use steps_per_graph=1")
            reason = getattr(self.backend, "fallback_reason", None) or "host planning"
            warnings.warn(f"graphrt: steps_per_graph={opts.steps_per_graph} needs device planning ({reason}); "
                          f"running 1 step per graph with host planning", stacklevel=2)
            self.steps = StepsPlan(1, "host planning")
        self._logits = (torch.zeros((b, s.vocab_size), dtype=torch.float32, device=self.device)
                        if self.keep_logits else None)                              # last step's
        # a split step's logits, from its forward launch to its draw launch (processing only)
        self.split_logits = (torch.zeros((b, s.vocab_size), dtype=torch.float32, device=self.device)
                             if opts.processing else None)                                # [B, V] float32
        # ... and each row's argmax before masks and processing (the draw's; engine/structured.py FreeRun)
        self.split_argmax = (torch.zeros(b, dtype=torch.int64, device=self.device)
                             if opts.processing else None)                                # [B] int64
        self._split_rows: int | None = None    # n of the forward whose draw is still to launch
        self._set_steps(self.steps.k)

    def _set_steps(self, k: int) -> None:
        """K decode steps per graph, and the outputs sized for it (before any decode graph is
        kept): out_tokens [K, B] int64 and, with processing, the log-probability rows of K steps."""
        b = self.config.max_batch
        self.k = k
        self.out_tokens = torch.zeros((k, b), dtype=torch.int64, device=self.device)   # [K, B]
        self.logprobs = (LogprobBuffers.allocate(steps=k, max_batch=b, width=self._logprobs_width,
                                                 device=self.device) if self.processing else None)

    def _set_kv_scales(self, kv_scales) -> str | None:
        """FP8 KV: the checkpoint's per-layer (k, v) scales into the caches -> "checkpoint", or
        "pending" (calibrated by the first prefill). Not FP8: None (kv_scales must be None)."""
        if not self.config.kv_fp8:
            if kv_scales is not None:
                raise ValueError(f"kv_scales: given for a {self.config.kv_cache_dtype} KV cache; they "
                                 "apply only to kv_cache_dtype='fp8'")
            return None
        if kv_scales is None:
            return "pending"
        if not isinstance(kv_scales, (list, tuple)) or len(kv_scales) != len(self.kv_caches):
            raise ValueError(f"kv_scales: expected {len(self.kv_caches)} (k_scale, v_scale) pairs, one per "
                             f"layer, got {kv_scales!r:.80}")
        for i, (cache, pair) in enumerate(zip(self.kv_caches, kv_scales)):
            try:
                cache.scale.copy_(_kv_scale_tensor(*pair))
            except (TypeError, ValueError) as e:
                raise ValueError(f"kv_scales[{i}]: {e}") from None
        return "checkpoint"

    @property
    def num_pages(self) -> int:
        return self.kv_caches[0].num_pages

    @property
    def uses_graphs(self) -> bool:
        return self.device.type == "cuda" and self.backend.capturable

    def prefill_graphed(self, new_tokens: int, *, logits_rows=frozenset(), record=()) -> bool:
        """Whether a prefill call of `new_tokens` new tokens (with these logits_rows and
        record ids) runs through the prefill graphs: they are on, no prompt log-probs, no
        FP8-KV calibration pending, no recording other than the graphs', and at most
        EAGER_ABOVE_TOKENS new tokens. Pure over the runtime's state (prefill's own rule)."""
        g = self.prefill_graphs
        return (g is not None and self.kv_scale_source != "pending" and not logits_rows
                and tuple(record) in ((), g.record) and new_tokens <= prefill_graphs.EAGER_ABOVE_TOKENS)

    def prefill(self, prompts: list[torch.Tensor], block_table: torch.Tensor, *, on_logits=None,
                logits_rows=frozenset(), record=(), hidden_out: torch.Tensor | None = None,
                hidden_last: torch.Tensor | None = None, starts=None, defer_check: bool = False,
                after=None) -> torch.Tensor:
        """Prefill each prompt into rows of block_table; returns [n, vocab] float32 last-token
        logits. Through the prefill graphs (model/prefill_graphs.py: one replay per piece of at
        most prefill_graph_tokens) where they are on and the call has at most
        EAGER_ABOVE_TOKENS new tokens, eagerly (FlashInfer batch prefill in chunks of
        prefill_chunk_tokens) above that and for prompt log-probs, recording other states than
        the graphs' and the FP8-KV calibration prefill. prompts: n [T_i] int64 tensors (1 <= T_i <= max_context_len);
        block_table [n, w] int32 with pages for every prompt token, ids in the pool, no page in
        two rows (each row writes all its pages). Runtime device or CPU; checked before writing.
        starts: n ints >= 0 (default 0), each prompt's first position: K/V of positions [0, start)
        are already in its pages (a cached prefix, an earlier chunk) and only read.
        on_logits / logits_rows: every position's logits of some prompts (LlamaDecoder.prefill);
        record / hidden_out: the model's hidden-state recording (LlamaDecoder.prefill);
        hidden_last [>= n, len(record) * H]: each prompt's last token's recorded states, through
        the prefill graphs only (`prefill_graphed`; ValueError on the eager path).
        after: n host ints or None, the token after each prompt where known (a chunk), for a
        recording stage in the prefill graphs (PrefillGraphs.prefill; the eager path ignores it).
        defer_check: through the prefill graphs, the K/V append's flags go into the sticky
        device_error (check_device_errors; the engine reads it with each block's tokens) instead
        of a host sync and RuntimeError here; the eager path always checks at once."""
        check_prefill(self.config, self.device, self.num_pages, self.model.spec.vocab_size,
                      prompts, block_table, starts)
        prompts = [to_device(p, self.device) for p in prompts]          # CPU prompts: no host sync
        host_table = block_table if block_table.device.type == "cpu" else block_table.cpu()
        with self.lock, pdl_scope(self.options.pdl):     # the eager prefill's launches too
            self._split_rows = None                       # a split step's forward before it is dropped
            calibrate = self.kv_scale_source == "pending"
            new_tokens = sum(p.numel() for p in prompts)
            if self.prefill_graphed(new_tokens, logits_rows=logits_rows, record=record):
                starts = [0] * len(prompts) if starts is None else [int(x) for x in starts]
                self.model.check_prompts(prompts, self.kv_caches, host_table, starts, host_table)
                if record and hidden_out is not None:
                    self.model.check_record(tuple(record), hidden_out, new_tokens)
                if hidden_last is not None and not record:
                    raise ValueError("hidden_last: given without record ids")
                return self.prefill_graphs.prefill(self.graphs, prompts, host_table, starts, self.kv_caches,
                                                   error_into=self.buffers.device_error if defer_check else None,
                                                   hidden_out=hidden_out if record else None,
                                                   hidden_last=hidden_last, after=after)
            if hidden_last is not None:
                raise ValueError("hidden_last: only through the prefill graphs (prefill_graphed() is False "
                                 "for this call)")
            if self._prefill_attention is None:
                self._prefill_attention = PrefillAttention(self.config, self.device)
            try:
                return self.model.prefill(prompts, self.kv_caches, to_device(host_table, self.device),
                                          host_table=host_table,
                                          attention=self._prefill_attention,
                                          max_tokens=self.prefill_chunk_tokens, starts=starts,
                                          **({"calibrate_kv": True} if calibrate else {}),
                                          **({"on_logits": on_logits, "logits_rows": logits_rows}
                                             if logits_rows else {}),
                                          **({"record": record, "hidden_out": hidden_out}
                                             if record else {}))
            finally:
                if calibrate:   # once: pages are now written with these scales
                    self.kv_scale_source = "calibrated"
                    self._log_kv_scales(sum(p.numel() for p in prompts))

    def _log_kv_scales(self, tokens: int) -> None:
        s = torch.stack([c.scale for c in self.kv_caches]).cpu()                    # [L, 2]
        log.info("graphrt: FP8 KV scales calibrated on the first prefill (%d tokens), fixed from now "
                 "on: k_scale %.4g..%.4g, v_scale %.4g..%.4g over %d layers", tokens,
                 float(s[:, 0].min()), float(s[:, 0].max()), float(s[:, 1].min()),
                 float(s[:, 1].max()), s.shape[0])

    # ---- the decode phase: K steps over a bucket of slots (pure device work: capturable) -------
    def _steps(self, size: int, kind: DecodeKind = GREEDY) -> None:
        """K decode steps over slots [0, size) (kind.part None), each token drawn as kind.draw
        says (model/draw.py: the argmax of the model's kernel set; the slots' sampling rows,
        advancing their draw index; processed: the slots' allowed-token masks (constrained rows
        only) and logits processing first, log-probabilities recorded, drawn tokens counted);
        kind.chunk: the first step also prefills the staged prompt chunk (`self.mixed`). A
        greedy block of a bucket the persistent plan covers runs its step and argmax as one
        launch (model/persistent.py). kind.part "forward": one step's model into `split_logits`;
        "draw": that step's processed draw (the module docstring's "Split steps")."""
        if kind.part == "forward":
            self._forward(size, self.split_logits[:size])
            return
        if kind.part == "draw":
            self.model.ops.argmax_into(self.split_logits[:size], self.split_argmax[:size])
            self._draw(size, kind.draw, 0, self.split_logits[:size], last=True)
            return
        view, how, chunk = self.buffers.view(size), kind.draw, kind.chunk
        # greedy blocks of a bucket the plan gives a persistent step: the step and its argmax, one launch
        greedy = not (how.sampled or how.processed or chunk)
        pstep = None if not greedy or self.persistent is None else self.persistent.get(size)
        ctx = AttentionContext(self.backend, view, self.kv_caches)
        for step in range(self.k):
            if pstep is not None:                                            # model/persistent.py
                ctx.prepare()
                pstep.launch(self.slots.tokens[:size], view.seq_lens, view.block_table,
                             self.out_tokens[step, :size], self.buffers.device_error)
                logits = pstep.logits                                        # [B, vocab] model dtype
            else:
                logits = self._forward(size, None, ctx=ctx, chunk=chunk and step == 0)
            self._draw(size, how, step, logits, last=step + 1 == self.k, drawn=pstep is not None)

    def _forward(self, size: int, into: torch.Tensor | None, *, ctx: AttentionContext | None = None,
                 chunk: bool = False) -> torch.Tensor:
        """One step's model over slots [0, size): the metadata + plan prepared on the device,
        then the model on the slots' current tokens (chunk: with the staged prompt chunk) ->
        [size, vocab] logits in the model dtype, or copied into `into` ([size, vocab] float32)
        and that returned."""
        st = self.slots
        if ctx is None:
            ctx = AttentionContext(self.backend, self.buffers.view(size), self.kv_caches)
        ctx.prepare()
        if chunk:                                                            # + the prompt chunk
            logits = self.mixed.step(self.model, ctx, st.tokens[:size], self.kv_caches, st.block_table,
                                     self.buffers.device_error)
        else:
            split = (1, 1) if self.splitk is None else self.splitk.get(size)
            opts = {} if split == (1, 1) else {"splitk": split}
            logits = self.model.decode_step(ctx, st.tokens[:size], **opts)  # [B, vocab] model dtype
        return logits if into is None else into.copy_(logits)

    def _draw(self, size: int, how: Draw, step: int, logits: torch.Tensor, *, last: bool,
              drawn: bool = False) -> None:
        """Step `step`'s tokens from logits [size, vocab] into out_tokens[step] as `how` says
        (drawn: the persistent step wrote its argmax already), then the slots advance: current
        token, history at index seq_len (speculation's input), seq_len + 1 (one launch); a row at its
        token limit (the slot's `limit`, > 0) keeps its token and length."""
        st, seq = self.slots, self.buffers.view(size).seq_lens                # [B] int32
        out = self.out_tokens[step, :size]
        if how.processed:                        # the step's log-prob rows (the fused pass fills them)
            rows = DrawRows(st.temperature[:size], st.top_k[:size], st.top_p[:size], st.seed[:size], st.step[:size])
            src = draw(logits, rows, how, out, proc=st.proc, sel=size, live=seq > 0, mask=self.token_mask,
                       logprob_rows=self.logprobs.rows(step, size), source=self.logprobs_mode, ops=self.model.ops)
            if src is not None:
                self.logprobs.record(step, size, src, out, ops=self.model.ops)
        elif not drawn:
            rows = DrawRows(st.temperature[:size], st.top_k[:size], st.top_p[:size], st.seed[:size], st.step[:size])
            draw(logits, rows, how, out, ops=self.model.ops)
        self.model.ops.step_advance(out, st.tokens[:size], seq, None if st.history is None else st.history[:size],
                                    st.limit[:size])                 # rows at their limit hold
        if last and self._logits is not None:
            self._logits[:size].copy_(logits)                                 # float32, on request

    def _key(self, size: int, kind: DecodeKind = GREEDY) -> GraphKey:
        how = kind.draw
        if kind.part == "forward":
            return GraphKey("decode_forward", size)
        if kind.part == "draw":
            return GraphKey("decode_draw", size, sampled=True, filtered=how.filtered, processed=True)
        return GraphKey("decode", size, steps=self.k, sampled=how.sampled, filtered=how.filtered,
                        processed=how.processed, chunk=self.mixed.max_tokens if kind.chunk else 0)

    def _host_plan(self, size: int, seq_lens_cpu: torch.Tensor | None = None):
        """The graph runner's prepare hook: a host-planning backend plans from the lengths."""
        if not self.backend.needs_host_inputs:
            return None
        view = self.buffers.view(size)
        return lambda: self.backend.host_prepare(
            view, view.seq_lens.cpu() if seq_lens_cpu is None else seq_lens_cpu)

    def _plan_splitk(self) -> None:
        """Fix the decode buckets' split-K plan once (measured on CUDA: outside any capture)."""
        if self.splitk is None:
            t = time.perf_counter()
            with pdl_scope(self.options.pdl):         # the measured graphs launch as the step will
                self.splitk = self._cached_splitk() or plan_splitk(self.model, self.config.buckets,
                                                                   self.options.splitk)
            if self.splitk.source == "measured":
                self.plan_seconds["split-K"] = time.perf_counter() - t
        if self.persistent is None:                      # measured ("auto" on CUDA) in capture()
            o = self.options
            self.persistent = PersistentPlan.build(self.model, self.kv_caches, self.config.buckets, o.decode_backend,
                                                   max_context_len=self.config.max_context_len,
                                                   cooperative=o.persistent_cooperative, prefetch=o.persistent_prefetch,
                                                   stages=o.persistent_stages)

    def _measure_persistent(self) -> None:
        """decode_backend "auto" on CUDA (after K is fixed, outside any capture): per bucket with a
        persistent step, its greedy graph and the kernel sequence's are captured, timed and
        dropped; the persistent step stays where `choose_persistent` says (a step that fails to
        compile or launch is dropped, logged)."""
        plan = self.persistent
        if plan.source != "measured" or plan.timings_us:
            return
        t0 = time.perf_counter()
        steps = plan.candidates
        reps = max(1, min(5, (self.config.max_context_len - 2) // (4 * self.k)))
        for size, pstep in steps.items():
            key, inputs = self._key(size, GREEDY), self._capture_inputs(size)
            for name, table in (("sequence", {}), ("persistent", {size: pstep})):
                plan.table = table
                try:
                    self.graphs.capture(key, lambda: self._steps(size, GREEDY), inputs=inputs, scratch=self.kv_caches)
                    plan.timings_us[(size, name)] = self.graphs.time_us(key, inputs=inputs, scratch=self.kv_caches,
                                                                        reps=reps, repeats=3)
                except Exception as e:                   # noqa: BLE001 - the sequence stays
                    if name == "sequence":
                        raise
                    log.warning("graphrt: persistent decode step at %d rows failed (%s): kernel sequence", size, e)
                    plan.timings_us[(size, name)] = float("inf")
                finally:
                    self.graphs.drop(key)
        plan.table = {size: p for size, p in steps.items() if choose_persistent(plan.timings_us, size)}
        self.plan_seconds["persistent step"] = time.perf_counter() - t0
        log.info("graphrt: persistent decode step at rows %s of %s (measured, µs %s)", sorted(plan.table),
                 sorted(steps), {k: round(v, 1) for k, v in plan.timings_us.items()})

    def _cached_splitk(self) -> SplitKPlan | None:
        """The split-K plan of `plans` where it applies: setting "auto", CUDA, one GPU, its table's
        rows exactly the buckets plan_splitk would measure and every factor fitting the o / down
        weights (splittable); else None (measured)."""
        table = self._plans["splitk"]
        if table is None or self.options.splitk != "auto" or self.device.type != "cuda" \
                or getattr(self.model, "tp", None) is not None:
            return None
        rows = {int(b) for b in self.config.buckets if b <= SPLITK_MAX_ROWS}
        if set(table) != rows:
            log.info("graphrt: cached split-K plan for rows %s, these buckets %s: measured instead",
                     sorted(table), sorted(rows))
            return None
        layers = getattr(getattr(self.model, "weights", None), "layers", None) or []
        if any(not splittable(getattr(layer, g), pair[i]) for pair in table.values()
               for i, g in enumerate(SPLITK_GEMMS) for layer in layers):
            log.info("graphrt: cached split-K plan %s does not fit this model's o / down weights: measured "
                     "instead", table)
            return None
        log.info("graphrt: split-K of o / down by decode rows %s (cached)", table)
        return SplitKPlan(dict(table), "cached")

    def measured_plans(self) -> dict:
        """The plans this runtime measured (or took cached) at capture, in model/plans.py's JSON
        form, for a later start's `plans=`: {} before capture or where nothing was measured."""
        sk = self.splitk if self.splitk is not None and self.splitk.source in ("measured", "cached") else None
        st = self.steps if self.steps.source in ("measured", "cached") else None
        return plans_dict(None if sk is None else dict(sk.table), None if st is None else (st.k, st.step_us))

    def _capture_inputs(self, size: int, processed: bool = False, chunk: bool = False) -> list:
        """The graph runner's (tensor, value) fills for a decode graph of `size` rows: every row
        a 1-token request on page 0 (restored after the capture)."""
        st = self.slots
        inputs = [(st.block_table[:size], 0), (st.seq_lens[:size], 1), (st.tokens[:size], 0),
                  (st.step[:size], 0)] + ([] if st.history is None else [(st.history[:size], 0)])
        if processed:
            inputs.append((st.proc.counts[:size], 0))
        if chunk:
            inputs += self.mixed.capture_inputs
        return inputs

    def _plan_steps(self) -> None:
        """steps_per_graph="auto": fix K once, before the first decode graph is kept (outside
        any capture; after split-K, which changes the step). The smallest
        bucket's greedy graph at K = 1 is captured, timed (device µs per replay) and dropped;
        K = steps_for_step_us(that). Under tensor parallelism each rank times its shard and
        all take the ranks' mean, so every rank picks the same K."""
        if self.steps.source != "default":
            return
        cached = self._plans["steps"]
        if cached is not None and getattr(self.model, "tp", None) is None:
            self.steps = StepsPlan(cached[0], "cached", cached[1])
            self._set_steps(self.steps.k)
            log.info("graphrt: steps_per_graph auto: %s", self.steps.describe())
            return
        t0, size = time.perf_counter(), self.config.buckets[0]
        self._set_steps(1)
        key, inputs = self._key(size), self._capture_inputs(size)
        # the replays advance seq_lens from 1 by one a replay: stay within max_context_len
        reps = max(1, min(5, (self.config.max_context_len - 2) // 3))
        try:
            self.graphs.capture(key, lambda: self._steps(size), inputs=inputs, scratch=self.kv_caches)
            step_us = self.graphs.time_us(key, inputs=inputs, scratch=self.kv_caches, reps=reps, repeats=3)
        except BaseException:
            self._set_steps(self.steps.k)                    # still "auto" unmeasured: AUTO_STEPS
            raise
        finally:
            self.graphs.drop(key)
        tp = getattr(self.model, "tp", None)
        if tp is not None:                                   # one K for every rank
            mean = tp.nccl_all_reduce(torch.tensor([step_us], dtype=torch.float32, device=self.device))
            step_us = float(mean) / tp.world_size
        self.steps = StepsPlan(steps_for_step_us(step_us), "measured", step_us, time.perf_counter() - t0)
        self.plan_seconds["steps"] = self.steps.seconds
        self._set_steps(self.steps.k)
        log.info("graphrt: steps_per_graph auto: %s", self.steps.describe())

    def capture(self) -> dict:
        """Capture the decode graphs of every bucket not yet captured (largest first; greedy,
        and sampled with sampling=True); returns {GraphKey: CaptureStats} of every graph of the
        runner ({} on CPU). Warm-up and capture run 1-token requests on page 0 of every layer,
        which the graph runner saves and restores, as it does the slots. steps_per_graph="auto":
        the first call measures the step and fixes K first (_plan_steps)."""
        if not self.uses_graphs:
            return {}
        with self.lock:
            self._plan_splitk()
            self._plan_steps()
            self._measure_persistent()
            kinds = ([GREEDY] + [SAMPLED] * self.sampling + [PROCESSED, PROCESSED_FILTERED] * self.processing
                     + [FORWARD, DRAW, DRAW_FILTERED] * self.processing
                     + ([GREEDY_CHUNK] + [SAMPLED_CHUNK] * self.sampling if self.mixed is not None else []))
            for size in reversed(self.config.buckets):      # greedy / sampled blocks carry chunks
                for kind in kinds:
                    key = self._key(size, kind)
                    if key in self.graphs:
                        continue
                    self.graphs.capture(key, lambda s=size, d=kind: self._steps(s, d),
                                        inputs=self._capture_inputs(size, kind.draw.processed, kind.chunk),
                                        scratch=self.kv_caches, prepare=self._host_plan(size))
            if self.prefill_graphs is not None:
                self.prefill_graphs.capture(self.graphs, self.kv_caches)
            self._captured = True
            return dict(self.graphs.stats)

    def _run(self, n: int, sampled: bool, seq_lens_cpu: torch.Tensor | None = None,
             processed: bool = False, filtered: bool = True, chunk: bool = False,
             part: str | None = None) -> torch.Tensor | None:
        size = pick_bucket(self.config.buckets, n)
        kind = DecodeKind(Draw(sampled=sampled, processed=processed, filtered=filtered).key(), chunk, part)
        self._plan_splitk()
        self.graphs.run(self._key(size, kind), lambda: self._steps(size, kind),
                        prepare=self._host_plan(size, seq_lens_cpu) if part != "draw" else None)
        if part == "forward":
            return None
        return self.out_tokens[:, :n] if part is None else self.out_tokens[:1, :n]

    def _check_sampled(self, sampled: bool) -> None:
        if sampled and self._captured and not self.sampling:
            raise ValueError("sampling: this ModelRuntime was captured with sampling=False "
                             "(argmax graphs only)")

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
        self._check_sampled(sampling is not None)
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
            self.slots.load(n, tokens, block_table, seq_lens, sampling)   # the input copy
            self._split_rows = None                                        # no split draw after this
            host_lens = seq_lens if seq_lens.device.type == "cpu" else None
            rows = self._run(n, sampling is not None, host_lens)
            return rows if out is None else out.copy_(rows)

    def stage_chunk(self, slot: int, tokens: torch.Tensor, start: int, *, table_row=None) -> None:
        """The next `decode_slots(..., chunk=True)` block's first step also prefills `tokens` (CPU
        [n] int64, 1 <= n <= mixed_prefill_tokens) at positions [start, start + n) of `slot`,
        whose block-table row must hold their pages (table_row: the host mirror, checked);
        MixedChunk.stage. ValueError names the field (needs mixed_prefill_tokens > 0)."""
        if self.mixed is None:
            raise ValueError("mixed_prefill_tokens: this ModelRuntime was built with 0 (no mixed chunks)")
        with self.lock:
            self.mixed.stage(slot, tokens, start, table_row=table_row, num_pages=self.num_pages)

    def decode_slots(self, n: int, *, sampled: bool, processed: bool = False, filtered: bool = True,
                     chunk: bool = False, part: str | None = None) -> torch.Tensor | None:
        """K decode steps over slots [0, n) as they stand in `self.slots` (the engine's path: no
        input copy, no host check, no sync except a host-planning backend reading seq_lens);
        returns [K, n] int64 tokens (a view of a static buffer, valid until the next block).

        Slots [n, bucket) must be empty (seq_len 0). The slots advance on the device: seq_lens
        by K for live rows, tokens to the last step's, step by K for every row of a sampled
        block, the history by K tokens. The device guard still neutralises bad rows and raises
        the sticky flag that check_device_errors() reports. processed: the logits-processing
        graph (needs processing=True; see the module docstring): also fills `self.logprobs` and
        advances the slots' token counts; with filtered=False (no row uses top-k / top-p) the
        one without the sampler's sort. chunk: the block's first step also prefills the chunk
        staged by `stage_chunk` (greedy / sampled blocks only; each staging runs once).

        part (processed only; "Split steps" in the module docstring): "forward" runs one step's
        model over the slots' current tokens into `split_logits` and returns None; "draw" then draws that step's
        tokens (masks, processing, log-probs, counts) and advances the slots -> [1, n]. Between
        the two the host may write the constrained rows' masks (TokenMask.write): the draw reads
        them, the forward does not. A "draw" needs the "forward" of the same n just before it
        (no other decode launch nor prefill between: ValueError); a forward never drawn changes
        no slot (dropped: its step never happened)."""
        self._check_sampled(sampled)
        if part not in PARTS:
            raise ValueError(f"part: expected one of {PARTS}, got {part!r}")
        if processed and not self.processing:
            raise ValueError("processed: this ModelRuntime was built with processing=False")
        if part is not None and not processed:
            raise ValueError(f"part: {part!r} splits a processed step (processed=True)")
        if chunk and (self.mixed is None or processed):
            raise ValueError("chunk: needs mixed_prefill_tokens > 0 and a greedy / sampled block "
                             "(not processed)")
        with self.lock:
            if part == "draw" and self._split_rows != n:
                raise ValueError(f"part: 'draw' over {n} rows needs the 'forward' over the same rows just "
                                 f"before it (pending: {self._split_rows})")
            self._split_rows = n if part == "forward" else None
            if chunk:
                self.mixed.take()
            return self._run(n, sampled, processed=processed, filtered=filtered, chunk=chunk, part=part)

    def last_logits(self, n: int) -> torch.Tensor:
        """[n, vocab] float32 logits of the last decode step of the bucket serving n rows
        (needs ModelRuntime(..., keep_logits=True))."""
        if not self.keep_logits:
            raise ValueError("last_logits: this runtime was built with keep_logits=False; pass "
                             "keep_logits=True to ModelRuntime to keep each step's float32 logits")
        return self._logits[:n]

    def check_device_errors(self) -> None:
        """Raise DeviceInputError if the prepare or K/V-append kernels flagged bad device inputs."""
        raise_device_errors(self.buffers.device_error, self.config, self.num_pages)
