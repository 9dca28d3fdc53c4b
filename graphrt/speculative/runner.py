"""Speculative decoding rounds on the device: propose -> verify -> accept -> advance, R per block.

    runner = SpeculativeRunner(model, kv_caches, SpeculativeConfig(num_tokens=4),
                               buckets=(1, 2, 4), max_len=512, page_size=16, rounds=4)
    runner.set_slot(0, prompt + [first_token], limit=len(prompt) + max_tokens,
                    block_table=row)                  # after the target's prefill of `prompt`
    runner.capture()                                  # CUDA: one graph per bucket (R rounds)
    out, emitted, proposed = runner.run(n)            # [R, n, k+1] tokens, [R, n] counts

A block of R rounds is a pure device function of the persistent SpecBuffers, captured per bucket
on CUDA (the eager path is the same code, used on CPU): the n-gram kernel proposes from each
slot's token buffer, the target verifies k + 1 tokens per slot in one forward
(LlamaDecoder.verify_step), `judge` + `advance` accept and write the emitted tokens into the token
buffer and move num_tokens / step. The host reads `out`/`emitted` after the block (the engine can
do it asynchronously) and applies stop ids, stop strings and EOS; max_tokens is exact on the
device (a slot never holds more than `limit` tokens). A slot the host stops is cleared with
`clear_slot`. K/V written for rejected proposals lies past the slot's length and is overwritten
by the next round. Method "draft" takes a DraftProposer (draft.py) in place of the n-gram kernel.
"""
from __future__ import annotations

from typing import NamedTuple

import torch

from graphrt.attention.buckets import pick_bucket
from graphrt.attention.graphs import GraphManager
from graphrt.kernels.multiquery_attention import default_splits
from graphrt.speculative.accept import advance, judge
from graphrt.speculative.buffers import SpecBuffers
from graphrt.speculative.config import SpeculativeConfig
from graphrt.speculative.draft import DraftProposer
from graphrt.speculative.filter import filter_logits
from graphrt.speculative.ngram import ngram_propose


class BlockOutput(NamedTuple):
    """Views of one block's outputs (valid until the next run), n slots: tokens [R, n, k + 1]
    int64 (-1 past each round's emitted tokens), emitted [R, n] int32, proposed [R, n] int32."""
    tokens: torch.Tensor
    emitted: torch.Tensor
    proposed: torch.Tensor


