"""The end of a decode step, in one launch: each slot's drawn token becomes its current token, is
written into its token history (speculation's n-gram / draft input) and its length moves on.

Per slot b, with n = seq_lens[b] (tokens held counting the current one; 0 = an empty slot) and
the drawn token out[b]:

    tokens[b] = out[b]                                     (every row, as a copy would)
    history[b, min(n, H - 1)] = out[b]     if n > 0        (the drawn token's index is n)
    seq_lens[b] = n + 1                    if n > 0

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
def _step_advance_kernel(out_ptr, tokens_ptr, seq_ptr, hist_ptr, hist_stride, width, n_rows,
                         HAS_HIST: tl.constexpr, ROWS: tl.constexpr):
    b = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    live_row = b < n_rows
    b = tl.where(live_row, b, 0)
    tok = tl.load(out_ptr + b, mask=live_row, other=0)
    n = tl.load(seq_ptr + b, mask=live_row, other=0)
    live = live_row & (n > 0)
    tl.store(tokens_ptr + b, tok, mask=live_row)
    if HAS_HIST:
        at = tl.minimum(n, width - 1)
        tl.store(hist_ptr + b.to(tl.int64) * hist_stride + at, tok.to(tl.int32), mask=live)
    tl.store(seq_ptr + b, n + 1, mask=live)


def step_advance(out: torch.Tensor, tokens: torch.Tensor, seq_lens: torch.Tensor,
                 history: torch.Tensor | None = None) -> None:
    """out [B] int64 (the step's drawn tokens) -> tokens [B] int64, history [B, H] int32 (unit
    column stride) or None, seq_lens [B] int32, updated in place (module docstring). One device."""
    b = out.shape[0]
    for name, t, dt in (("out", out, torch.int64), ("tokens", tokens, torch.int64), ("seq_lens", seq_lens, torch.int32)):
        if tuple(t.shape) != (b,) or t.dtype != dt or not t.is_contiguous():
            raise ValueError(f"{name}: expected a contiguous [{b}] {dt} tensor, got {tuple(t.shape)} {t.dtype}")
    if history is not None and (history.dim() != 2 or history.shape[0] != b or history.dtype != torch.int32
                                or history.stride(1) != 1):
        raise ValueError(f"history: expected [{b}, H] int32 with unit column stride, got "
                         f"{tuple(history.shape)} {history.dtype}")
    if len({t.device for t in (out, tokens, seq_lens) + (() if history is None else (history,))}) != 1:
        raise ValueError("out, tokens, seq_lens, history: must be on one device")
    if b == 0:
        return
    rows = 1 if out.device.type == "cuda" else min(64, triton.next_power_of_2(b))
    hist = history if history is not None else out
    _step_advance_kernel[(triton.cdiv(b, rows),)](
        out, tokens, seq_lens, hist, hist.stride(0) if history is not None else 0,
        history.shape[1] if history is not None else 1, b, HAS_HIST=history is not None, ROWS=rows)


__all__ = ["step_advance"]
