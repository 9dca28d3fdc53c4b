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

from graphrt.kernels.argmax import argmax_into
from graphrt.kernels.multiquery_attention import default_splits
from graphrt.speculative.eagle3.head import last_positions


def _greedy(logits: torch.Tensor) -> torch.Tensor:
    """logits [B, Vd] -> [B] int64 draft ids: torch.argmax's, by the chunked kernel."""
    return argmax_into(logits, torch.empty(logits.shape[0], dtype=torch.int64, device=logits.device))


class Eagle3Drafter:
    """head: Eagle3Head; kv_cache: its PagedKVCache (indexed by the target's block tables, at
    least as many pages as the target's pool); k: proposals a round."""

    def __init__(self, head, kv_cache, k: int, *, max_len: int, splits: int | None = None):
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise ValueError(f"k: must be an int >= 1, got {k!r}")
        self.head, self.kv_cache, self.k = head, kv_cache, k
        self.splits = splits or default_splits(kv_cache.device, 1, head.config.num_kv_heads, max_len)

    def _chain(self, logits0, h0, next_pos, active, block_table, proposals, error) -> None:
        """d_1 = argmax(logits0) [B, Vd]; k - 1 chain steps from h0 [B, H], the first at
        next_pos [B] int32; proposals [B, k] int64 (target ids) written in place."""
        d = self.head.to_target(_greedy(logits0))
        proposals[:, 0].copy_(d)
        h = h0
        for j in range(1, self.k):
            pos = torch.where(active, next_pos + (j - 1), -1).to(torch.int32)
            logits, h = self.head.chain_step(h, d, pos, self.kv_cache, block_table, error, splits=self.splits)
            d = self.head.to_target(_greedy(logits))
            proposals[:, j].copy_(d)

    def round(self, hidden3: torch.Tensor, emitted: torch.Tensor, cache_lens: torch.Tensor,
              accepted: torch.Tensor, active: torch.Tensor, block_table: torch.Tensor,
              proposals: torch.Tensor, error: torch.Tensor) -> None:
        """Draft-extend + chain after a verify (capturable).

        hidden3 [B, k + 1, 3H]: the target's recorded hidden states of the verified tokens;
        emitted [B, k + 1] int64: the emitted tokens (entries past accepted[b] ignored, may
        be -1); cache_lens [B] int32: the verify's first position n; accepted [B] int32 (a);
        active [B] bool; proposals [B, k] int64 out (target ids); error [1] int32."""
        cl = torch.where(active, cache_lens, -1).to(torch.int32)
        logits, h = self.head.extend(hidden3, emitted, cl, self.kv_cache, block_table, error,
                                     splits=self.splits)                       # [B, Q, Vd], [B, Q, H]
        sel = accepted.long().clamp(0, hidden3.shape[1] - 1)
        rows = torch.arange(sel.shape[0], device=sel.device)
        self._chain(logits[rows, sel], h[rows, sel], (cache_lens + accepted + 1).to(torch.int32), active,
                    block_table, proposals, error)

    def first(self, hidden3: torch.Tensor, tokens: torch.Tensor, cache_lens: torch.Tensor,
              block_table: torch.Tensor, proposals: torch.Tensor, error: torch.Tensor) -> None:
        """The first draft after a prompt (capturable): `round` at one verified slot. hidden3
        [B, 3H]: the target's recorded states at each row's last prompt position cache_lens[b]
        ([B] int32, -1 = padding row: nothing written), tokens [B] int64: the first sampled
        token; the prompt's earlier positions' K/V must be written (`Eagle3Head.write_kv`).
        proposals [B, k] int64 out (target ids), error [1] int32."""
        zero = torch.zeros_like(cache_lens)
        self.round(hidden3[:, None], tokens[:, None], cache_lens, zero, cache_lens >= 0, block_table,
                   proposals, error)

    @torch.no_grad()
    def prefill(self, hidden3: torch.Tensor, tokens: torch.Tensor, lens, block_table: torch.Tensor,
                proposals: torch.Tensor, error: torch.Tensor) -> None:
        """Eager, after the target's prefill: hidden3 [T, 3H] / tokens [T] as for
        Eagle3Head.prefill_kv (prompt i on block-table row i, lens host ints); proposals [n, k]
        out. The prompt pass, then `first` over the prompts' last positions."""
        self.head.prefill_kv(hidden3, tokens, lens, self.kv_cache, block_table, error)
        rows, at = last_positions(lens, hidden3.device)
        self.first(hidden3[rows], tokens[rows], at, block_table[:len(lens)], proposals, error)


__all__ = ["Eagle3Drafter"]
