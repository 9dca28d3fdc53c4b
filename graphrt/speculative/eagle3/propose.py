"""EAGLE-3 chain drafting: k greedy proposals per row from the target's hidden states, on the device.

The target verifies [t_n, d_1 .. d_k] at positions n .. n + k (t_n: its own last token) and
records its hidden states there ([B, k + 1, 3H]); acceptance keeps a proposals and emits
a + 1 tokens e_0 .. e_a (e_j = d_{j+1} for j < a, e_a the target's own). A round then is

    draft-extend  head.extend(h3, e, cache_lens=n): the head's K/V at positions n .. n + k are
                  rewritten from the target's hidden states; slot a (position n + a, paired
                  with e_a) gives d'_1 and the pre-norm h
    chain         k - 1 chain steps at positions n + a + 1 .. n + a + k - 1 -> d'_2 .. d'_k

Slots past a pair rejected tokens with garbage: their K/V lies past the new length and the
chain steps overwrite it before any query can read it, so nothing is rolled back. After a
prompt, the prompt pass writes the head's K/V of every prompt position but the last
(`Eagle3Head.write_kv`: inside the target's prefill graphs, eagle3/prompt.py, or eagerly in
`prefill`), and `first` is a round at one verified slot: the last position paired with the
first sampled token, then the chain.
Fixed shapes, no host sync in `round`: it can run inside the runner's captured graph. Greedy
proposals are point masses, so the acceptance rule "accept x with probability p(x)" keeps
sampling exact (as for the draft-model proposer).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from graphrt.kernels.argmax import argmax_into
from graphrt.kernels.decode_attention import DecodeScratch, default_max_splits, device_sms
from graphrt.kernels.mq_launch import default_splits
from graphrt.speculative.eagle3.head import last_positions


@triton.jit(do_not_specialize=["n_rows"])
def _round_prep_kernel(emitted_ptr, cache_lens_ptr, cl_ptr, at_ptr, base_ptr, n_rows, Q: tl.constexpr,
                       ROWS: tl.constexpr):
    b = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    live = b < n_rows
    e = tl.load(emitted_ptr + b, mask=live, other=0)
    c = tl.load(cache_lens_ptr + b, mask=live, other=-1)
    act = (e > 0) & (c >= 0)
    tl.store(cl_ptr + b, tl.where(act, c, -1), mask=live)
    tl.store(at_ptr + b, b.to(tl.int64) * Q + tl.minimum(tl.maximum(e - 1, 0), Q - 1), mask=live)
    tl.store(base_ptr + b, tl.where(act, c + e, -1), mask=live)


def round_prep(emitted: torch.Tensor, cache_lens: torch.Tensor, q: int
               ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A round's head inputs from the verify's outcome, in one launch (as torch ops: a dozen small
    launches, each a graph node).

    emitted [B] int32 (a + 1 tokens emitted; 0 = an idle slot), cache_lens [B] int32 (the
    verify's first position n; -1 = idle), q = k + 1 ->
        cl   [B] int32   n for an emitting slot, else -1       (draft-extend's cache lengths)
        at   [B] int64   b * q + min(max(a, 0), q - 1)         (the row whose output seeds the chain)
        base [B] int32   n + a + 1 for an emitting slot, else -1   (the first chain position)
    New tensors on emitted's device; capturable; runs on CPU under TRITON_INTERPRET=1."""
    b = emitted.shape[0]
    for name, t in (("emitted", emitted), ("cache_lens", cache_lens)):
        if t.dim() != 1 or t.shape[0] != b or t.dtype != torch.int32 or not t.is_contiguous():
            raise ValueError(f"{name}: expected a contiguous [{b}] int32 tensor, got {tuple(t.shape)} {t.dtype}")
    if cache_lens.device != emitted.device:
        raise ValueError(f"cache_lens: on {cache_lens.device}, emitted on {emitted.device}")
    if isinstance(q, bool) or not isinstance(q, int) or q < 1:
        raise ValueError(f"q: must be an int >= 1, got {q!r}")
    dev = emitted.device
    cl = torch.empty(b, dtype=torch.int32, device=dev)
    at = torch.empty(b, dtype=torch.int64, device=dev)
    base = torch.empty(b, dtype=torch.int32, device=dev)
    if b:
        rows = 1 if dev.type == "cuda" else min(64, triton.next_power_of_2(b))
        _round_prep_kernel[(triton.cdiv(b, rows),)](emitted, cache_lens, cl, at, base, b, Q=q, ROWS=rows)
    return cl, at, base


