"""The local executor: the Executor protocol (protocol.py) over one process's ModelRuntime.

    ex = LocalExecutor(ModelRuntime(...), spec=SpeculativeRunner.attach(mrt, ...))
    ex.capture()
    caps = ex.caps                                                  # Capabilities (caps.py)
    first = ex.prefill(Prefill(prompts, table, slots=slots, sampling=inputs)).tokens   # [1, m]
    ex.prefill(Prefill(pieces, table, starts=starts, after=after))   # chunks that draw nothing
    tokens = ex.run(Block(n, draw=Draw(sampled=True), changes=changes)).tokens   # [K, n]: K steps
    out = ex.run(Block(n, k=2))                                     # R rounds: tokens, emitted, proposed

The executor is the one host writer of the runtime's slots: its InputBatch (input_batch.py)
records the slot changes (changes.py) each launch carries and stages them into the slots before
the launch runs. Every call is a pure function of the runtime's slot state (model/slots.py) plus
its arguments, so the tensor-parallel executor (graphrt/parallel/executor.py) replays the same call on every
rank: a single-GPU engine imports nothing from graphrt/parallel/. `runtime` (the ModelRuntime)
and `spec` (the SpeculativeRunner or None) are this implementation's, for tools and tests; the
engine reads `caps` and calls the protocol only.

With a draft model the executor keeps the draft's K/V consistent across a policy's switches: a
plain decode block runs only the target, so the slots it served are marked, and the next
speculative block over a marked slot first re-prefills the draft over that slot's tokens
(SpeculativeRunner.sync_draft: eager, one host read of the lengths, once per switch back on).
"""
from __future__ import annotations

import logging

import torch

from graphrt.kernels.transfer import tensor_on, to_device
from graphrt.model.logprobs import PromptLogprobs, token_logprobs
from graphrt.model.draw import Draw, DrawRows, draw
from graphrt.model.processing import ProcessRows
from graphrt.model.sampling import SamplingInputs
from graphrt.worker.caps import Capabilities
from graphrt.worker.input_batch import InputBatch
from graphrt.worker.launch import Block, Prefill, Result

log = logging.getLogger("graphrt.worker")


