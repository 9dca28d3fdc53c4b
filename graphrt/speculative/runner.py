"""Speculative decoding rounds on the device: propose -> verify -> accept -> advance, R per block.

    runner = SpeculativeRunner.attach(mrt, SpeculativeConfig(num_tokens=4), rounds=4)  # engine
    out = runner.run(n)                     # BlockOutput: [R, n, k+1] tokens, [R, n] counts

    runner = SpeculativeRunner(model, kv_caches, SpeculativeConfig(num_tokens=4),
                               buckets=(1, 2, 4), max_len=512, page_size=16, rounds=4)  # standalone
    runner.set_slot(0, prompt + [first_token], limit=len(prompt) + max_tokens,
                    block_table=row)        # after the target's prefill of `prompt`
    runner.capture()                        # CUDA: one graph per (bucket, k in runner.ks)
    out = runner.run(n, k=2)                # a block at a smaller k (the policy's choice)

A block of R rounds is a pure device function of the per-slot state (model/slots.py: token
history, tokens held, limit, block table, sampling rows, per-slot k) and this phase's scratch
(buffers.py). `attach` shares a ModelRuntime's slots, graph runner (one pool, one capture
set-up: attention/graphs.py) and device-error flags, so the executor's input batch is what the
rounds read and the decode graphs and the rounds advance one state; the standalone constructor
allocates the same objects for itself. Each round: the n-gram kernel (or a DraftProposer,
draft.py) proposes from each slot's token history, or an EAGLE-3 head's phase (eagle3/phase.py)
hands over the proposals it drafted after the previous round; one launch lays out the verify's
inputs (prologue.py: the slot's cap on k, the current token + proposals, cache lengths, the
proposals counted); the target verifies k + 1 tokens
per slot in one forward (`model.verify_step`; with EAGLE-3 it records its hidden states, and
after acceptance the head drafts the next round's proposals from them), `judge` + `advance`
accept and write the emitted tokens into
the history and move the tokens held and the draw index; at the end of the block each slot's
current token is refreshed for the decode graphs. A processed block (logits processing) also
records each emitted token's log-probability, rank and top N from its verified position's
logits (model/logprobs.py's rule, the one plain decoding's processed graphs use: the raw
logits, or with logprobs_mode "processed" the distribution drawn from), so a request's
log-probs are plain decoding's whether or not it speculates. The host reads `out`/`emitted` after the block
(the engine asynchronously) and applies stop ids, stop strings and EOS; max_tokens is exact on
the device (a slot never holds more than `limit` tokens). K/V written for rejected proposals lies
past the slot's length and is overwritten by the next round. The rounds' kernels (n-gram lookup,
round inputs, acceptance, advance) are the target model's kernel set's (speculative/ops.py):
Triton's, or their torch references on a model that runs the torch set (a CPU's default).

Several k per bucket: `ks` (default `capture_ks(num_tokens)`: 1, 2, 4, 8 up to k, and k) are the
proposal counts a block may run, one graph family per k (query length k + 1, scratch per k), so
the speculation policy can step a batch's k down or up between blocks; plain decode (k = 0) is
the ModelRuntime's graph. With a draft model, a slot that ran plain decode blocks has no draft
K/V for the tokens it drew there: `sync_draft(slots)` re-prefills the draft over each such
slot's tokens (eager, one host read of the lengths) before its next speculative block.
"""
from __future__ import annotations

from typing import NamedTuple

import torch

from graphrt.attention.buckets import pick_bucket
from graphrt.attention.graphs import GraphKey, GraphRunner
from graphrt.kernels.mq_launch import default_splits
from graphrt.model.draw import Draw
from graphrt.model.processing import drawn_from
from graphrt.model.slots import SlotState
from graphrt.speculative.buffers import SpecBuffers
from graphrt.speculative.config import SpeculativeConfig
from graphrt.speculative.draft import DraftProposer
from graphrt.speculative.ops import spec_ops


