"""The end of a decode step, in one launch: each slot's drawn token becomes its current token, is
written into its token history (speculation's n-gram / draft input) and its length moves on.

Per slot b, with n = seq_lens[b] (tokens held counting the current one; 0 = an empty slot),
the drawn token out[b] and, when given, limit[b] (the most tokens the row may hold; <= 0: none):

    tokens[b] = out[b]                     unless held     (every other row, as a copy would)
    history[b, min(n, H - 1)] = out[b]     if n > 0 and not held   (the drawn token's index is n)
    seq_lens[b] = n + 1                    if n > 0 and not held

held: n > 0, limit[b] > 0 and n >= limit[b]. A row at its limit keeps its current token and
length, so the next step rewrites the same K/V at position n - 1 (its last token's, cached
pages included) and its draws are not tokens (the host counts at most limit - prompt draws): a
plain block may carry rows at their limit, as speculative rounds do (speculative/accept.py).

As torch ops this is a copy, a compare, a cast and an add (a gather, a select and a scatter more
with a history): graph nodes that cost the device a few microseconds each at small models. One
program per slot on the GPU (many per program in the CPU interpreter); capturable; runs on CPU
under TRITON_INTERPRET=1.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit(do_not_specialize=["n_rows", "width"])
def _step_advance_kernel(out_ptr, tokens_ptr, seq_ptr, hist_ptr, hist_stride, width, n_rows, limit_ptr,
                         HAS_HIST: tl.constexpr, HAS_LIMIT: tl.constexpr, ROWS: tl.constexpr):
    b = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    live_row = b < n_rows
    b = tl.where(live_row, b, 0)
    tok = tl.load(out_ptr + b, mask=live_row, other=0)
    n = tl.load(seq_ptr + b, mask=live_row, other=0)
    live = live_row & (n > 0)
    if HAS_LIMIT:
        lim = tl.load(limit_ptr + b, mask=live_row, other=0)
        held = live & (lim > 0) & (n >= lim)
        live = live & (held == 0)
        live_row = live_row & (held == 0)
    tl.store(tokens_ptr + b, tok, mask=live_row)
    if HAS_HIST:
        at = tl.minimum(n, width - 1)
        tl.store(hist_ptr + b.to(tl.int64) * hist_stride + at, tok.to(tl.int32), mask=live)
    tl.store(seq_ptr + b, n + 1, mask=live)


def step_advance(out: torch.Tensor, tokens: torch.Tensor, seq_lens: torch.Tensor,
                 history: torch.Tensor | None = None, limit: torch.Tensor | None = None) -> None:
    """out [B] int64 (the step's drawn tokens) -> tokens [B] int64, history [B, H] int32 (unit
    column stride) or None, seq_lens [B] int32, updated in place; limit [B] int32 or None (the
    rows' token limits, read only). Module docstring. One device."""
    b = out.shape[0]
    checks = (("out", out, torch.int64), ("tokens", tokens, torch.int64), ("seq_lens", seq_lens, torch.int32))
    for name, t, dt in checks + ((("limit", limit, torch.int32),) if limit is not None else ()):
        if tuple(t.shape) != (b,) or t.dtype != dt or not t.is_contiguous():
            raise ValueError(f"{name}: expected a contiguous [{b}] {dt} tensor, got {tuple(t.shape)} {t.dtype}")
    if history is not None and (history.dim() != 2 or history.shape[0] != b or history.dtype != torch.int32
                                or history.stride(1) != 1):
        raise ValueError(f"history: expected [{b}, H] int32 with unit column stride, got "
                         f"{tuple(history.shape)} {history.dtype}")
    if len({t.device for t in (out, tokens, seq_lens) + tuple(x for x in (history, limit) if x is not None)}) != 1:
        raise ValueError("out, tokens, seq_lens, history, limit: must be on one device")
    if b == 0:
        return
    rows = 1 if out.device.type == "cuda" else min(64, triton.next_power_of_2(b))
    hist = history if history is not None else out
    _step_advance_kernel[(triton.cdiv(b, rows),)](
        out, tokens, seq_lens, hist, hist.stride(0) if history is not None else 0,
        history.shape[1] if history is not None else 1, b, limit if limit is not None else seq_lens,
        HAS_HIST=history is not None, HAS_LIMIT=limit is not None, ROWS=rows)


__all__ = ["step_advance"]
