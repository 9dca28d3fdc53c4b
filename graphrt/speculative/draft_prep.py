"""A draft-model round's inputs in one launch (speculative/draft.py's DraftProposer runs it).

For a slot holding n tokens: its last two tokens (history[n - 2], history[n - 1], indices clamped
into the row), the base position n - 2 (-1 for an idle slot: empty, or n >= limit) and its
proposal count (k, or 0 idle). One program per slot on the GPU (many per program in the CPU
interpreter); no host sync: capturable. Runs on CPU under TRITON_INTERPRET=1. The torch set's
twin, and the argument check both call, is speculative/reference.py's `draft_prep`.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from graphrt.speculative.reference import check_draft_prep


@triton.jit(do_not_specialize=["width", "n_rows"])
def _draft_prep_kernel(hist_ptr, hist_stride, width, num_ptr, limit_ptr, toks_ptr, base_ptr, count_ptr, n_rows,
                       K: tl.constexpr, ROWS: tl.constexpr):
    b = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    live = b < n_rows
    b = tl.where(live, b, 0)
    n = tl.load(num_ptr + b, mask=live, other=0)
    act = (n > 0) & (n < tl.load(limit_ptr + b, mask=live, other=0))
    row = hist_ptr + b.to(tl.int64) * hist_stride
    for j in tl.static_range(2):                      # tokens n - 2, n - 1 (clamped into the row)
        at = tl.minimum(tl.maximum(n - 2 + j, 0), width - 1)
        tl.store(toks_ptr + b * 2 + j, tl.load(row + at, mask=live, other=0).to(tl.int64), mask=live)
    tl.store(base_ptr + b, tl.where(act, n - 2, -1), mask=live)
    tl.store(count_ptr + b, tl.where(act, K, 0), mask=live)


def draft_prep(history: torch.Tensor, num_tokens: torch.Tensor, limit: torch.Tensor, k: int, count: torch.Tensor
               ) -> tuple[torch.Tensor, torch.Tensor]:
    """A draft round's inputs in one launch (as torch ops: about fifteen small launches, each a
    graph node). history [B, W] int32 (unit column stride), num_tokens / limit [B] int32, k:
    proposals a round -> (tokens [B, 2] int64: history[b, n - 2], history[b, n - 1] (indices
    clamped into [0, W)), base [B] int32: n - 2 for an active slot (0 < n < limit), else -1);
    count [B] int32 <- k for an active slot, else 0 (in place). Capturable."""
    check_draft_prep(history, num_tokens, limit, k, count)
    b = num_tokens.shape[0]
    dev = history.device
    toks = torch.empty((b, 2), dtype=torch.int64, device=dev)
    base = torch.empty(b, dtype=torch.int32, device=dev)
    if b:
        rows = 1 if dev.type == "cuda" else min(64, triton.next_power_of_2(b))
        _draft_prep_kernel[(triton.cdiv(b, rows),)](history, history.stride(0), history.shape[1], num_tokens, limit,
                                                    toks, base, count, b, K=k, ROWS=rows)
    return toks, base


__all__ = ["draft_prep"]
