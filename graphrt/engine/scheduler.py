"""Admission, decode slots, KV growth and preemption, and what each generated token does.

Host-only decisions (the engine runs the device work; kv_manager.py counts pages). The scheduler
writes no slot state: each change to a slot's device row (pages, activation, deactivation,
current token, history, processing row) is recorded as a worker/changes.py record in `changes`,
and the next launch carries what was recorded since the last one (`take_changes`; a block's
`Launch.changes`), for the executor to apply before it runs the launch:
- Blocks: K decode steps (K tokens per row), or with speculation R rounds of k proposals (up
  to R * (k + 1) tokens per row, how many is known only when the block's counts are read).
- Admission (FIFO): a waiting request is admitted when a slot is free and the free pages cover
  its context (prompt, plus the tokens kept from before a preemption) and one block,
  with one block's growth left over for each running request. With the prefix cache the full
  pages of its context's longest cached prefix are shared instead of allocated (never the page
  of its last context token: at least one token is prefilled, for the first logits).
- Prefill (`prefill_work`, `prefilled`): an admitted request's context is prefilled from its
  first uncached token, in chunks: while some row decodes, at most `prefill_budget()` prompt
  tokens run between two decode blocks (max_num_batched_tokens, or the pacer's share of a
  decode block's time, engine/pacing.py; FIFO; a long prompt spans several steps);
  with no row decoding, everything admitted runs at once. A request decodes after its last
  chunk. Full pages are cached as they are written (prefill, then accepted decode tokens).
- Growth: before each block a row gets the pages its next block may write (`grow`): with
  speculation for R * (k + 1) positions past the most tokens it may hold (`launched` is then an
  upper bound, settled when the block's counts come back: `settle`). When the pool
  is short, the newest running request is preempted (pages freed, back to the head of the
  queue, in-flight tokens discarded) until the older rows fit; it is later prefilled again
  over prompt + the tokens it had accepted ("recompute") and continues with the same tokens.
- Slots: an admitted request keeps decode row `slot` until it finishes or is preempted; a
  block serves rows [0, max decoding slot]; other rows are padding (seq_len 0).
- Tokens: `accept` applies stop token ids / end-of-sequence / stop strings / max_tokens in order
  and discards whatever follows the stop inside a K-step block.
"""
from __future__ import annotations

import heapq
from collections import deque
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

from graphrt.engine.detokenizer import TextState
from graphrt.engine.kv_manager import KVCacheManager
from graphrt.engine.params import RequestOutput, SamplingParams
from graphrt.model.slots import PAD_PAGE
from graphrt.worker.changes import Activate, Deactivate, SetHistory, SetPages, SetProcessing, SetSpecK, SetToken


