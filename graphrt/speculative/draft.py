"""The draft-model proposer: a smaller LlamaDecoder proposes k tokens greedily, on the device.

The draft keeps its own paged KV caches, indexed by the target's block tables (same page ids,
its own pool of at least as many pages), so it needs no page bookkeeping of its own. Each round,
for a slot holding n tokens (the last one, at position n - 1, not yet in any cache):

    step 1: draft forward over tokens [n-2, n-1] at positions n-2, n-1 -> d_1 = argmax
    step j: draft forward over d_{j-1} at position n + j - 2            -> d_j = argmax (j = 2..k)

Step 1 re-writes position n - 2: after a round in which all k proposals were accepted, that is
the one position the draft has not seen (the last accepted proposal), and otherwise it rewrites
the same K/V. Every position below n - 2 holds the K/V of accepted tokens, so rejected
proposals need no rollback: their K/V lies past the new length and is overwritten. Fixed shapes,
no host sync: it runs inside the runner's captured graph. Greedy proposals are point masses, so
`accept.judge`'s rule (accept x with probability p(x)) keeps sampling exact. The round's inputs
(draft_prep.py) and the argmax are the draft model's kernel set's (speculative/ops.py,
kernels/ops.py).
"""
from __future__ import annotations

import torch

from graphrt.kernels.mq_launch import default_splits
from graphrt.kernels.transfer import to_device
from graphrt.speculative.ops import spec_ops


class DraftProposer:
    """model: the draft LlamaDecoder (same vocabulary as the target); kv_caches: its per-layer
    PagedKVCache list, with at least as many pages as the target's pool; k: proposals a round."""

    def __init__(self, model, kv_caches, k: int, *, max_len: int, splits: int | None = None,
                 attention=None, prefill_tokens: int | None = None, prefill_graphs=None):
        if isinstance(k, bool) or not isinstance(k, int) or k < 1:
            raise ValueError(f"k: must be an int >= 1, got {k!r}")
        if len(kv_caches) != model.spec.num_layers:
            raise ValueError(f"kv_caches: {len(kv_caches)} caches, the draft has "
                             f"{model.spec.num_layers} layers")
        self.model, self.kv_caches, self.k = model, kv_caches, k
        self.attention, self.prefill_tokens = attention, prefill_tokens   # PrefillAttention or None
        self.prefill_graphs = prefill_graphs        # model/prefill_graphs.PrefillGraphs or None
        self.graphs = None                          # the runner's GraphRunner (set by capture)
        self.device = kv_caches[0].device
        self.splits = splits or default_splits(self.device, 1, model.local_spec.num_kv_heads, max_len)

    @property
    def vocab_size(self) -> int:
        return self.model.spec.vocab_size

    def prefill(self, prompts: list[torch.Tensor], block_table: torch.Tensor, *, starts=None) -> None:
        """The prompts' K/V into the draft's caches (rows of the target's block table): through
        the draft's prefill graphs once captured (`capture`), else eagerly. starts: each prompt's
        first position (default 0: the whole context); positions below it must already be in
        the draft's pages. Non-zero starts need `attention` or the graphs."""
        host = block_table if block_table.device.type == "cpu" else None   # a host table: no read-back
        from graphrt.model.prefill_graphs import EAGER_ABOVE_TOKENS
        if self.prefill_graphs is not None and self.graphs is not None \
                and (sum(p.numel() for p in prompts) <= EAGER_ABOVE_TOKENS or self.attention is None):
            host = block_table.cpu() if host is None else host
            first = [0] * len(prompts) if starts is None else [int(x) for x in starts]
            prompts = [to_device(p, self.device) for p in prompts]
            self.model.check_prompts(prompts, self.kv_caches, host, first, host)
            self.prefill_graphs.prefill(self.graphs, prompts, host, first, self.kv_caches)
            return
        block_table = to_device(block_table, self.kv_caches[0].device)
        if self.attention is None:
            if starts is not None and any(starts):
                raise ValueError("starts: a draft prefill after cached positions needs `attention`")
            self.model.prefill(prompts, self.kv_caches, block_table, host_table=host)
            return
        self.model.prefill(prompts, self.kv_caches, block_table, attention=self.attention,
                           max_tokens=self.prefill_tokens, starts=starts, host_table=host)

    def capture(self, graphs) -> None:
        """The draft's prefill graphs into the runner's GraphRunner `graphs` (one pool); later
        prefills go through them (replayed; on a device without graphs the same step eagerly).
        No-op without prefill graphs."""
        if self.prefill_graphs is not None:
            self.prefill_graphs.capture(graphs, self.kv_caches)
            self.graphs = graphs

    def propose(self, token_buf: torch.Tensor, num_tokens: torch.Tensor, limit: torch.Tensor,
                block_table: torch.Tensor, proposals: torch.Tensor, count: torch.Tensor,
                error: torch.Tensor) -> None:
        """token_buf [B, W] int32, num_tokens [B] int32 (>= 2 for active slots), limit [B] int32
        (a slot is active when 0 < n < limit), block_table [B, P] int32 -> proposals [B, k]
        int64 (greedy draft tokens; k = its width, at most self.k: a block may run fewer
        proposals), count [B] int32 (k for active slots, 0 otherwise). error: [1] int32
        device_error of the K/V appends."""
        k = proposals.shape[1]
        if not 1 <= k <= self.k:
            raise ValueError(f"proposals: width {k} must be in [1, k={self.k}]")
        toks, base = spec_ops(self.model.kernels).draft_prep(token_buf, num_tokens, limit, k, count)  # one launch
        b = toks.shape[0]
        for j in range(k):                   # step j >= 1 feeds d_j at n + j - 1 = base + j + 1
            logits = self.model.verify_step(toks, base, self.kv_caches, block_table, error,
                                            splits=self.splits, offset=0 if j == 0 else j + 1)   # [B * q, V]
            self.model.ops.argmax_into(logits.view(b, toks.shape[1], -1)[:, -1], proposals[:, j])   # rows strided by q * V
            toks = proposals[:, j:j + 1]                                 # its column: no copy


__all__ = ["DraftProposer"]
