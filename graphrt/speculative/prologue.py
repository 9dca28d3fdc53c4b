"""A verify round's inputs from the slots' state, in one launch.

After the proposer has written each slot's proposals and their count, a round needs, per slot b
with n = tokens held (counting the current one) and limit = the most it may hold:

    active[b]     = n > 0 and n < limit                 (an empty or finished slot verifies nothing)
    count[b]      = min(count[b], cap[b])               (the slot's own k; written back in place)
    tokens[b]     = [history[b, n - 1], proposals[b, 0..k)]   [k + 1] int64: the current token first
    cache_lens[b] = n - 1 if active else -1             (K/V held before the verified tokens; -1: padding)
    proposed[b]   = count[b] if active else 0           (the round's verified proposals, for the stats)

Torch ops would take about a dozen small launches for this (compare, gather, concatenate,
select, casts); inside a captured round each is a graph node that costs the device a few
microseconds at small models. One program per slot on the GPU (many per program in the CPU
interpreter); no host sync: capturable. Runs on CPU under TRITON_INTERPRET=1. The torch set's
twin is speculative/reference.py's.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from graphrt.speculative.reference import check_round_inputs


@triton.jit(do_not_specialize=["width", "n_rows"])
def _round_inputs_kernel(hist_ptr, hist_stride, width, n_rows, num_ptr, limit_ptr, cap_ptr, prop_ptr,
                         count_ptr, tokens_ptr, cache_lens_ptr, proposed_ptr, K: tl.constexpr,
                         KB: tl.constexpr, ROWS: tl.constexpr, FILL: tl.constexpr):
    b = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    live = b < n_rows
    b = tl.where(live, b, 0)
    n = tl.load(num_ptr + b, mask=live, other=0)
    act = live & (n > 0) & (n < tl.load(limit_ptr + b, mask=live, other=0))
    if FILL:                                           # every slot proposed k (an EAGLE-3 head)
        c = tl.minimum(tl.full((ROWS,), K, tl.int32), tl.load(cap_ptr + b, mask=live, other=0))
    else:
        c = tl.minimum(tl.load(count_ptr + b, mask=live, other=0), tl.load(cap_ptr + b, mask=live, other=0))
    tl.store(count_ptr + b, c, mask=live)
    last = tl.minimum(tl.maximum(n - 1, 0), width - 1)
    cur = tl.load(hist_ptr + b.to(tl.int64) * hist_stride + last, mask=live, other=0).to(tl.int64)
    j = tl.arange(0, KB)[None, :]
    inside = (j < K) & live[:, None]
    props = tl.load(prop_ptr + b[:, None] * K + j, mask=inside, other=0)
    row = tokens_ptr + b * (K + 1)
    tl.store(row, cur, mask=live)
    tl.store(row[:, None] + 1 + j, props, mask=inside)
    tl.store(cache_lens_ptr + b, tl.where(act, n - 1, -1), mask=live)
    tl.store(proposed_ptr + b, tl.where(act, c, 0), mask=live)


def round_inputs(history: torch.Tensor, num_tokens: torch.Tensor, limit: torch.Tensor, cap: torch.Tensor,
                 proposals: torch.Tensor, count: torch.Tensor, proposed: torch.Tensor, *, full: bool = False
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """The round's verify inputs (see the module docstring) -> (tokens [B, k + 1] int64,
    cache_lens [B] int32), new tensors on the slots' device; count is capped in place and
    proposed written. full=True: every slot proposed k (count's values are not read, only
    written: min(k, cap)), as an EAGLE-3 head's are.

    history [B, W] int32 (unit column stride; row b's tokens), num_tokens / limit / cap / count /
    proposed [B] int32 contiguous, proposals [B, k] int64 contiguous (k >= 1). One device.
    """
    check_round_inputs(history, num_tokens, limit, cap, proposals, count, proposed, full)
    b = num_tokens.shape[0]
    k, dev = proposals.shape[1], proposals.device
    tokens = torch.empty((b, k + 1), dtype=torch.int64, device=dev)
    cache_lens = torch.empty(b, dtype=torch.int32, device=dev)
    rows = 1 if dev.type == "cuda" else min(64, triton.next_power_of_2(max(b, 1)))
    _round_inputs_kernel[(triton.cdiv(b, rows),)](
        history, history.stride(0), history.shape[1], b, num_tokens, limit, cap, proposals, count,
        tokens, cache_lens, proposed, K=k, KB=triton.next_power_of_2(k), ROWS=rows, FILL=full)
    return tokens, cache_lens


__all__ = ["round_inputs"]