def capture_ks(k: int) -> tuple[int, ...]:
    """The proposal counts captured for a configured k: powers of two below k, and k itself
    (k = 4 -> (1, 2, 4); k = 6 -> (1, 2, 4, 6)): at most 5 graph families per bucket."""
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"k: must be an int >= 1, got {k!r}")
    return tuple(sorted({1 << i for i in range(4) if 1 << i < k} | {k}))


class BlockOutput(NamedTuple):
    """Views of one block's outputs (valid until the next run), n slots: tokens [R, n, k + 1]
    int64 (-1 past each round's emitted tokens), emitted [R, n] int32, proposed [R, n] int32;
    logprobs (processed blocks of a runner with a log-prob width, else None): (token [R, n, k + 1]
    float32, rank [R, n, k + 1] int32, top ids [R, n, k + 1, N] int64, top values [R, n, k + 1, N]
    float32) of each round's tokens (entries past the emitted ones unread); argmax (a one-round
    block with grammar-checked proposals, else None): [n, k + 1] int64, each verified position's
    argmax before masks and processing."""
    tokens: torch.Tensor
    emitted: torch.Tensor
    proposed: torch.Tensor
    logprobs: tuple | None = None
    argmax: torch.Tensor | None = None


class SpeculativeRunner:
    """model: a LlamaDecoder; kv_caches: its per-layer PagedKVCache list (holding the prefilled
    prompts); buckets: sorted batch sizes captured; max_len: token-history width (>= the longest
    limit + k); page_size / max_pages: the block-table geometry; rounds: R per block; draft: a
    DraftProposer for method "draft"; eagle: an Eagle3Phase for method "eagle3" (its prefill,
    `Eagle3Phase.prefill`, makes a slot's first proposals: LocalExecutor.prefill_slots; it drafts
    num_tokens a round, so ks is (num_tokens,)); filtered: support per-slot top_k / top_p (a
    second graph per bucket and k whose acceptance draws from the sampler's kept set,
    `judge(top_k=, top_p=)`: a sort per verified row; run with run(n, filtered=True); off: slots
    must not use them); ks: the proposal counts a block may run (each <= config.num_tokens,
    which is always included; default capture_ks); logprobs_width: the N alternatives a processed
    block records per emitted token (0: none; needs slots with processing rows); logprobs_mode:
    "raw" (of the model's logits) or "processed" (of the distribution drawn from), as the
    ModelRuntime's.
    slots / graphs / device_error: shared state (see `attach`); allocated here when None."""

    def __init__(self, model, kv_caches, config: SpeculativeConfig, *, buckets, max_len: int,
                 page_size: int, max_pages: int | None = None, rounds: int = 1, device=None,
                 splits: int | None = None, draft: DraftProposer | None = None,
                 filtered: bool = False, slots: SlotState | None = None,
                 graphs: GraphRunner | None = None, device_error: torch.Tensor | None = None,
                 eagle=None, ks=None, logprobs_width: int = 0, logprobs_mode: str = "raw", mask=None):
        if not isinstance(config, SpeculativeConfig):
            raise TypeError(f"config: expected a SpeculativeConfig, got {type(config).__name__}")
        if (config.method == "eagle3") != (eagle is not None):
            raise ValueError(f"eagle: method {config.method!r} needs "
                             f"{'an Eagle3Phase' if config.method == 'eagle3' else 'no eagle'}, "
                             f"got {type(eagle).__name__}")
        if eagle is not None and eagle.k != config.num_tokens:
            raise ValueError(f"eagle: k={eagle.k}; expected num_tokens={config.num_tokens}")
        self.eagle = eagle
        if (config.method == "draft") != (draft is not None):
            raise ValueError(f"draft: method {config.method!r} needs "
                             f"{'a DraftProposer' if config.method == 'draft' else 'no draft'}, "
                             f"got {type(draft).__name__}")
        if draft is not None and (draft.k != config.num_tokens
                                  or draft.vocab_size != model.spec.vocab_size):
            raise ValueError(f"draft: k={draft.k}, vocab {draft.vocab_size}; expected "
                             f"num_tokens={config.num_tokens}, the target's vocab {model.spec.vocab_size}")
        if not isinstance(filtered, bool):
            raise TypeError(f"filtered: expected a bool, got {filtered!r}")
        self.draft, self.filtered = draft, filtered
        buckets = tuple(buckets)
        if not buckets or list(buckets) != sorted(set(buckets)) or buckets[0] < 1:
            raise ValueError(f"buckets: expected sorted distinct ints >= 1, got {buckets}")
        for name, val in (("max_len", max_len), ("page_size", page_size), ("rounds", rounds)):
            if isinstance(val, bool) or not isinstance(val, int) or val < 1:
                raise ValueError(f"{name}: must be an int >= 1, got {val!r}")
        self.model, self.kv_caches, self.config = model, kv_caches, config
        self.spec = spec_ops(model.kernels)          # the rounds' kernels: the target's kernel set's
        self.buckets, self.rounds, self.page_size = buckets, rounds, page_size
        self.max_pages = max_pages or -(-(max_len + config.num_tokens) // page_size)
        self.device = torch.device(device) if device is not None else kv_caches[0].device
        if slots is None:
            slots = SlotState.allocate(buckets[-1], self.max_pages, self.device, history_width=max_len)
        if slots.history is None or slots.max_batch < buckets[-1] \
                or slots.block_table.shape[1] != self.max_pages:
            raise ValueError(f"slots: need a token history, >= {buckets[-1]} rows and "
                             f"{self.max_pages} block-table columns")
        self.slots = slots
        if isinstance(logprobs_width, bool) or not isinstance(logprobs_width, int) or logprobs_width < 0:
            raise ValueError(f"logprobs_width: must be an int >= 0, got {logprobs_width!r}")
        if logprobs_width and slots.proc is None:
            raise ValueError(f"logprobs_width: {logprobs_width} needs slots with processing rows "
                             "(log-probs are recorded by processed blocks)")
        if logprobs_mode not in ("raw", "processed"):
            raise ValueError(f"logprobs_mode: expected 'raw' or 'processed', got {logprobs_mode!r}")
        self.logprobs_mode = logprobs_mode
        self.graphs = graphs if graphs is not None else GraphRunner(self.device)
        self.device_error = (device_error if device_error is not None else
                             torch.zeros(1, dtype=torch.int32, device=self.device))
        kmax = config.num_tokens
        if eagle is not None:                # the head drafts exactly num_tokens a round
            if ks is not None and tuple(ks) != (kmax,):
                raise ValueError(f"ks: an EAGLE-3 head runs k = num_tokens = {kmax} only, got {ks}")
            ks = (kmax,)
        ks = capture_ks(kmax) if ks is None else tuple(sorted(set(ks) | {kmax}))
        if any(isinstance(x, bool) or not isinstance(x, int) or not 1 <= x <= kmax for x in ks):
            raise ValueError(f"ks: expected ints in [1, num_tokens={kmax}], got {ks}")
        self.ks = ks
        self.bufs = {x: SpecBuffers.allocate(buckets[-1], x, rounds, self.device, logprobs_width=logprobs_width)
                     for x in ks}
        # constrained rows (grammar-checked proposals): the slots' allowed-token masks at every
        # verified position (model/token_mask.py), applied in processed rounds; n-gram proposals
        # only (the engine predicts them on the host: `grammar`)
        if mask is not None and mask.positions < kmax + 1:
            raise ValueError(f"mask: {mask.positions} positions a slot, a round verifies up to {kmax + 1}")
        self.mask = mask if config.method == "ngram" else None
        hkv = model.local_spec.num_kv_heads
        self.splits = {b: splits or default_splits(self.device, b, hkv, max_len) for b in buckets}

    @classmethod
    def attach(cls, mrt, config: SpeculativeConfig, *, rounds: int = 1,
               draft: DraftProposer | None = None, filtered: bool = False,
               splits: int | None = None, eagle=None, ks=None) -> "SpeculativeRunner":
        """The rounds over a ModelRuntime's own slots (built with token_history=True), graph
        runner and device-error flags: the phase the engine runs beside the decode graphs; with
        n-gram proposals and a runtime whose token masks hold 1 + num_tokens positions
        (ModelRuntime(mask_positions=...)), its masks too (`grammar`)."""
        c = mrt.config
        if mrt.slots.history is None:
            raise ValueError("mrt: build the ModelRuntime with token_history=True for speculation")
        return cls(mrt.model, mrt.kv_caches, config, buckets=c.buckets,
                   max_len=mrt.slots.history.shape[1], page_size=c.page_size,
                   max_pages=c.max_pages_per_seq, rounds=rounds, device=mrt.device, splits=splits,
                   draft=draft, filtered=filtered, slots=mrt.slots, graphs=mrt.graphs,
                   device_error=mrt.buffers.device_error, eagle=eagle, ks=ks,
                   logprobs_width=mrt.logprobs.width if mrt.processing else 0, logprobs_mode=mrt.logprobs_mode,
                   mask=mrt.token_mask if mrt.token_mask is not None
                   and mrt.token_mask.positions > config.num_tokens else None)

    @property
    def grammar(self) -> bool:
        """Whether blocks may hold constrained rows: n-gram proposals (a pure function of the
        slot's tokens, so the host predicts them and caps the slot's k at the first one its grammar
        refuses) verified under the slots' masks at every position, in one-round blocks
        (run(rounds=1): the host must see each round's tokens before the next masks exist)."""
        return self.mask is not None

    @property
    def width(self) -> int:
        """Token-history width: a slot's limit + k must fit."""
        return self.slots.history.shape[1]

    # ---- host side: slots ---------------------------------------------------------------------
    def set_slot(self, slot: int, tokens, *, limit: int, block_table: torch.Tensor,
                 temperature: float = 0.0, seed: int = 0, step: int = 0, top_k: int = 0,
                 top_p: float = 1.0, append: torch.Tensor | None = None) -> None:
        """Admit a request into `slot`: tokens = prompt + tokens generated so far (then `append`,
        a one-element device tensor such as the prefill's sampled first token, copied on the
        device without a sync); the K/V of all but the last token must be in the cache.
        limit = prompt + max_tokens, block_table [w] int32 with pages for positions
        < limit + k - 1. temperature 0 = greedy; seed / step: the request's Philox key and draw
        index (tokens it has sampled so far); top_k / top_p: as SamplingParams (runners built
        with filtered=True only)."""
        st, k = self.slots, self.config.num_tokens
        if isinstance(slot, bool) or not isinstance(slot, int) or not 0 <= slot < st.max_batch:
            raise ValueError(f"slot: must be an int in [0, {st.max_batch}), got {slot!r}")
        tokens = torch.as_tensor(tokens, dtype=torch.int32).reshape(-1)
        extra = 0 if append is None else append.numel()
        if extra not in (0, 1):
            raise ValueError(f"append: expected one token, got {extra}")
        n = tokens.numel() + extra
        least = 2 if self.draft is not None else 1     # the draft re-reads the last two tokens
        if n < least or not n <= limit:
            raise ValueError(f"tokens: need {least} <= len(tokens)={n} <= limit={limit}")
        rope = getattr(self.model, "max_positions", None)
        if rope is not None and limit + k - 1 > rope:
            raise ValueError(f"limit: {limit} + num_tokens {k} - 1 positions exceed the model's "
                             f"max_positions={rope}")
        if limit + k > self.width:
            raise ValueError(f"limit: {limit} + num_tokens {k} exceeds the token buffer's max_len="
                             f"{self.width}")
        if block_table.dim() != 1 or block_table.dtype != torch.int32 \
                or block_table.numel() * self.page_size < limit + k - 1 \
                or block_table.numel() > self.max_pages:
            raise ValueError(f"block_table: expected [w <= {self.max_pages}] int32 covering "
                             f"{limit + k - 1} positions, got {tuple(block_table.shape)} {block_table.dtype}")
        if not temperature >= 0.0:
            raise ValueError(f"temperature: must be >= 0, got {temperature}")
        if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 0:
            raise ValueError(f"top_k: must be an int >= 0, got {top_k!r}")
        if not 0.0 < top_p <= 1.0:
            raise ValueError(f"top_p: must be in (0, 1], got {top_p}")
        if not self.filtered and (top_k > 0 or top_p < 1.0):
            raise ValueError(f"top_k, top_p: {top_k}, {top_p} need a runner built with filtered=True")
        st.apply(st.row_update(slot, seq_len=n, limit=limit, step=int(step), top_k=top_k, spec_k=k,
                               temperature=float(temperature), top_p=float(top_p), seed=int(seed),
                               block_table=block_table, history=tokens, append=append))

    def clear_slot(self, slot: int) -> None:
        """Empty a slot (finished or aborted request): it emits nothing and writes no K/V."""
        self.slots.apply(self.slots.row_update(slot))

    def slot_tokens(self, slot: int) -> list[int]:
        """The slot's tokens (prompt + output) read back to the host (a sync; tests, debugging)."""
        n = int(self.slots.seq_lens[slot])
        return self.slots.history[slot, :n].tolist()

    # ---- device side: the block of R rounds ----------------------------------------------------
    def _round(self, size: int, r: int, k: int, how: Draw, *, last: bool, grammar: bool = False) -> None:
        """Round r of a block: propose, verify, accept (model/draw.py's Draw: how.processed, the
        slots' logits processing per verified position; how.filtered, acceptance within the
        sampler's kept set of top_k / top_p). grammar: a one-round block over constrained rows
        (their masks applied), whose argmax before the masks is kept (SpecBuffers.argmax)."""
        c, st, v = self.config, self.slots, self.bufs[k].view(size)
        num, limit, hist, step = st.seq_lens[:size], st.limit[:size], st.history[:size], st.step[:size]
        temperature = st.temperature[:size]
        table = st.block_table[:size]
        proposals = v.proposals
        if self.eagle is not None:                                   # made by the previous round
            proposals = self.eagle.proposals_of(size)                # read in place, k each
        elif self.draft is not None:
            self.draft.propose(hist, num, limit, table, v.proposals, v.count, self.device_error)
        else:
            self.spec.ngram_propose(hist, num, v.proposals, v.count, min_n=c.ngram_min, max_n=c.ngram_max)
        # count capped by the slot's own k, tokens [B, k + 1] (the current token, then the
        # proposals), cache_lens (-1: inactive), proposed[r]: one launch (speculative/prologue.py)
        tokens, cache_lens = self.spec.round_inputs(hist, num, limit, st.spec_k[:size], proposals, v.count,
                                                    v.proposed[r], full=self.eagle is not None)
        record = self.eagle.verify_kwargs(size) if self.eagle is not None else {}
        logits = self.model.verify_step(tokens, cache_lens, self.kv_caches, table, self.device_error,
                                        splits=self.splits[size], **record)   # [B * (k + 1), V]
        if how.processed and self.mask is not None:   # constrained rows: each position's mask
            if grammar:                               # the model's own choice, before the mask
                self.model.ops.argmax_into(logits, v.argmax.reshape(-1))
            self.mask.apply_verify(logits, size, k, ops=self.model.ops)
        raw = logits
        if how.processed:                     # the slots' logits processing, per verified position
            logits = st.proc.process_verify(logits, size, proposals, step, temperature, ops=self.model.ops)
        kept = dict(top_k=st.top_k[:size], top_p=st.top_p[:size]) if how.filtered else {}
        self.spec.judge(logits, proposals, v.count, temperature, st.seed[:size], step, v.accept, v.fallback,
                        **kept)                                                # the sampler's kept set
        # the last round's advance: the decode graphs' input, each slot's current token
        self.spec.advance(v.accept, v.fallback, proposals, hist, num, limit, step, v.out_tokens[r], v.emitted[r],
                          current=st.tokens[:size] if last else None)
        if how.processed:                     # the emitted tokens counted for the penalties
            out = v.out_tokens[r]                                    # [B, Q], -1 past the emitted
            st.proc.counts[:size].scatter_add_(1, out.clamp_min(0), (out >= 0).to(torch.int32))
            if v.logprobs is not None:        # each emitted token's log-probs at its position
                self._record_logprobs(v.logprobs, r, raw, logits, out, size, how)
        if self.eagle is not None:                                   # the next round's proposals
            self.eagle.after(size, v.out_tokens[r], v.emitted[r], cache_lens, table, self.device_error)

    def _block(self, size: int, k: int, how: Draw, rounds: int | None = None) -> None:
        rounds = self.rounds if rounds is None else rounds
        grammar = rounds == 1 and how.processed and self.grammar      # a block of constrained rows
        for r in range(rounds):               # the last round's advance leaves each slot's current
            self._round(size, r, k, how, last=r == rounds - 1, grammar=grammar)   # token where decode reads it

    def _record_logprobs(self, lp, r: int, raw: torch.Tensor, processed: torch.Tensor, out: torch.Tensor,
                         size: int, how: Draw) -> None:
        """Round r's log-probs into lp (LogprobBuffers, rows b * Q + j): of raw [size * Q, V]
        (model dtype; mode "raw") or of the distribution drawn from (processed [size * Q, V]
        float32 / temperature within the kept set: model/processing.py drawn_from), at the
        emitted tokens out [size, Q] (-1 past them: recorded at token 0, unread)."""
        q = out.shape[1]
        src = raw
        if self.logprobs_mode == "processed":
            st = self.slots
            rep = lambda t: t[:size].repeat_interleave(q)
            off_k = torch.zeros_like(st.top_k[:size]) if not how.filtered else st.top_k[:size]
            off_p = torch.ones_like(st.top_p[:size]) if not how.filtered else st.top_p[:size]
            src = drawn_from(processed, rep(st.temperature), rep(off_k), rep(off_p), ops=self.model.ops)
        lp.record(r, size * q, src, out.reshape(size * q).clamp_min(0), ops=self.model.ops)


    def _key(self, size: int, k: int, how: Draw, rounds: int) -> GraphKey:
        return GraphKey("spec", size, query_len=k + 1, steps=rounds, sampled=True,
                        filtered=how.filtered, processed=how.processed)

    def capture(self) -> None:
        """Capture one graph of R rounds per (bucket, k in ks, filtered variant) (CUDA only;
        no-op elsewhere) through the graph runner, largest first; with an EAGLE-3 head, its
        eager prompt pass is compiled and its first-draft graphs captured first
        (Eagle3Phase.capture). The warm-up runs on empty slots, so it writes no K/V and emits
        nothing; the slots' state is restored around it."""
        st = self.slots
        if self.eagle is not None:                # the head's eager prompt pass compiled, its
            self.eagle.capture(st.block_table, self.device_error)    # first-draft graphs captured
        if self.draft is not None:                                   # its prompts: one replay a piece
            self.draft.capture(self.graphs)
        scratch = list(self.kv_caches) + (list(self.draft.kv_caches) if self.draft else []) \
            + ([self.eagle.kv_cache] if self.eagle is not None else [])
        # (rounds, k) families: R rounds at every k; with constrained rows (`grammar`), one round
        # at num_tokens, processed only (a constrained row is processed)
        families = [(self.rounds, k, p) for k in reversed(self.ks)
                    for p in ((False, True) if st.proc is not None else (False,))]
        if self.grammar and self.rounds > 1:
            families.append((1, self.config.num_tokens, True))
        for size in reversed(self.buckets):
            for rounds, k, processed in families:
                for filtered in (False, True) if self.filtered else (False,):
                    how = Draw(sampled=True, processed=processed, filtered=filtered)
                    key = self._key(size, k, how, rounds)
                    if key not in self.graphs:
                        kept = [(self.eagle.proposals[:size], 0)] if self.eagle is not None else []
                        self.graphs.capture(
                            key, lambda s=size, q=k, d=how, r=rounds: self._block(s, q, d, r),
                            inputs=[(st.seq_lens[:size], 0), (st.limit[:size], 0),
                                    (st.tokens[:size], 0)] + kept, scratch=scratch)

    def run(self, n: int, *, k: int | None = None, filtered: bool | None = None,
            processed: bool = False, rounds: int | None = None) -> BlockOutput:
        """One block of R rounds with k proposals a round (one of `ks`; default num_tokens)
        over slots [0, n) (the smallest bucket >= n; slots past n in it must be empty).
        filtered: apply the slots' top_k / top_p (default: whether the runner supports them);
        processed: the slots' logits processing (model/processing.py) on the verified
        positions, emitted tokens counted (slots with processing rows only; with `grammar`, the
        constrained rows' masks first). rounds: None (R), or 1 with `grammar` (processed, k =
        num_tokens: a block holding constrained rows). Returns a BlockOutput of views (tokens
        [rounds, n, k + 1]; valid until the next run)."""
        if processed and self.slots.proc is None:
            raise ValueError("processed: these slots have no logits-processing rows")
        rounds = self.rounds if rounds is None else rounds
        if rounds != self.rounds and (rounds != 1 or not self.grammar or not processed
                                      or (k is not None and k != self.config.num_tokens)):
            raise ValueError(f"rounds: {self.rounds} (R), or 1 for a processed block at k = num_tokens with "
                             f"grammar-checked proposals (n-gram, masks of {self.config.num_tokens + 1} "
                             f"positions), got {rounds!r}")
        if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= self.buckets[-1]:
            raise ValueError(f"n: must be an int in [1, {self.buckets[-1]}], got {n!r}")
        k = self.config.num_tokens if k is None else k
        if k not in self.ks:
            raise ValueError(f"k: {k!r} is not one of the captured proposal counts {self.ks}")
        filtered = self.filtered if filtered is None else filtered
        if filtered and not self.filtered:
            raise ValueError("filtered: this runner was built with filtered=False")
        size = pick_bucket(list(self.buckets), n)
        how = Draw(sampled=True, processed=processed, filtered=filtered)
        self.graphs.run(self._key(size, k, how, rounds), lambda: self._block(size, k, how, rounds))
        b = self.bufs[k]
        lp = None
        if processed and b.logprobs is not None:          # rows b * Q + j -> [rounds, n, Q(, N)]
            q = k + 1
            lp = tuple(t[:rounds, :size * q].unflatten(1, (size, q))[:, :n] for t in b.logprobs.view(size * q))
        best = b.argmax[:n] if rounds == 1 and processed and self.grammar else None
        return BlockOutput(b.out_tokens[:rounds, :n], b.emitted[:rounds, :n], b.proposed[:rounds, :n], lp, best)

    def sync_draft(self, slots, since: torch.Tensor | None = None) -> None:
        """Catch the draft's K/V up over each slot's tokens but the current one (eager; reads the
        slots' lengths to the host once): after plain decode blocks, which run only the target,
        the draft holds no K/V for the tokens drawn there. since: [B] int32 device, each slot's
        length when its plain blocks began (the draft then held K/V below since - 2, the
        invariant of a round): only positions from there are written; None (or a draft without
        prefill attention): the whole context. Empty slots are skipped."""
        if self.draft is None or not slots:
            return
        st = self.slots
        idx = torch.tensor(list(slots), dtype=torch.long, device=self.device)
        lens = st.seq_lens.index_select(0, idx)
        if since is None or self.draft.attention is None:
            rows_lens, froms = lens.tolist(), [0] * len(slots)                  # host read (a sync)
        else:
            rows_lens, froms = torch.stack([lens, since.index_select(0, idx).to(lens.dtype)]).tolist()
        keep = [(s, n, max(0, min(d - 2, n - 1))) for s, n, d in zip(slots, rows_lens, froms) if n >= 2]
        keep = [(s, n, a) for s, n, a in keep if a < n - 1]
        if not keep:
            return
        rows = torch.tensor([s for s, _, _ in keep], dtype=torch.long, device=self.device)
        prompts = [st.history[s, a: n - 1].long() for s, n, a in keep]
        starts = [a for _, _, a in keep]
        self.draft.prefill(prompts, st.block_table.index_select(0, rows),
                           starts=starts if any(starts) else None)


__all__ = ["SpeculativeRunner", "BlockOutput", "capture_ks"]