class SpeculativeRunner:
    """model: a LlamaDecoder; kv_caches: its per-layer PagedKVCache list (holding the prefilled
    prompts); buckets: sorted batch sizes captured; max_len: token-buffer width (>= the longest
    limit + k); page_size / max_pages: the block-table geometry; rounds: R per block; draft: a
    DraftProposer for method "draft"; filtered: apply per-slot top_k / top_p to the target
    logits before acceptance (a sort per verified row; off: slots must not use them)."""

    def __init__(self, model, kv_caches, config: SpeculativeConfig, *, buckets, max_len: int,
                 page_size: int, max_pages: int | None = None, rounds: int = 1, device=None,
                 splits: int | None = None, draft: DraftProposer | None = None,
                 filtered: bool = False):
        if not isinstance(config, SpeculativeConfig):
            raise TypeError(f"config: expected a SpeculativeConfig, got {type(config).__name__}")
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
        self.buckets, self.rounds, self.page_size = buckets, rounds, page_size
        self.max_pages = max_pages or -(-(max_len + config.num_tokens) // page_size)
        self.device = torch.device(device) if device is not None else kv_caches[0].device
        self.bufs = SpecBuffers.allocate(buckets[-1], max_len, self.max_pages, config.num_tokens,
                                         rounds, self.device)
        hkv = model.local_spec.num_kv_heads
        self.splits = {b: splits or default_splits(self.device, b, hkv, max_len) for b in buckets}
        self.graphs: GraphManager | None = None

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
        b, k = self.bufs, self.config.num_tokens
        if isinstance(slot, bool) or not isinstance(slot, int) or not 0 <= slot < b.token_buf.shape[0]:
            raise ValueError(f"slot: must be an int in [0, {b.token_buf.shape[0]}), got {slot!r}")
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
        if limit + k > b.width:
            raise ValueError(f"limit: {limit} + num_tokens {k} exceeds the token buffer's max_len="
                             f"{b.width}")
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
        b.token_buf[slot, : tokens.numel()].copy_(tokens)
        if append is not None:
            b.token_buf[slot, n - 1: n].copy_(append.reshape(1), non_blocking=True)
        b.num_tokens[slot] = n
        b.limit[slot] = limit
        b.block_table[slot].fill_(0)
        b.block_table[slot, : block_table.numel()].copy_(block_table)
        b.temperature[slot], b.seed[slot], b.step[slot] = float(temperature), int(seed), int(step)
        b.top_k[slot], b.top_p[slot] = top_k, float(top_p)

    def clear_slot(self, slot: int) -> None:
        """Empty a slot (finished or aborted request): it emits nothing and writes no K/V."""
        self.bufs.num_tokens[slot] = 0
        self.bufs.limit[slot] = 0

    def slot_tokens(self, slot: int) -> list[int]:
        """The slot's tokens (prompt + output) read back to the host (a sync; tests, debugging)."""
        n = int(self.bufs.num_tokens[slot])
        return self.bufs.token_buf[slot, :n].tolist()

    # ---- device side: the block of R rounds ----------------------------------------------------
    def _round(self, v: SpecBuffers, r: int, splits: int) -> None:
        c = self.config
        active = (v.num_tokens > 0) & (v.num_tokens < v.limit)
        if self.draft is not None:
            self.draft.propose(v.token_buf, v.num_tokens, active, v.block_table, v.proposals,
                               v.count, v.device_error)
        else:
            ngram_propose(v.token_buf, v.num_tokens, v.proposals, v.count, min_n=c.ngram_min,
                          max_n=c.ngram_max)
        last = (v.num_tokens.long() - 1).clamp_min(0)[:, None]
        cur = v.token_buf.gather(1, last).long()                    # [B, 1] current tokens
        tokens = torch.cat([cur, v.proposals], dim=1)                # [B, k + 1]
        cache_lens = torch.where(active, v.num_tokens - 1, -1).to(torch.int32)
        logits = self.model.verify_step(tokens, cache_lens, self.kv_caches, v.block_table,
                                        v.device_error, splits=splits)   # [B * (k + 1), V]
        if self.filtered:
            q = c.query_len
            logits = filter_logits(logits, v.temperature.repeat_interleave(q),
                                   v.top_k.repeat_interleave(q), v.top_p.repeat_interleave(q))
        judge(logits, v.proposals, v.count, v.temperature, v.seed, v.step, v.accept, v.fallback)
        v.proposed[r].copy_(torch.where(active, v.count, 0))
        advance(v.accept, v.fallback, v.proposals, v.token_buf, v.num_tokens, v.limit, v.step,
                v.out_tokens[r], v.emitted[r])

    def _block(self, size: int) -> None:
        v = self.bufs.view(size)
        for r in range(self.rounds):
            self._round(v, r, self.splits[size])

    def capture(self) -> None:
        """Capture one graph of R rounds per bucket (CUDA only; no-op elsewhere). The warm-up
        runs on empty slots, so it writes no K/V and emits nothing; slot state is saved and
        restored around it."""
        if self.device.type != "cuda":
            return
        saved = {name: getattr(self.bufs, name).clone() for name in ("num_tokens", "limit")}
        self.bufs.num_tokens.zero_()
        self.bufs.limit.zero_()
        self.graphs = self.graphs or GraphManager(self.device)
        for size in reversed(self.buckets):
            if size not in self.graphs:
                self.graphs.capture(size, lambda s=size: self._block(s))
        self.bufs.num_tokens.copy_(saved["num_tokens"])
        self.bufs.limit.copy_(saved["limit"])

    def run(self, n: int) -> BlockOutput:
        """One block of R rounds over slots [0, n) (the smallest bucket >= n; slots past n in it
        must be empty). Returns a BlockOutput of views (valid until the next run)."""
        if isinstance(n, bool) or not isinstance(n, int) or not 1 <= n <= self.buckets[-1]:
            raise ValueError(f"n: must be an int in [1, {self.buckets[-1]}], got {n!r}")
        size = pick_bucket(list(self.buckets), n)
        if self.graphs is not None and size in self.graphs:
            self.graphs.replay(size)
        else:
            self._block(size)
        b = self.bufs
        return BlockOutput(b.out_tokens[:, :n], b.emitted[:, :n], b.proposed[:, :n])


__all__ = ["SpeculativeRunner", "BlockOutput"]