class LocalExecutor:
    """runtime: the ModelRuntime (the decode phase, the slots, the graph runner); spec: a
    SpeculativeRunner attached to it (speculative/runner.py), or None."""

    def __init__(self, runtime, spec=None):
        if spec is not None and spec.slots is not runtime.slots:
            raise ValueError("spec: the speculative runner must share the runtime's slots "
                             "(SpeculativeRunner.attach)")
        self.runtime, self.spec = runtime, spec
        c, history = runtime.config, runtime.slots.history
        # the host mirror and stager of the slots' rows: written only from the launches' changes
        self.batch = InputBatch(max_batch=c.max_batch, max_pages_per_seq=c.max_pages_per_seq,
                                pin=runtime.device.type == "cuda",
                                history_width=None if history is None else history.shape[1])
        self._draft_stale: set[int] = set()   # slots whose draft K/V misses plain-block tokens
        self._draft_since = torch.zeros_like(runtime.slots.seq_lens)   # [B] their lengths then (device)
        self._caps: Capabilities | None = None

    @property
    def caps(self) -> Capabilities:
        """What this executor can do (read after capture: K "auto" is fixed there)."""
        rt, spec = self.runtime, self.spec
        caps = self._caps
        if caps is None or caps.steps_per_graph != rt.k:
            model = rt.model
            caps = self._caps = Capabilities(
                config=rt.config, device=rt.device, num_pages=rt.num_pages, vocab_size=model.spec.vocab_size,
                model_key=f"{type(model).__name__}|{model.spec!r}|{rt.config!r}", steps_per_graph=rt.k,
                speculative=None if spec is None else spec.config,
                spec_ks=() if spec is None else tuple(spec.ks), spec_rounds=0 if spec is None else spec.rounds,
                processing=rt.processing, logprobs_width=rt.logprobs.width if rt.processing else 0,
                structured=rt.token_mask is not None, spec_grammar=spec is not None and spec.grammar,
                mixed_tokens=0 if rt.mixed is None else rt.mixed.max_tokens,
                history_width=None if rt.slots.history is None else rt.slots.history.shape[1],
                draft_state=self._draft is not None, shared_prefill=self._eagle is None, kernels=model.kernels,
                device_errors=True)
        return caps

    @property
    def error_flag(self) -> torch.Tensor:
        """The target runtime's sticky device-guard flags ([1] int32, device): nonzero after a
        prepare or K/V-append kernel flagged bad inputs (check_device_errors says which)."""
        return self.runtime.buffers.device_error

    @property
    def _draft(self):
        """The draft model proposer (a phase with per-slot K/V of its own), or None."""
        return None if self.spec is None else self.spec.draft

    @property
    def _eagle(self):
        """The EAGLE-3 phase, or None."""
        return None if self.spec is None else self.spec.eagle

    # ---- calls --------------------------------------------------------------------------------
    def capture(self) -> dict:
        """Every phase's graphs (decode, then speculative rounds: one per bucket, k in spec_ks
        and filtered variant), one pool; {GraphKey: stats}. The speculative graphs' count,
        capture time and pool growth are logged (what the extra k values cost)."""
        stats = self.runtime.capture()
        if self.spec is not None and self.runtime.uses_graphs:
            self.spec.capture()
            stats = dict(self.runtime.graphs.stats)
            spec = [s for key, s in stats.items() if key.phase == "spec"]
            log.info("speculative graphs: %d (buckets %s x k in %s), %.0f ms capture, %.1f MiB",
                     len(spec), list(self.runtime.config.buckets), list(self.spec.ks),
                     sum(s.capture_ms + s.warmup_ms for s in spec), sum(s.graph_bytes for s in spec) / 2**20)
        return stats

    def prefill_graphed(self, new_tokens: int) -> bool:
        """Whether a target prefill of `new_tokens` new tokens (no prompt log-probs) runs through
        the runtime's prefill graphs (ModelRuntime.prefill_graphed): one replay per piece of one
        request, so separate calls cost no extra weight pass."""
        return self.runtime.prefill_graphed(new_tokens)

    def prefill(self, launch: Prefill) -> Result:
        """A prefill (launch.py): pieces that draw nothing (launch.slots None: `_prefill_pieces`)
        or prompts whose slots draw their next token (`_prefill_slots`), after its slot changes."""
        self._apply(launch.changes)
        if not launch.draws:
            self._prefill_pieces(launch.prompts, launch.block_table, starts=launch.starts, after=launch.after,
                                 defer_check=launch.defer_check)
            return Result(None)
        first, lp, plp = self._prefill_slots(
            launch.prompts, launch.block_table, launch.slots, launch.sampling, processing=launch.processing,
            prompt_logprobs=launch.prompt_logprobs, starts=launch.starts, sources=launch.sources,
            copies=launch.copies, defer_check=launch.defer_check, draft=launch.draft, logprobs=launch.logprobs)
        return Result(first[None], logprobs=lp, prompt_logprobs=plp)

    def run(self, block: Block) -> Result:
        """One block (launch.py): k = 0, K plain decode steps; k > 0, R speculative rounds; after
        its slot changes."""
        d = block.draw
        self._apply(block.changes)
        if block.k:
            caps = self.caps
            caps.refuse("k", block.k in caps.spec_ks, f"{block.k} is not one of this executor's "
                        f"speculative proposal counts {caps.spec_ks}")
            caps.refuse("rounds", block.rounds is None or caps.spec_grammar,
                        "one-round blocks need grammar-checked n-gram proposals (spec_grammar)")
            out = self._spec_block(block.n, k=block.k, filtered=d.filtered, processed=d.processed,
                                   sync_draft=block.sync_draft, rounds=block.rounds)
            return Result(out.tokens, out.emitted, out.proposed, logprobs=out.logprobs if block.logprobs else None,
                          argmax=out.argmax)
        if d.processed:
            tokens = self._decode_block(block.n, sampled=True, processed=True, filtered=d.filtered,
                                        part=block.part)
            best = self.runtime.split_argmax[:block.n][None] if block.part == "draw" else None
            return Result(tokens, logprobs=self.runtime.logprobs.view(block.n) if block.logprobs else None,
                          argmax=best)
        return Result(self._decode_block(block.n, sampled=d.sampled, chunk=block.chunk))

    def _prefill_pieces(self, prompts: list[torch.Tensor], block_table: torch.Tensor, *, starts=None,
                        after=None, defer_check: bool = False, proposer: bool = True, **record) -> torch.Tensor:
        """As ModelRuntime.prefill: [m, V] float32 last-token logits (prompts[i] from position
        starts[i], default 0): every target prefill goes through here (_prefill_slots' too). For
        pieces of a context that draw nothing yet (a chunk) a proposer with K/V of its own
        follows: a draft model prefills the same positions; an EAGLE-3 head writes its K/V there
        from the target's recorded states, pairing each piece's last position with after[i] (host
        int, the context's next token). proposer=False: the target alone (_prefill_slots, which
        runs the draft after its draws; an EAGLE-3 target's prefill records states: not here).
        record: ModelRuntime.prefill's on_logits / logits_rows (prompt log-probs). defer_check:
        as ModelRuntime.prefill's (the flags into `error_flag`)."""
        if not proposer:
            return self.runtime.prefill(prompts, block_table, starts=starts, defer_check=defer_check, **record)
        eagle = self._eagle
        after = [None] * len(prompts) if after is None else list(after)
        if len(after) != len(prompts):
            raise ValueError(f"after: {len(after)} tokens for {len(prompts)} prompts")
        if eagle is not None:
            logits, hidden = eagle.target_prefill(self.runtime, prompts, block_table, starts=starts, after=after,
                                                  defer_check=defer_check, **record)
            eagle.prefill_part(hidden, prompts, after, block_table,
                               [0] * len(prompts) if starts is None else starts, self.spec.device_error)
            return logits
        logits = self.runtime.prefill(prompts, block_table, starts=starts, defer_check=defer_check, **record)
        if self._draft is not None:
            self._draft.prefill([to_device(p, self.runtime.device) for p in prompts], block_table, starts=starts)
        return logits

    def _prefill_slots(self, prompts: list[torch.Tensor], block_table: torch.Tensor, slots: list[int],
                       sampling: SamplingInputs, *, processing: ProcessRows | None = None,
                       prompt_logprobs: dict[int, int] | None = None, starts=None,
                       sources: list[int] | None = None, copies: list[tuple[int, int]] = (),
                       defer_check: bool = False, draft: bool = True, logprobs: bool = False) -> tuple:
        """Prefill each prompt (row i of block_table, from position starts[i], default 0), draw
        each slot's next token with sampling's row i (its step is not advanced) from the last
        logits of prompt sources[i] (default: slot i's own prompt, i < m) and write it as the
        slot's current token (and into its token history at index start + len(prompt)) -> (the
        [m] int64 first tokens (device), the first draws' log-prob rows or None, the prompt
        log-probs {row: ...} CPU). copies:
        (src, dst) KV pages copied after the prefill, in every layer (n > 1: a sample's copy of
        the prompt's partial last page). With a draft model, the draft's caches are prefilled
        over the same positions (and copied) too; with an EAGLE-3 head, the target's prefill
        records its hidden states and the head's prefill makes the slots' first proposals (no
        sources with EAGLE-3). Either proposer's K/V below starts[i] is what the pages hold (a
        cached prefix: its writer's; an earlier chunk: this request's); it changes only how many
        proposals are accepted, never a token.

        processing (a processing runtime): the slots' processing rows are reset to it first and
        the first draws are processed and counted; logprobs: their log-probabilities returned
        (device views; else None); prompt_logprobs {row i: n}: those rows' prompt log-probabilities (CPU,
        synchronous; whole prompts only).
        defer_check: the target's prefill as ModelRuntime.prefill's (an EAGLE-3 target's too).
        draft=False (a draft model, no sources or copies): the draft's prefill is left out and
        the slots are marked stale from their start (the policy starts them on plain decode: a
        later speculative block catches the draft up from there, as after plain blocks; a
        request that never speculates never runs its draft)."""
        want = dict(prompt_logprobs or {})
        ops = self.runtime.model.ops                      # the model's kernel set draws (kernels/ops.py)
        collect = PromptLogprobs(prompts, want, ops=ops) if want else None
        extra = {"on_logits": collect, "logits_rows": frozenset(want)} if collect is not None else {}
        if starts is not None and any(starts):
            if want:
                raise ValueError("starts: prompt_logprobs need the whole prompt prefilled")
            extra["starts"] = starts
        eagle = self._eagle
        if eagle is not None and sources is not None:
            raise ValueError("sources: an EAGLE-3 head prefills every sample's prompt (no shared prefill)")
        defer = {"defer_check": True} if defer_check else {}   # the K/V flags read with the block
        if eagle is not None:
            logits, hidden = eagle.target_prefill(self.runtime, prompts, block_table, **extra, **defer)
        else:
            logits = self._prefill_pieces(prompts, block_table, proposer=False, **extra, **defer)   # the draft's: below
        prompt_lp = {i: collect.result(i) for i in want} if collect is not None else {}
        first_lp = None
        st, dev = self.runtime.slots, self.runtime.device
        if sources is not None:
            logits = logits.index_select(0, tensor_on(sources, torch.long, logits.device))   # [s, V]
        idx = tensor_on(slots, torch.long, dev)
        if processing is not None:
            if st.proc is None:
                raise ValueError("processing: this runtime was built with processing=False")
            st.proc.write_rows(idx, processing)
        # the first draw: the sampler over every row (greedy rows: temperature 0), the slots' step
        # copied, not advanced; processed: constrained rows' allowed-token masks and the slots'
        # processing first, counted, log-probs read
        sampling.check(len(slots), logits.device)
        rows = DrawRows(*(to_device(t, dev) for t in (sampling.temperature, sampling.top_k, sampling.top_p,
                                                      sampling.seed)), to_device(sampling.step, dev).clone())
        first = torch.empty(len(slots), dtype=torch.int64, device=dev)              # [m] device
        tm = self.runtime.token_mask                      # no constrained row drawn here: no mask launch
        src = draw(logits, rows, Draw(sampled=True, processed=processing is not None, filtered=True), first,
                   proc=st.proc, sel=idx, source=self.runtime.logprobs_mode,
                   mask=tm if processing is not None and tm is not None and tm.any_on(slots) else None,
                   live=None if processing is None else torch.ones(len(slots), dtype=torch.bool, device=dev),
                   ops=ops)
        if src is not None and logprobs:              # only where a request asked: [m, V] read four times
            first_lp = tuple(t[None] for t in token_logprobs(src, first, self.caps.logprobs_width, ops=ops))
        st.tokens.index_copy_(0, idx, first)
        src = sources if sources is not None else range(len(slots))
        if st.history is not None:
            base = starts if starts is not None else [0] * len(prompts)
            at = tensor_on([s * st.history.shape[1] + base[j] + prompts[j].numel() for s, j in zip(slots, src)],
                           torch.long, dev)
            st.history.view(-1).index_copy_(0, at, first.to(torch.int32))
        draft_model = self._draft
        if draft_model is not None and not draft and sources is None and not copies:
            # the draft holds no K/V from each prompt's start (sync_draft writes from since - 2)
            since = [int(starts[j]) + 2 if starts is not None and starts[j] else 0 for j in range(len(slots))]
            self._draft_since.index_copy_(0, idx, tensor_on(since, self._draft_since.dtype, dev))
            self._draft_stale.update(slots)
            draft_model = None
        elif draft_model is not None:
            draft_model.prefill([to_device(p, dev) for p in prompts], block_table,
                                starts=starts if starts is not None and any(starts) else None)
            self._draft_stale.difference_update(slots)
        draft = draft_model
        if copies:
            _copy_pages(list(self.runtime.kv_caches) + (list(draft.kv_caches) if draft is not None else []),
                        copies, dev)
        if eagle is not None:
            eagle.prefill(hidden, prompts, first, block_table, slots, self.spec.device_error, starts=starts)
        return first, first_lp, prompt_lp

    def _apply(self, changes: tuple) -> None:
        """A launch's slot changes (changes.py) into the slots: recorded by the input batch, staged
        (what changed only) and copied (SlotState.apply: stream-ordered, no sync)."""
        if changes:
            self.batch.record(changes)
        self.batch.flush(self.runtime.slots.apply)

    def _decode_block(self, n: int, *, sampled: bool, processed: bool = False,
                      filtered: bool = True, chunk: bool = False, part: str | None = None) -> torch.Tensor | None:
        """K decode steps over slots [0, n) -> [K, n] int64 (a view, valid until the next block);
        processed: the logits-processing graph (then `runtime.logprobs` holds the block's), with
        part "forward" / "draw" one step in two launches (constrained rows, whose masks change
        every token: the forward -> None, then its draw -> [1, n]);
        filtered (with processed): some row uses top-k / top-p; chunk: the block's first step
        also prefills the prompt chunk staged by `stage_chunk` (not with processed)."""
        if chunk:
            return self.runtime.decode_slots(n, sampled=sampled, chunk=True)
        if part == "draw":                               # the forward did the bookkeeping below
            return self.runtime.decode_slots(n, sampled=True, processed=True, filtered=filtered, part="draw")
        if self._draft is not None:
            fresh = [s for s in range(n) if s not in self._draft_stale]
            if fresh:    # where each slot's draft K/V stops (device)
                lens = self.runtime.slots.seq_lens
                if len(fresh) == n:                      # after a spec block: no host tensor (a
                    self._draft_since[:n].copy_(lens[:n])   # pageable copy would wait for the stream)
                else:
                    idx = torch.tensor(fresh, dtype=torch.long, device=self.runtime.device)
                    self._draft_since.index_copy_(0, idx, lens.index_select(0, idx))
            self._draft_stale.update(range(n))
        if processed:
            return self.runtime.decode_slots(n, sampled=True, processed=True, filtered=filtered, part=part)
        return self.runtime.decode_slots(n, sampled=sampled)

    def write_token_mask(self, slots: list[int], bits: torch.Tensor, active: torch.Tensor) -> None:
        """The allowed-token masks of `slots` (bits [m, W] or [m, p, W] int32, active [m] int32,
        CPU; TokenMask.write), read by the next draws of those slots (a prefill's first draw, the
        processed blocks, a one-round block's verify)."""
        self.caps.refuse("structured_outputs", self.caps.structured,
                         "this runtime was built with processing=False")
        self.runtime.token_mask.write(slots, bits, active)

    def stage_chunk(self, slot: int, tokens: torch.Tensor, start: int, *, table_row=None) -> None:
        """The next `run(Block(..., chunk=True))` also prefills `tokens` (CPU [m] int64, m <=
        caps.mixed_tokens) at positions [start, start + m) of `slot` (ModelRuntime.stage_chunk:
        ValueError names the field)."""
        self.runtime.stage_chunk(slot, tokens, start, table_row=table_row)

    def _spec_block(self, n: int, *, k: int | None = None, filtered: bool = False, processed: bool = False,
                   sync_draft: bool = True, rounds: int | None = None):
        """R speculative rounds with k proposals a round (one of spec_ks; default the configured
        num_tokens) over slots [0, n) -> BlockOutput views (speculative/runner.py); filtered:
        some slot uses top_k / top_p; processed: some slot needs logits processing. sync_draft=False:
        no catch-up of stale draft K/V first (they stay stale: the draft proposes from what it
        has, which acceptance keeps exact; for a block whose rows are at their limit). rounds:
        None (R) or 1 (constrained rows: SpeculativeRunner.grammar)."""
        if self.spec is None:
            raise ValueError("k: this executor was built without speculation (k must be 0)")
        if self._draft_stale and sync_draft:
            stale = sorted(s for s in self._draft_stale if s < n)
            self.spec.sync_draft(stale, since=self._draft_since)
            self._draft_stale.difference_update(stale)
        return self.spec.run(n, k=k, filtered=filtered, processed=processed, rounds=rounds)

    def measure_costs(self, *, replays: int = 10):
        """Device µs of one plain decode step and one speculative round per bucket and k in
        spec_ks, timed with CUDA events around replays of the captured graphs on empty slots
        (fixed-shape graphs: the GEMMs, which dominate at low batch, cost the same) ->
        speculative/policy.py's StepCosts (verify_us[b][k + 1] = a whole round at k: proposer,
        draft and verify), or None without captured graphs (CPU) or without the policy module."""
        rt, spec = self.runtime, self.spec
        if spec is None or not rt.uses_graphs or not rt.graphs.keys():
            return None
        try:
            from graphrt.speculative.policy import StepCosts
        except ImportError:
            return None
        decode, verify = {}, {}
        with rt.lock:
            for b in rt.config.buckets:
                decode[b] = _time_us(lambda: rt.decode_slots(b, sampled=False), replays) / rt.k
                verify[b] = {k + 1: _time_us(lambda k=k: spec.run(b, k=k, filtered=False), replays) / spec.rounds
                             for k in spec.ks}
            draft_prefill = self._draft_prefill_us() if self._draft is not None else 0.0
        return StepCosts(decode_us=decode, verify_us=verify, draft_prefill_us=draft_prefill)

    def _draft_prefill_us(self, tokens: int = 256) -> float:
        """Device µs per token of the draft model's prefill of one `tokens`-token prompt (at most
        its context), timed at start-up, before any request: it writes the draft's K/V of the
        first pages, which a request's own draft prefill or catch-up writes before it reads them."""
        draft, cfg = self._draft, self.runtime.config     # the draft shares the target's pages
        n = max(1, min(tokens, cfg.max_context_len - 1))
        page = cfg.page_size
        prompt = torch.zeros(n, dtype=torch.int64, device=self.runtime.device)
        table = torch.arange(-(-n // page), dtype=torch.int32).view(1, -1)
        return _time_us(lambda: draft.prefill([prompt], table), 3) / n

    def check_device_errors(self) -> None:
        """Raise DeviceInputError naming the guard that flagged (ModelRuntime.check_device_errors)."""
        self.runtime.check_device_errors()


def _copy_pages(caches, copies: list[tuple[int, int]], device) -> None:
    """KV pages src -> dst in every cache (PagedKVCache: k, v [num_pages, ...]); device work,
    ordered on the stream after the prefill that wrote src."""
    src = tensor_on([a for a, _ in copies], torch.long, device)
    dst = tensor_on([b for _, b in copies], torch.long, device)
    for c in caches:
        for t in c.as_tuple():
            t.index_copy_(0, dst, t.index_select(0, src))


def _time_us(fn, replays: int) -> float:
    """Mean µs of fn() on the current CUDA stream (one warm-up call first)."""
    from graphrt.kernels.timing import events_us
    return events_us(fn, replays, warmup=1)


__all__ = ["LocalExecutor"]