class Eagle3Drafter:
    """head: Eagle3Head; kv_cache: its PagedKVCache (indexed by the target's block tables, at
    least as many pages as the target's pool); k: proposals a round; max_len: longest sequence;
    splits: draft-extend's static multi-query split count (default: by max_len); max_batch: most
    rows a round serves (sizes the chain steps' decode scratch).

    Chain steps (one query per row) attend through the one-launch decode kernel with MAX_SPLITS
    `chain_splits(B)` (about two waves of programs over B x KV heads, by max_len, B rounded up to
    a power of two: MAX_SPLITS is a compile-time constant, so few kernel variants, each compiled
    by `warm_first` at capture) and the drafter's own DecodeScratch (float32 partials, allocated
    here, outside any graph; its counters are left zero by every launch, so successive chain
    steps and graphs share it)."""

    def __init__(self, head, kv_cache, k: int, *, max_len: int, splits: int | None = None, max_batch: int = 256):
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise ValueError(f"k: must be an int >= 1, got {k!r}")
        if isinstance(max_batch, bool) or not isinstance(max_batch, int) or max_batch < 1:
            raise ValueError(f"max_batch: must be an int >= 1, got {max_batch!r}")
        self.head, self.kv_cache, self.k, self.max_len, self.max_batch = head, kv_cache, k, max_len, max_batch
        c, dev = head.config, kv_cache.device
        self.splits = splits or default_splits(dev, 1, c.num_kv_heads, max_len)
        self.sms = device_sms(dev)
        self.scratch = DecodeScratch.allocate(((b, self.chain_splits(b)) for b in range(1, max_batch + 1)),
                                              num_kv_heads=c.num_kv_heads, group=c.num_heads // c.num_kv_heads,
                                              head_dim=c.head_dim, device=dev)

    def chain_splits(self, batch: int) -> int:
        """MAX_SPLITS of a chain step's decode attention over `batch` rows (batch rounded up to
        a power of two, at most max_batch: the eager first draft's row count is any number of
        prompts, and each MAX_SPLITS is a kernel of its own)."""
        rows = min(1 << max(0, batch - 1).bit_length(), self.max_batch)
        return default_max_splits(self.sms, rows, self.head.config.num_kv_heads, self.max_len)

    def chain_variants(self) -> list[int]:
        """Every MAX_SPLITS a chain step can use (batch 1 .. max_batch), largest first."""
        return sorted({self.chain_splits(b) for b in range(1, self.max_batch + 1)}, reverse=True)

    def _chain(self, logits0, h0, base, block_table, proposals, error) -> None:
        """d_1 = argmax(logits0 [B, Vd]) as a target id; k - 1 chain steps from h0 [B, H]
        (consumed), step j at base + j - 1 (base [B] int32, -1 = idle row): proposals [B, k]
        int64 (target ids) written in place, each argmax straight into its column."""
        ids = self.head.weights.draft_ids
        argmax_into(logits0, proposals[:, 0], ids=ids)
        h, splits = h0, self.chain_splits(h0.shape[0])
        for j in range(1, self.k):
            logits, h = self.head.chain_step(h, proposals[:, j - 1], base, self.kv_cache, block_table, error,
                                             splits=splits, offset=j - 1, scratch=self.scratch)
            argmax_into(logits, proposals[:, j], ids=ids)

    def round(self, hidden3: torch.Tensor, emitted_tokens: torch.Tensor, cache_lens: torch.Tensor,
              emitted: torch.Tensor, block_table: torch.Tensor, proposals: torch.Tensor,
              error: torch.Tensor) -> None:
        """Draft-extend + chain after a verify (capturable).

        hidden3 [B, k + 1, 3H]: the target's recorded hidden states of the verified tokens;
        emitted_tokens [B, k + 1] int64: the emitted tokens (entries past the emitted count
        ignored, may be -1); cache_lens [B] int32: the verify's first position n (-1: idle);
        emitted [B] int32: a + 1 tokens emitted (0: an idle slot: nothing written, its
        proposals garbage but valid ids); proposals [B, k] int64 out (target ids); error [1]
        int32."""
        cl, at, base = round_prep(emitted, cache_lens, hidden3.shape[1])
        logits, h = self.head.extend(hidden3, emitted_tokens, cl, self.kv_cache, block_table, error,
                                     splits=self.splits, at=at)                # [B, Vd], [B, H]
        self._chain(logits, h, base, block_table, proposals, error)

    def first(self, hidden3: torch.Tensor, tokens: torch.Tensor, cache_lens: torch.Tensor,
              block_table: torch.Tensor, proposals: torch.Tensor, error: torch.Tensor) -> None:
        """The first draft after a prompt (capturable): `round` at one verified slot. hidden3
        [B, 3H]: the target's recorded states at each row's last prompt position cache_lens[b]
        ([B] int32, -1 = padding row: nothing written), tokens [B] int64: the first sampled
        token; the prompt's earlier positions' K/V must be written (`Eagle3Head.write_kv`).
        proposals [B, k] int64 out (target ids), error [1] int32."""
        cache_lens = cache_lens.to(torch.int32).contiguous()
        self.round(hidden3[:, None], tokens[:, None], cache_lens, (cache_lens >= 0).to(torch.int32), block_table,
                   proposals, error)

    @torch.no_grad()
    def warm_first(self, block_table: torch.Tensor, error: torch.Tensor) -> None:
        """Compile the eager first draft's kernels before serving (`first` on one padding row:
        its q = 1 round inputs; nothing written), and a chain step at every MAX_SPLITS of
        `chain_variants` (the eager first draft runs at any row count, not only at the buckets
        the round graphs compile). Where the prompt pass runs in prefill graphs, the first-draft
        graphs compile the rest too. block_table [>= 1, W] int32, error [1] int32."""
        dev, w = self.head.device, self.head.weights
        hidden = torch.zeros((1, w.fc.shape[1]), dtype=w.dtype, device=dev)
        tokens = torch.zeros(1, dtype=torch.int64, device=dev)
        pad = torch.full((1,), -1, dtype=torch.int32, device=dev)
        self.first(hidden, tokens, pad, block_table[:1], torch.empty((1, self.k), dtype=torch.int64, device=dev),
                   error)
        h = torch.zeros((1, w.fc.shape[0]), dtype=w.dtype, device=dev)
        for splits in self.chain_variants():        # one padding row: kv_len 0, nothing read or written
            self.head.chain_step(h, tokens, pad, self.kv_cache, block_table[:1], error, splits=splits,
                                 scratch=self.scratch)

    @torch.no_grad()
    def prefill(self, hidden3: torch.Tensor, tokens: torch.Tensor, lens, block_table: torch.Tensor,
                proposals: torch.Tensor, error: torch.Tensor, *, starts=None) -> None:
        """Eager, after the target's prefill: hidden3 [T, 3H] / tokens [T] as for
        Eagle3Head.prefill_kv (prompt i on block-table row i from position starts[i], default 0;
        lens host ints); proposals [n, k] out. The prompt pass, then `first` over the prompts'
        last positions."""
        self.head.prefill_kv(hidden3, tokens, lens, self.kv_cache, block_table, error, starts=starts)
        rows, at = last_positions(lens, hidden3.device, starts)
        self.first(hidden3[rows], tokens[rows], at, block_table[:len(lens)], proposals, error)


__all__ = ["Eagle3Drafter", "round_prep"]