@dataclass(eq=False)
class Request:
    """A request's host state. launched: draws launched on the device, counted over the whole
    output (the prefill's draw, then K per block; with speculation the most a block may emit
    until its counts are read); token_ids: tokens accepted so far; epoch:
    bumped by each preemption (blocks launched before it are discarded for this request)."""

    request_id: str
    prompt: list[int]
    params: SamplingParams
    seed: int
    text: TextState
    sink: object                      # callable(RequestOutput delta)
    pages: list[int] = field(default_factory=list)
    slot: int = -1
    launched: int = 0
    token_ids: list[int] = field(default_factory=list)
    sent_ids: int = 0
    finish_reason: str | None = None
    epoch: int = 0
    admitted_at: int = -1             # admission order: the newest is preempted first
    preemptions: int = 0
    stop_ids: frozenset | None = None  # stop_token_ids + end-of-sequence ids (set on first use)
    # n > 1 (group.py): the first sample of the same prompt; at an admission in the same prefill
    # as it, `shares` is set to it (no prefill of our own) and `copy_page` to (its page, ours)
    sibling: "Request | None" = None
    shares: "Request | None" = None
    copy_page: tuple[int, int] | None = None
    rules: list | None = None         # token rules of its logits processing (engine/sampling_extras.py)
    prompt_lp: list | None = None     # prompt log-probs waiting for the first delta
    prefilling: bool = False          # admitted, context not all prefilled yet (no decode row)
    computed: int = 0                 # context tokens whose K/V are in `pages` (while prefilling)
    hashes: list = field(default_factory=list)   # prefix-cache keys of its full pages so far
    cached_pages: int = 0             # pages[:cached_pages] are in the prefix cache
    num_cached_tokens: int | None = None   # prompt tokens found cached at its first admission
    cumulative_logprob: float = 0.0   # sum of its delivered tokens' log-probs (with logprobs)
    prompt_array: np.ndarray | None = None   # [P] int64 host (read-only): the prompt's ids, converted once
    grammar: object = None            # constrained decoding: its matcher (engine/structured.py GrammarState)
    ngram: object = None              # ... under n-gram speculation: its proposals predicted (NgramIndex)

    @property
    def processed(self) -> bool:
        """Whether its draws need the logits-processing graphs: SamplingParams.processed, but for
        a constrained row decoding unmasked (engine/structured.py FreeRun)."""
        return self.params.processed and not (self.grammar is not None and self.grammar.unmasked)

    @property
    def context(self) -> list[int]:
        """What a prefill runs over: the prompt, plus the accepted tokens after a preemption."""
        return self.prompt + self.token_ids if self.token_ids else self.prompt

    @property
    def context_ids(self):
        """`context` as the prompt's int64 array where that is all of it ([P] int64, a prefill's
        inputs and the prefix cache's keys read it without converting ints), else the list."""
        if self.token_ids or self.prompt_array is None:
            return self.context
        return self.prompt_array


class _Joined:
    """prompt + token_ids as a sequence of ints for the prefix cache's page keys (len and slices:
    what PrefixCache.extend reads), without copying the whole context per block."""

    __slots__ = ("head", "tail")

    def __init__(self, head: list[int], tail: list[int]):
        self.head, self.tail = head, tail

    def __len__(self) -> int:
        return len(self.head) + len(self.tail)

    def __getitem__(self, s: slice) -> list[int]:
        n = len(self.head)
        if s.stop <= n:
            return self.head[s]
        if s.start >= n:
            return self.tail[s.start - n:s.stop - n]
        return self.head[s.start:] + self.tail[:s.stop - n]


class Launch(NamedTuple):
    """A block about to launch: rows [0, n) served; sampled: some row samples; filtered: some
    sampled row uses top_k / top_p; rows: (request, slot, epoch, draws counted) per row;
    processed: some row needs logits processing (SamplingParams.processed); changes: the slot
    changes recorded since the last launch (worker/changes.py), for the block to carry."""
    n: int
    sampled: bool
    filtered: bool
    rows: list
    processed: bool = False
    changes: tuple = ()


def _whole_prompt(req: Request) -> bool:
    """A first admission asking for prompt log-probs: prefilled whole (no cached prefix, no
    chunks), since every prompt position's logits are needed."""
    return getattr(req.params, "prompt_logprobs", None) is not None and not req.token_ids


