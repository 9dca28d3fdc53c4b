"""Admission, persistent decode slots, block inputs, and what each generated token does to a request.

Host-only decisions and state (the engine runs the device work):
- Admission (FIFO, no preemption): a waiting request is admitted only when a slot is free and the
  free pages cover its prompt + max_tokens + K tokens (K: the steps of one graph, which may run
  past max_tokens before the host sees the tokens), so a running request never runs out of pages.
- Slots: an admitted request keeps decode row `slot` until it finishes; rows of empty slots are
  padding (seq_len 0) in a block, and a block serves rows [0, max live slot].
- Tokens: `accept` applies stop token ids / end-of-sequence / stop strings / max_tokens in order
  and discards whatever follows the stop inside a K-step block.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import torch

from graphrt.engine.allocator import PageAllocator
from graphrt.engine.detokenizer import TextState
from graphrt.engine.params import RequestOutput, SamplingParams

PAD_PAGE = -1  # block-table entries past a request's pages


@dataclass(eq=False)
class Request:
    """A request's host state. launched: tokens whose draw has been launched on the device
    (the prefill's first token, then K per block); token_ids: tokens accepted so far."""

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


class Scheduler:
    """Owns the page allocator, the waiting queue, the slots and the per-slot host inputs:
    block_table [B, max_pages] int32, seq_lens [B] int32, and the sampling rows
    temperature / top_p [B] float32, top_k / step [B] int32, seed [B] int64 (CPU)."""

    def __init__(self, *, max_batch: int, page_size: int, max_pages_per_seq: int, num_pages: int,
                 steps_per_graph: int, eos_token_ids: tuple[int, ...]):
        self.allocator = PageAllocator(num_pages)
        self.page_size, self.k, self.eos = page_size, steps_per_graph, frozenset(eos_token_ids)
        self.max_pages_per_seq = max_pages_per_seq
        self.waiting: deque[Request] = deque()
        self.slots: list[Request | None] = [None] * max_batch
        self.block_table = torch.full((max_batch, max_pages_per_seq), PAD_PAGE, dtype=torch.int32)
        self.seq_lens = torch.zeros(max_batch, dtype=torch.int32)
        self.temperature = torch.zeros(max_batch, dtype=torch.float32)
        self.top_p = torch.ones(max_batch, dtype=torch.float32)
        self.top_k = torch.zeros(max_batch, dtype=torch.int32)
        self.step = torch.zeros(max_batch, dtype=torch.int32)
        self.seed = torch.zeros(max_batch, dtype=torch.int64)

    # ---- admission ----------------------------------------------------------------------------
    def pages_needed(self, prompt_len: int, max_tokens: int) -> int:
        return -(-(prompt_len + max_tokens + self.k) // self.page_size)

    def admit(self) -> list[Request]:
        """Give waiting requests (FIFO) a slot and their pages while both are available."""
        out = []
        while self.waiting and None in self.slots:
            req = self.waiting[0]
            pages = self.allocator.allocate(self.pages_needed(len(req.prompt), req.params.max_tokens))
            if pages is None:
                break                                   # waits for pages; no overtaking
            self.waiting.popleft()
            slot = self.slots.index(None)
            self.slots[slot], req.slot, req.pages = req, slot, pages
            self.block_table[slot].fill_(PAD_PAGE)
            self.block_table[slot, :len(pages)] = torch.tensor(pages, dtype=torch.int32)
            p = req.params
            self.temperature[slot] = 0.0 if p.greedy else p.temperature
            self.top_k[slot], self.top_p[slot], self.seed[slot] = max(p.top_k, 0), p.top_p, req.seed
            out.append(req)
        return out

    # ---- decode blocks ------------------------------------------------------------------------
    def decode_rows(self) -> list[Request]:
        """Running requests that still need tokens launched (launched < max_tokens)."""
        return [r for r in self.slots if r is not None and r.finish_reason is None
                and 0 < r.launched < r.params.max_tokens]

    def prepare_block(self, rows: list[Request]) -> tuple[int, bool]:
        """Write seq_lens / step for a block over `rows`; returns (n rows, any row sampled).
        Slots not in `rows` become padding (seq_len 0)."""
        self.seq_lens.zero_()
        sampled = False
        for r in rows:
            self.seq_lens[r.slot] = len(r.prompt) + r.launched
            self.step[r.slot] = r.launched
            sampled |= not r.params.greedy
        return max(r.slot for r in rows) + 1, sampled

    # ---- tokens -------------------------------------------------------------------------------
    def accept(self, req: Request, tokens: list[int]) -> RequestOutput | None:
        """Apply generated tokens in order; returns the delta to stream (None if nothing new).
        Tokens after the one that finishes the request are discarded."""
        if req.finish_reason is not None:
            return None
        p = req.params
        for tok in tokens:
            req.token_ids.append(tok)
            if tok in p.stop_token_ids or (not p.ignore_eos and tok in self.eos):
                req.finish_reason = "stop"              # the stop token is kept, not its text
            elif req.text.add(tok):
                req.finish_reason = "stop"
            elif len(req.token_ids) >= p.max_tokens:
                req.finish_reason = "length"
            if req.finish_reason is not None:
                break
        if req.finish_reason is not None and not req.text.stopped:
            req.text.flush()
        return self._delta(req)

    def _delta(self, req: Request) -> RequestOutput | None:
        done = req.finish_reason is not None
        text, ids = req.text.delta(done), req.token_ids[req.sent_ids:]
        req.sent_ids = len(req.token_ids)
        if not text and not ids and not done:
            return None
        return RequestOutput(req.request_id, req.prompt, text, ids, req.finish_reason)

    def release(self, req: Request) -> None:
        """Free a running request's slot and pages (exactly once), or drop a waiting one."""
        if req.slot >= 0:
            self.slots[req.slot] = None
            self.seq_lens[req.slot] = 0
            req.slot = -1
            self.allocator.free(req.pages)
            req.pages = []
        elif req in self.waiting:
            self.waiting.remove(req)

    def abort(self, req: Request) -> RequestOutput:
        req.finish_reason = "abort"
        self.release(req)
        return RequestOutput(req.request_id, req.prompt, "", [], "abort")

    @property
    def has_work(self) -> bool:
        return bool(self.waiting) or any(s is not None for s in self.slots)


__all__ = ["Request", "Scheduler", "PAD_PAGE"]
