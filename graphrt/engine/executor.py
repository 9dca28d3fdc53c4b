"""The executor: the engine's one interface to the device, in this process or over ranks.

    ex = LocalExecutor(ModelRuntime(...), spec=SpeculativeRunner.attach(mrt, ...))   # one GPU
    ex = TPDriver(LocalExecutor(rank 0's runtime), control, health=...)   # graphrt/parallel: the
                                                                           # same calls, broadcast
    ex.capture()
    first = ex.prefill_slots(prompts, table, slots, sampling)   # prefill + first draws into the slots
    first = ex.prefill_slots(..., processing=rows, prompt_logprobs={0: 5})   # processing runtimes:
    ex.prefill_logprobs, ex.prompt_logprobs     # the first draws' log-probs; prompt log-probs (CPU)
    ex.apply(update)                                            # the input batch's staged changes
    tokens = ex.decode_block(n, sampled=False)                  # [K, n]: K decode steps
    out = ex.spec_block(n, k=2, filtered=False)                 # BlockOutput: R rounds, k in spec_ks

Every call is a pure function of the runtime's slot state (model/slots.py) plus its arguments,
so a tensor-parallel driver can replay the same call on every rank: a single-GPU engine imports
nothing from graphrt/parallel/. Attributes the engine reads: config, k (decode steps per block),
steps (k's StepsPlan), device, num_pages, model, speculative (its SpeculativeConfig or None), rounds, spec_ks (the
proposal counts a speculative block may run: one graph family each; () without speculation).

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
from graphrt.model.processing import ProcessRows, drawn_from
from graphrt.model.sampling import SamplingInputs, sample_eager

log = logging.getLogger("graphrt.engine")


class LocalExecutor:
    """runtime: the ModelRuntime (the decode phase, the slots, the graph runner); spec: a
    SpeculativeRunner attached to it (speculative/runner.py), or None."""

    def __init__(self, runtime, spec=None):
        if spec is not None and spec.slots is not runtime.slots:
            raise ValueError("spec: the speculative runner must share the runtime's slots "
                             "(SpeculativeRunner.attach)")
        self.runtime, self.spec = runtime, spec
        self.prefill_logprobs = None     # (token [1, m], rank, top ids [1, m, N], top vals): the last prefill's
        self.prompt_logprobs: dict = {}  # {row: (logprob [T - 1], rank, ids, vals)} CPU, the last prefill's
        self._draft_stale: set[int] = set()   # slots whose draft K/V misses plain-block tokens
        self._draft_since = torch.zeros_like(runtime.slots.seq_lens)   # [B] their lengths then (device)

    # ---- what the engine reads ----------------------------------------------------------------
    config = property(lambda self: self.runtime.config)
    k = property(lambda self: self.runtime.k)
    steps = property(lambda self: self.runtime.steps)      # StepsPlan: K and why (model/steps.py)
    plan_seconds = property(lambda self: self.runtime.plan_seconds)   # {plan: host s} measured at capture
    measured_plans = property(lambda self: self.runtime.measured_plans)   # -> model/plans.py's dict
    device = property(lambda self: self.runtime.device)
    num_pages = property(lambda self: self.runtime.num_pages)
    model = property(lambda self: self.runtime.model)
    graphs = property(lambda self: self.runtime.graphs)
    lock = property(lambda self: self.runtime.lock)
    uses_graphs = property(lambda self: self.runtime.uses_graphs)
    speculative = property(lambda self: None if self.spec is None else self.spec.config)
    rounds = property(lambda self: 0 if self.spec is None else self.spec.rounds)
    processing = property(lambda self: self.runtime.processing)
    # constrained decoding: per-slot allowed-token masks read by the processed draws (model/token_mask.py)
    structured = property(lambda self: self.runtime.token_mask is not None)
    spec_logprobs = False        # speculative rounds do not record log-probabilities (yet)
    logprobs_width = property(lambda self: self.runtime.logprobs.width if self.runtime.processing else 0)
    spec_ks = property(lambda self: () if self.spec is None else self.spec.ks)
    # C > 0: a plain block may carry a prompt chunk of up to C tokens (model/mixed.py)
    mixed_tokens = property(lambda self: 0 if self.runtime.mixed is None else self.runtime.mixed.max_tokens)
    # a speculative phase whose proposer keeps per-slot device state of its own (a draft model's
    # K/V) has `draft` (with prefill) and `sync_draft(slots)`: it is caught up after plain blocks
    _proposer_state = property(lambda self: getattr(self.spec, "draft", None) is not None)
    history_width = property(lambda self: None if self.runtime.slots.history is None
                             else self.runtime.slots.history.shape[1])

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
                     len(spec), list(self.config.buckets), list(self.spec.ks),
                     sum(s.capture_ms + s.warmup_ms for s in spec), sum(s.graph_bytes for s in spec) / 2**20)
        return stats

    def prefill_graphed(self, new_tokens: int) -> bool:
        """Whether a target prefill of `new_tokens` new tokens (no prompt log-probs) runs through
        the runtime's prefill graphs (ModelRuntime.prefill_graphed): one replay per piece of one
        request, so separate calls cost no extra weight pass."""
        return self.runtime.prefill_graphed(new_tokens)

    def prefill(self, prompts: list[torch.Tensor], block_table: torch.Tensor, *, starts=None, after=None,
                defer_check: bool = False, proposer: bool = True, **record) -> torch.Tensor:
        """As ModelRuntime.prefill: [m, V] float32 last-token logits (prompts[i] from position
        starts[i], default 0): every target prefill goes through here (prefill_slots' too). For
        pieces of a context that draw nothing yet (a chunk) a proposer with K/V of its own
        follows: a draft model prefills the same positions; an EAGLE-3 head writes its K/V there
        from the target's recorded states, pairing each piece's last position with after[i] (host
        int, the context's next token). proposer=False: the target alone (prefill_slots, which
        runs the draft after its draws; an EAGLE-3 target's prefill records states: not here).
        record: ModelRuntime.prefill's on_logits / logits_rows (prompt log-probs). defer_check:
        as ModelRuntime.prefill's (the flags into `device_error_flag`)."""
        if not proposer:
            return self.runtime.prefill(prompts, block_table, starts=starts, defer_check=defer_check, **record)
        eagle = getattr(self.spec, "eagle", None)
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
        if self._proposer_state:
            self.spec.draft.prefill([to_device(p, self.device) for p in prompts], block_table, starts=starts)
        return logits

    @property
    def device_error_flag(self) -> torch.Tensor:
        """The target runtime's sticky device-guard flags ([1] int32, device): nonzero after a
        prepare or K/V-append kernel flagged bad inputs (check_device_errors says which)."""
        return self.runtime.buffers.device_error

    def prefill_slots(self, prompts: list[torch.Tensor], block_table: torch.Tensor, slots: list[int],
                      sampling: SamplingInputs, *, processing: ProcessRows | None = None,
                      prompt_logprobs: dict[int, int] | None = None, starts=None,
                      sources: list[int] | None = None, copies: list[tuple[int, int]] = (),
                      defer_check: bool = False, draft: bool = True) -> torch.Tensor:
        """Prefill each prompt (row i of block_table, from position starts[i], default 0), draw
        each slot's next token with sampling's row i (its step is not advanced) from the last
        logits of prompt sources[i] (default: slot i's own prompt, i < m) and write it as the
        slot's current token (and into its token history at index start + len(prompt)). copies:
        (src, dst) KV pages copied after the prefill, in every layer (n > 1: a sample's copy of
        the prompt's partial last page). With a draft model, the draft's caches are prefilled
        over the same positions (and copied) too; with an EAGLE-3 head, the target's prefill
        records its hidden states and the head's prefill makes the slots' first proposals (no
        sources with EAGLE-3). Either proposer's K/V below starts[i] is what the pages hold (a
        cached prefix: its writer's; an earlier chunk: this request's); it changes only how many
        proposals are accepted, never a token. Returns the [s] int64 first tokens (device).

        processing (a processing runtime): the slots' processing rows are reset to it first and
        the first draws are processed, counted and their log-probabilities kept in
        `prefill_logprobs` (device views); prompt_logprobs {row i: n}: those rows' prompt
        log-probabilities into `prompt_logprobs` (CPU, synchronous; whole prompts only).
        defer_check: the target's prefill as ModelRuntime.prefill's (an EAGLE-3 target's too).
        draft=False (a draft model, no sources or copies): the draft's prefill is left out and
        the slots are marked stale from their start (the policy starts them on plain decode: a
        later speculative block catches the draft up from there, as after plain blocks; a
        request that never speculates never runs its draft)."""
        want = dict(prompt_logprobs or {})
        collect = PromptLogprobs(prompts, want) if want else None
        extra = {"on_logits": collect, "logits_rows": frozenset(want)} if collect is not None else {}
        if starts is not None and any(starts):
            if want:
                raise ValueError("starts: prompt_logprobs need the whole prompt prefilled")
            extra["starts"] = starts
        eagle = getattr(self.spec, "eagle", None)
        if eagle is not None and sources is not None:
            raise ValueError("sources: an EAGLE-3 head prefills every sample's prompt (no shared prefill)")
        defer = {"defer_check": True} if defer_check else {}   # the K/V flags read with the block
        if eagle is not None:
            logits, hidden = eagle.target_prefill(self.runtime, prompts, block_table, **extra, **defer)
        else:
            logits = self.prefill(prompts, block_table, proposer=False, **extra, **defer)   # the draft's: below
        self.prompt_logprobs = {i: collect.result(i) for i in want} if collect is not None else {}
        st, dev = self.runtime.slots, self.device
        if sources is not None:
            logits = logits.index_select(0, tensor_on(sources, torch.long, logits.device))   # [s, V]
        idx = tensor_on(slots, torch.long, dev)
        if processing is not None:
            if st.proc is None:
                raise ValueError("processing: this runtime was built with processing=False")
            st.proc.write_rows(idx, processing)
            temp, step = to_device(sampling.temperature, dev), to_device(sampling.step, dev)
            x = st.proc.process(logits, idx, step, temp)
            self.runtime.token_mask.apply(x, idx)                        # constrained rows' first draws
            first = sample_eager(x, sampling)                            # [m] device
            src = logits if self.runtime.logprobs_mode == "raw" else \
                drawn_from(x, temp, to_device(sampling.top_k, dev), to_device(sampling.top_p, dev))
            self.prefill_logprobs = tuple(t[None] for t in token_logprobs(src, first, self.logprobs_width))
            st.proc.count(idx, first, torch.ones_like(first, dtype=torch.bool))
        else:
            first = sample_eager(logits, sampling)                       # [m] device
        st.tokens.index_copy_(0, idx, first)
        src = sources if sources is not None else range(len(slots))
        if st.history is not None:
            base = starts if starts is not None else [0] * len(prompts)
            at = tensor_on([s * st.history.shape[1] + base[j] + prompts[j].numel() for s, j in zip(slots, src)],
                           torch.long, dev)
            st.history.view(-1).index_copy_(0, at, first.to(torch.int32))
        draft_model = self.spec.draft if self._proposer_state else None
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
        return first

    def apply(self, update) -> None:
        """An input batch's staged changes into the slots (SlotState.apply)."""
        self.runtime.slots.apply(update)

    def decode_block(self, n: int, *, sampled: bool, processed: bool = False,
                     filtered: bool = True, chunk: bool = False, steps: int | None = None) -> torch.Tensor:
        """K decode steps over slots [0, n) -> [K, n] int64 (a view, valid until the next block);
        processed: the logits-processing graph (then `block_logprobs(n)` holds the block's), with
        steps=1 a one-step block ([1, n]: constrained rows, whose masks change every token);
        filtered (with processed): some row uses top-k / top-p; chunk: the block's first step
        also prefills the prompt chunk staged by `stage_chunk` (not with processed)."""
        if chunk:
            return self.runtime.decode_slots(n, sampled=sampled, chunk=True)
        if self._proposer_state:
            fresh = [s for s in range(n) if s not in self._draft_stale]
            if fresh and self.spec.draft is not None:    # where each slot's draft K/V stops (device)
                lens = self.runtime.slots.seq_lens
                if len(fresh) == n:                      # after a spec block: no host tensor (a
                    self._draft_since[:n].copy_(lens[:n])   # pageable copy would wait for the stream)
                else:
                    idx = torch.tensor(fresh, dtype=torch.long, device=self.device)
                    self._draft_since.index_copy_(0, idx, lens.index_select(0, idx))
            self._draft_stale.update(range(n))
        if processed:
            return self.runtime.decode_slots(n, sampled=True, processed=True, filtered=filtered, steps=steps)
        return self.runtime.decode_slots(n, sampled=sampled)

    def write_processing(self, slots: list[int], rows: ProcessRows) -> None:
        """Reset the logits-processing rows of `slots` to `rows` (a processing runtime; what
        prefill_slots writes for the slots it prefills): for a row that starts decoding without a
        prefill of its own (a prompt's last piece carried by a decode block)."""
        st = self.runtime.slots
        if st.proc is None:
            raise ValueError("processing: this runtime was built with processing=False")
        st.proc.write_rows(tensor_on(slots, torch.long, self.device), rows)

    def write_token_mask(self, slots: list[int], bits: torch.Tensor, active: torch.Tensor) -> None:
        """The allowed-token masks of `slots` (bits [m, W] int32, active [m] int32, CPU; TokenMask.write),
        read by the next draws of those slots (a prefill's first draw, the processed blocks)."""
        if self.runtime.token_mask is None:
            raise ValueError("structured_outputs: this runtime was built with processing=False")
        self.runtime.token_mask.write(slots, bits, active)

    def stage_chunk(self, slot: int, tokens: torch.Tensor, start: int, *, table_row=None) -> None:
        """The next `decode_block(..., chunk=True)` also prefills `tokens` (CPU [m] int64, m <=
        mixed_tokens) at positions [start, start + m) of `slot` (ModelRuntime.stage_chunk:
        ValueError names the field)."""
        self.runtime.stage_chunk(slot, tokens, start, table_row=table_row)

    def block_logprobs(self, n: int):
        """The last processed block's log-probabilities: (token [K, n], rank, ids [K, n, N], vals)."""
        return self.runtime.logprobs.view(n)

    def spec_block(self, n: int, *, k: int | None = None, filtered: bool = False, processed: bool = False,
                   sync_draft: bool = True):
        """R speculative rounds with k proposals a round (one of spec_ks; default the configured
        num_tokens) over slots [0, n) -> BlockOutput views (speculative/runner.py); filtered:
        some slot uses top_k / top_p; processed: some slot needs logits processing. sync_draft=False:
        no catch-up of stale draft K/V first (they stay stale: the draft proposes from what it
        has, which acceptance keeps exact; for a block whose rows are at their limit)."""
        if self.spec is None:
            raise ValueError("spec_block: this executor was built without speculation")
        if self._draft_stale and sync_draft:
            stale = sorted(s for s in self._draft_stale if s < n)
            self.spec.sync_draft(stale, since=self._draft_since)
            self._draft_stale.difference_update(stale)
        return self.spec.run(n, k=k, filtered=filtered, processed=processed)

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
        return StepCosts(decode_us=decode, verify_us=verify)

    def check_device_errors(self) -> None:
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