class Scheduler:
    """Owns the KV cache manager, the waiting queue, the slots and the record of their changes."""

    def __init__(self, *, max_batch: int, page_size: int, max_pages_per_seq: int, num_pages: int,
                 steps_per_graph: int, eos_token_ids: tuple[int, ...], spec_k: int = 0, spec_rounds: int = 0, cache_seed: str | None = None,
                 max_num_batched_tokens: int | None = None):
        """cache_seed: turns the prefix cache on (it names the model, prefix_cache.py);
        max_num_batched_tokens: prompt tokens prefilled between two decode blocks while some
        row decodes (None: no limit)."""
        if max_num_batched_tokens is not None and (isinstance(max_num_batched_tokens, bool) or not
                                                   isinstance(max_num_batched_tokens, int) or max_num_batched_tokens < 1):
            raise ValueError(f"max_num_batched_tokens: must be None or an int >= 1, got {max_num_batched_tokens!r}")
        self.kv = KVCacheManager(pool_pages=num_pages + 1, page_size=page_size, cache_seed=cache_seed)
        self.max_num_batched_tokens = max_num_batched_tokens
        self.pacer = None                            # engine/pacing.py PrefillPacer, or None: the cap only
        self.prefilling: list[Request] = []          # admitted, prefill not finished (FIFO)
        self.forks = True                            # n > 1: samples may share a prefill (kv.fork)
        self.record = False                          # tests: log every launch in `launches`
        self.launches: list[tuple] = []              # ("prefill", request id, start, end) /
        #                                              ("decode", "id,id,..", draws per row)
        self.allocator = self.kv.allocator
        self.page_size, self.k, self.eos = page_size, steps_per_graph, frozenset(eos_token_ids)
        self.spec_k = spec_k                        # 0: no speculation
        # the most tokens a row gains in one block (a speculative one, or a plain K-step block
        # that the speculation policy may run instead)
        self.block_tokens = max(spec_rounds * (spec_k + 1), steps_per_graph) if spec_k else steps_per_graph
        self.max_pages_per_seq = max_pages_per_seq
        self.changes: list = []                      # slot changes since the last launch (take_changes)
        self.waiting: deque[Request] = deque()
        self.slots: list[Request | None] = [None] * max_batch
        self._free_slots = list(range(max_batch))   # a heap: the lowest free slot first
        self._admissions = 0
        self.num_preemptions = 0
        # slot -> request: the decoding rows with a grammar (structured outputs), kept as rows
        # start (activate) and stop drawing (their last block launched, finished, preempted), so
        # the engine asks "any constrained row?" without a scan over the rows
        self.constrained: dict[int, Request] = {}

    @property
    def free_slots(self) -> int:
        """Slots no request holds."""
        return len(self._free_slots)

    # ---- admission ----------------------------------------------------------------------------
    def pages_needed(self, prompt_len: int, max_tokens: int) -> int:
        """Pages a request holds at most (its whole output and one block past it)."""
        return self.kv.pages_for(prompt_len + max_tokens + max(self.spec_k, self.k))

    def _block_end(self, req: Request, held: int) -> int:
        """Tokens whose K/V the next block may write for a row holding at most `held` tokens:
        held + K - 1 decoding; speculating, up to R * (k + 1) - 1 more, but never past the
        slot's limit + k - 1 (a verify writes k positions ahead of the current token)."""
        end = held + self.block_tokens - 1
        if self.spec_k:
            end = min(end, len(req.prompt) + req.params.max_tokens + max(self.spec_k, self.k) - 1)
        return end

    def admit(self) -> list[Request]:
        """Give waiting requests (FIFO, no overtaking) a slot and the pages of their prefill and
        first block; the caller prefills them and then calls `activate`."""
        out = []
        per_row = self.kv.pages_for(self.block_tokens)   # a row's most growth in one block
        running = len(self.slots) - len(self._free_slots)
        kv = self.kv
        while self.waiting and self._free_slots:
            req = self.waiting[0]
            n = len(req.prompt) + len(req.token_ids)
            sib = req.sibling if self._can_fork(req, out) else None
            hit = [] if sib is not None else self._match(req, n)
            total = kv.pages_for(self._block_end(req, n + 1))
            need = total - len(hit) - (len(req.prompt) // self.page_size if sib is not None else 0)
            free = kv.free_after_sharing(hit) if hit else kv.num_free
            if need + running * per_row > free and running:
                break                                   # would be preempted at once: wait
            if need > free:
                break
            req.shares, req.copy_page = sib, None
            if sib is not None:                         # n > 1: sample 0's full prompt pages, shared
                pages, req.copy_page = kv.fork(sib.pages, tokens=len(req.prompt), total=total)
            else:
                kv.share(hit)
                pages = hit + kv.allocate(need)
            self.waiting.popleft()
            slot = heapq.heappop(self._free_slots)
            self.slots[slot], req.slot, req.pages = req, slot, pages
            req.admitted_at, self._admissions = self._admissions, self._admissions + 1
            req.prefilling, req.computed, req.cached_pages = True, len(hit) * self.page_size, len(hit)
            if sib is not None:                         # shared pages: sample 0 writes (and caches) them
                req.cached_pages = len(req.prompt) // self.page_size
            if req.num_cached_tokens is None:
                req.num_cached_tokens = req.computed
            self._set_pages(slot, 0, pages)
            self.prefilling.append(req)
            running += 1
            out.append(req)
        return out

    def _can_fork(self, req: Request, out: list[Request]) -> bool:
        """n > 1: req takes its sibling's prompt pages (kv.fork) when the sibling was admitted in
        this step, neither has tokens yet (no preemption) and the sibling's prompt is prefilled
        whole in this step (no chunk budget: `prefill_work`), the fork's draw reading its last
        logits."""
        sib = req.sibling
        return (self.forks and sib is not None and sib in out and not req.token_ids and not sib.token_ids
                and self.prefill_budget() is None)

    def _match(self, req: Request, n: int) -> list[int]:
        """Cached pages of req's context (n tokens): full pages of its first n - 1 tokens only."""
        if self.kv.cache is None or _whole_prompt(req):
            return []
        m = (n - 1) // self.page_size
        if len(req.hashes) < m:
            self.kv.cache.extend(req.hashes, req.context_ids, m)
        return self.kv.match(req.hashes[:m])

    # ---- prefill ------------------------------------------------------------------------------
    def prefill_work(self) -> list[tuple[Request, int, int]]:
        """(request, start, end) context positions to prefill in this step, FIFO: everything
        admitted, or at most prefill_budget() tokens while some row decodes."""
        if not self.prefilling:
            return []
        budget = self.prefill_budget()
        out = []
        for r in self.prefilling:
            end = len(r.prompt) + len(r.token_ids)
            if budget is not None:
                if not _whole_prompt(r):
                    end = min(end, r.computed + budget)
                budget = max(0, budget - (end - r.computed))
            out.append((r, r.computed, end))
            if budget == 0:
                break
        return out

    def mixed_piece(self, tokens: int, rows: list[Request]) -> tuple[Request, int, int] | None:
        """(request, start, end): context positions of the first prefilling request that the next
        decode block over `rows` carries (model/mixed.py), or None (prefill_work's paced chunks
        instead). Its last piece, once at most `tokens` + 1 positions are left, is (start, end of
        context): positions [start, end - 1) ride the block's first step and the request decodes
        in that same block from its last context token. Earlier pieces are `tokens` positions
        (ending on a page boundary where one lies in range), whatever the pacer's budget: a
        runtime built to carry pieces keeps the streams' pace first (a paced chunk between
        blocks would make faster progress and add up to max_prefill_stall of a block to every
        stream's gap). None also when no row decodes, a row or the request
        needs logits processing (its graph carries no chunk), or the request is prefilled
        whole or shares pages with a sample of its group."""
        if not self.prefilling or not rows or any(r.processed for r in rows):
            return None
        r = self.prefilling[0]
        left = len(r.prompt) + len(r.token_ids) - r.computed
        if r.params.processed or _whole_prompt(r) or r.shares is not None \
                or any(x.shares is r for x in self.prefilling):
            return None
        if left <= tokens + 1:
            return r, r.computed, r.computed + left
        end = r.computed + tokens
        if end // self.page_size * self.page_size > r.computed:
            end = end // self.page_size * self.page_size
        return r, r.computed, end

    def prefill_budget(self) -> int | None:
        """Prompt tokens this step may prefill: None (no limit) while no row decodes, else the
        pacer's budget (a share of a decode block's measured time, capped by
        max_num_batched_tokens) or, without a pacer, max_num_batched_tokens."""
        if not self.decode_rows():
            return None
        return self.pacer.budget() if self.pacer is not None else self.max_num_batched_tokens

    def prefilled(self, req: Request, end: int, *, kind: str = "prefill") -> bool:
        """Positions [.., end) of req's context are prefilled (launched; kind "mixed": carried
        by a decode block): cache its full pages; returns whether the context is complete (then
        it leaves `prefilling`; the caller drew its first token and calls `activate`)."""
        if self.record:
            self.launches.append((kind, req.request_id, req.computed, end))
        req.computed = end
        self._cache_pages(req, end // self.page_size, req.context_ids)
        if end < len(req.prompt) + len(req.token_ids):
            return False
        req.prefilling = False
        self.prefilling.remove(req)
        return True

    def _cache_pages(self, req: Request, n: int, tokens) -> None:
        """req.pages[:n] are full and written: into the prefix cache."""
        if self.kv.cache is None or n <= req.cached_pages:
            return
        if len(req.hashes) < n:
            self.kv.cache.extend(req.hashes, tokens, n)
        self.kv.cache_full_pages(req.hashes, req.pages, req.cached_pages, n)
        req.cached_pages = n

    def activate(self, req: Request) -> None:
        """After the prefill drew req's next token (req.launched counts it): its row decodes
        from the next block, unless it has no tokens left to draw."""
        if req.launched >= req.params.max_tokens:
            return
        if req.grammar is not None:
            self.constrained[req.slot] = req
        p = req.params
        self.changes.append(Activate(req.slot, len(req.prompt) + req.launched, req.launched,
                                     0.0 if p.greedy else p.temperature, max(p.top_k, 0), p.top_p, req.seed,
                                     len(req.prompt) + p.max_tokens, self.spec_k))

    def resume(self, req: Request) -> None:
        """req's row decodes again from its last accepted token, its draws launched since
        discarded (the caller moved req.epoch and req.launched back): a constrained row whose
        unmasked tokens its grammar refused (engine/structured.py FreeRun)."""
        self.activate(req)
        self.changes.append(SetToken(req.slot, req.token_ids[-1]))

    def set_history(self, req: Request) -> None:
        """Speculation: req's slot's token history becomes its context (its prefill's first
        draw is written on the device, after it)."""
        self.changes.append(SetHistory(req.slot, req.context))

    def set_token(self, req: Request, token: int) -> None:
        """req's slot's current token (a row that decodes from its last context token)."""
        self.changes.append(SetToken(req.slot, token))

    def set_processing(self, req: Request, rows) -> None:
        """req's slot's logits-processing row reset to `rows` (model/processing.py ProcessRows, one
        row: a row that starts decoding without a prefill of its own)."""
        self.changes.append(SetProcessing(req.slot, rows))

    def cap_proposals(self, req: Request, k: int) -> None:
        """req's slot verifies at most k proposals a speculative round from the next launch (a
        constrained row: the proposals its grammar accepts)."""
        self.changes.append(SetSpecK(req.slot, k))

    def take_changes(self) -> tuple:
        """The slot changes recorded since the last launch, in order, for the next launch to
        carry (the executor applies them before it runs it); the record starts empty again."""
        out, self.changes = tuple(self.changes), []
        return out

    def restore_changes(self, changes: tuple) -> None:
        """A launch that carried `changes` failed: they go first in the next launch again (each
        change writes absolute values, so one the executor applied before the failure, applied
        twice, leaves the slots as once)."""
        self.changes[:0] = changes

    def block_table(self, reqs) -> np.ndarray:
        """[m, W] int32 host block-table rows of `reqs` (each one's pages, then PAD_PAGE): a
        prefill's table, as its slots' rows hold them once the changes are applied."""
        table = np.full((len(reqs), self.max_pages_per_seq), PAD_PAGE, dtype=np.int32)
        for i, r in enumerate(reqs):
            table[i, :len(r.pages)] = r.pages
        return table

    def _set_pages(self, slot: int, col: int, pages) -> None:
        """block_table[slot, col:col + len(pages)] = pages, recorded (ValueError past the row)."""
        if not pages:
            return
        end = col + len(pages)
        if end > self.max_pages_per_seq:
            raise ValueError(f"pages: columns [{col}, {end}) exceed max_pages_per_seq={self.max_pages_per_seq}")
        self.changes.append(SetPages(slot, col, tuple(pages)))

    # ---- decode blocks ------------------------------------------------------------------------
    def decode_rows(self) -> list[Request]:
        """Running requests that still need tokens launched (launched < max_tokens). With
        speculation every running row is live on the device until the host finishes it (the
        device stops it at its limit), so each one is in every block and its tokens are read."""
        if self.spec_k:
            return [r for r in self.slots if r is not None and r.finish_reason is None and r.launched > 0
                    and not r.prefilling]
        return [r for r in self.slots if r is not None and r.finish_reason is None
                and 0 < r.launched < r.params.max_tokens and not r.prefilling]

    def grow(self, rows: list[Request]) -> list[Request]:
        """Pages for the next block of every row (`_block_end`), preempting the newest requests
        while the pool is short. Returns the rows that still decode."""
        ps, end = self.page_size, self._block_end
        short, total = [], 0
        for r in rows:                                  # the hot loop: ints only
            tokens = end(r, len(r.prompt) + r.launched)
            have = len(r.pages) * ps
            if tokens > have:
                m = -(-(tokens - have) // ps)
                short.append((r, m))
                total += m
        if not short:
            return rows
        new = self.kv.allocate(total) if total <= self.kv.num_free else None
        if new is None:
            return self._grow_preempting(rows)
        i = 0
        for r, m in short:
            got = new[i:i + m]
            i += m
            self._set_pages(r.slot, len(r.pages), got)
            r.pages.extend(got)
        return rows

    def _grow_preempting(self, rows: list[Request]) -> list[Request]:
        kv = self.kv
        for r in sorted(rows, key=lambda x: x.admitted_at):          # oldest first
            if r.slot < 0:
                continue                                              # preempted meanwhile
            tokens = self._block_end(r, len(r.prompt) + r.launched)
            while kv.missing(r.pages, tokens) > kv.num_free:
                victim = max((x for x in self.slots if x is not None), key=lambda x: x.admitted_at)
                self.preempt(victim)
                if victim is r:
                    break
            if r.slot >= 0:
                col = len(r.pages)
                self._set_pages(r.slot, col, kv.grow(r.pages, tokens))
        return [r for r in rows if r.slot >= 0]

    def preempt(self, req: Request) -> None:
        """Free req's slot and pages and queue it first; tokens in flight are discarded and the
        accepted ones are recomputed by its next prefill."""
        self._free_slot(req)
        req.launched = len(req.token_ids)
        req.epoch += 1
        req.preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(req)

    def launch_block(self, rows: list[Request], *, block_tokens: int | None = None, carry: bool = True) -> Launch:
        """A block over `rows` is about to launch: K more draws each (rows with none left stop
        decoding from the next block: their Deactivate goes to the next launch), or with
        speculation up to R * (k + 1) (the device stops a row at its limit). Returns (n: rows
        [0, n) the block serves, whether any row samples / filters, (request, slot, epoch, draws
        counted) per row, whether any row is processed, the slot changes recorded before it for
        the block to carry). block_tokens: the most draws a row makes in this block (default:
        block_tokens; K for a plain block run under speculation). carry=False: the launch carries no
        changes (the draw of a step whose forward was launched already: those recorded since wait for
        the next launch)."""
        changes = self.take_changes() if carry else ()
        k, spec = block_tokens or self.block_tokens, self.spec_k > 0
        n, sampled, filtered, processed, out = 0, False, False, False, []
        if self.record:
            self.launches.append(("decode", ",".join(r.request_id for r in rows), k))
        for r in rows:                                   # the hot loop
            slot = r.slot
            n = slot if slot > n else n
            p = r.params
            processed = processed or r.processed
            if not p.greedy:
                sampled = True
                filtered = filtered or p.top_k > 0 or p.top_p < 1.0
            added = min(k, p.max_tokens - r.launched) if spec else k
            out.append((r, slot, r.epoch, added))
            r.launched += added
            if r.launched >= p.max_tokens and not spec:
                self.changes.append(Deactivate(slot))
                if r.grammar is not None:
                    self.constrained.pop(slot, None)
        return Launch(n + 1, sampled, filtered, out, processed, changes)

    def settle(self, req: Request, counted: int, emitted: int) -> None:
        """A speculative block's counts came back: the request drew `emitted` of the `counted`
        draws launch_block assumed (its epoch unchanged)."""
        req.launched -= counted - emitted

    # ---- tokens -------------------------------------------------------------------------------
    def accept(self, req: Request, tokens: list[int]) -> RequestOutput | None:
        """Apply generated tokens in order; returns the delta to stream (None if nothing new).
        Tokens after the one that finishes the request are discarded."""
        if req.finish_reason is not None:
            return None
        p = req.params
        room = p.max_tokens - len(req.token_ids)
        if len(tokens) >= room:
            tokens = tokens[:room]
        stops = req.stop_ids
        if stops is None:                               # stop ids, plus end-of-sequence unless ignored
            stops = req.stop_ids = frozenset(p.stop_token_ids) | (frozenset() if p.ignore_eos else self.eos)
        end = None                                      # index of a stop / end-of-sequence id
        if stops and not stops.isdisjoint(tokens):
            end = next(i for i, tok in enumerate(tokens) if tok in stops)
        text = req.text
        cut = text.add_tokens(tokens if end is None else tokens[:end])   # None, or up to a stop string
        if cut is not None:
            kept = tokens[:cut]
            req.finish_reason = "stop"
        elif end is not None:
            kept = tokens[:end + 1]
            req.finish_reason = "stop"                  # the stop token is kept, not its text
        else:
            kept = tokens
            if len(req.token_ids) + len(kept) >= p.max_tokens:
                req.finish_reason = "length"
        req.token_ids.extend(kept)
        req.sent_ids = len(req.token_ids)               # every accepted id goes out in this delta
        if self.kv.cache is not None:                   # K/V of all but the newest token written
            held = len(req.prompt) + len(req.token_ids) - 1
            if held // self.page_size > req.cached_pages:
                self._cache_pages(req, held // self.page_size, _Joined(req.prompt, req.token_ids))
        done = req.finish_reason is not None
        if done and not text.stopped:
            text.flush()
        new_text = text.delta(done)
        if not new_text and not kept and not done:
            return None
        why = None                                      # stop_reason: the stop id or string
        if cut is not None:
            why = text.stop_string
        elif end is not None and tokens[end] in p.stop_token_ids:
            why = tokens[end]
        return RequestOutput(req.request_id, req.prompt, new_text, kept, req.finish_reason, stop_reason=why,
                             num_cached_tokens=req.num_cached_tokens or 0)

    def _free_slot(self, req: Request) -> None:
        self.slots[req.slot] = None
        self.constrained.pop(req.slot, None)
        self.changes.append(Deactivate(req.slot, free=True))
        heapq.heappush(self._free_slots, req.slot)
        req.slot = -1
        if req.prefilling:
            self.prefilling.remove(req)
        req.prefilling, req.computed, req.cached_pages = False, 0, 0
        self.kv.release(req.pages)
        req.pages = []

    def release(self, req: Request) -> None:
        """Free a running request's slot and pages (exactly once), or drop a waiting one."""
        if req.slot >= 0:
            self._free_slot(req)
        elif req in self.waiting:
            self.waiting.remove(req)

    def abort(self, req: Request) -> RequestOutput:
        req.finish_reason = "abort"
        self.release(req)
        return RequestOutput(req.request_id, req.prompt, "", [], "abort",
                             num_cached_tokens=req.num_cached_tokens or 0)

    @property
    def has_work(self) -> bool:
        return bool(self.waiting) or any(s is not None for s in self.slots)


__all__ = ["Request", "Scheduler", "Launch"]
