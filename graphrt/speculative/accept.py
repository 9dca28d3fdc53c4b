"""Acceptance of proposed tokens on the device, and the advance of each slot's state.

Row b verified Q = k + 1 query tokens: its current token and k proposals x_0..x_{k-1}, of
which the first count[b] are real. Target logits row (b, j) is the distribution of the token
after x_{j-1} (after the current token for j = 0).

Acceptance uses decode's sampling rule itself (kernels/sample.py, one implementation): each
verified row (b, j) draws y_{b,j} = the token plain decoding would draw from those logits at the
request's draw index t = step[b] + j (same temperature, kept set of top-k / top-p, Philox/Gumbel
noise keyed by (seed, t, token id); greedy: argmax, lowest id among ties). Proposal x_j is
accepted iff y_{b,j} == x_j; the row stops at its first rejection (or after its count
proposals) and emits y there. Proposals are point masses (n-gram lookup, greedy draft), so this is
exact rejection sampling (Chen et al. 2023 with q = point mass): P(accept x) = p(x), and on
reject y follows p with x removed, renormalised; the bonus token follows p. More: a seeded request
emits exactly the tokens sampled decoding would emit from the same logits, whatever else is in the
batch, whether or not it speculates.

`judge` (the sampler over all B * Q rows, reading each slot's sampling row for its Q rows, then
one comparison launch) writes accept [B, Q] and fallback [B, Q]; `advance` (grid B) takes the
accepted prefix, clips it to the slot's token limit and writes the tokens into the slot's token
buffer, moving num_tokens and step. No host sync: capturable. Runs on CPU under TRITON_INTERPRET=1.
The torch set's twins, and the argument checks both call, are speculative/reference.py's.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from graphrt.kernels.sample import sample_tokens
from graphrt.speculative.reference import check_advance, check_judge


@triton.jit(do_not_specialize=["width", "n_rows"])
def _advance_kernel(accept_ptr, fallback_ptr, prop_ptr, tok_ptr, tok_stride, width, n_rows,
                    num_ptr, limit_ptr, step_ptr, out_ptr, emitted_ptr, cur_ptr, Q: tl.constexpr,
                    QB: tl.constexpr, ROWS: tl.constexpr, CUR: tl.constexpr):
    b1 = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    live1 = b1 < n_rows
    b1 = tl.where(live1, b1, 0)
    b = b1[:, None]
    live = live1[:, None]
    j = tl.arange(0, QB)[None, :]
    inq = (j < Q) & live
    acc = tl.load(accept_ptr + b * Q + j, mask=inq, other=0)
    # a = length of the accepted prefix: the first j that is not accepted
    a = tl.min(tl.where((j < Q) & (acc == 0), j, Q), axis=1)
    a = tl.minimum(a, Q - 1)[:, None]                  # position Q-1 is never a proposal
    x = tl.load(prop_ptr + b * (Q - 1) + j, mask=(j < a) & live, other=0)
    fb = tl.load(fallback_ptr + b * Q + j, mask=inq, other=0)
    toks = tl.where(j < a, x, fb)
    n1 = tl.load(num_ptr + b1, mask=live1, other=0)
    n = n1[:, None]
    limit = tl.minimum(tl.load(limit_ptr + b, mask=live, other=0), width)
    emitted = tl.maximum(tl.minimum(a + 1, limit - n), 0)
    emitted = tl.where(n > 0, emitted, 0)              # an empty slot emits nothing
    keep = (j < emitted) & live
    tl.store(out_ptr + b * Q + j, tl.where(keep, toks, -1), mask=inq)
    tl.store(tok_ptr + b.to(tl.int64) * tok_stride + n + j, toks.to(tl.int32), mask=keep)
    e1 = tl.sum(tl.where(j == 0, emitted, 0), axis=1)
    tl.store(num_ptr + b1, n1 + e1, mask=live1)
    tl.store(step_ptr + b1, tl.load(step_ptr + b1, mask=live1, other=0) + e1, mask=live1)
    tl.store(emitted_ptr + b1, e1, mask=live1)
    if CUR:   # the slot's current token: its last emitted one, else the one it held (row n - 1)
        last = tl.sum(tl.where(j == emitted - 1, toks, 0), axis=1)
        held = tl.load(tok_ptr + b1.to(tl.int64) * tok_stride + tl.minimum(tl.maximum(n1 - 1, 0), width - 1),
                       mask=live1 & (n1 > 0) & (e1 == 0), other=0)
        tl.store(cur_ptr + b1, tl.where(e1 > 0, last, held.to(tl.int64)), mask=live1 & (n1 > 0))


@triton.jit(do_not_specialize=["n_rows"])
def _accept_kernel(fallback_ptr, prop_ptr, count_ptr, accept_ptr, n_rows, Q: tl.constexpr, QB: tl.constexpr,
                   ROWS: tl.constexpr):
    """accept[b, j] = j < count[b] and fallback[b, j] == proposals[b, j] (j < Q - 1); 0 at Q - 1."""
    b1 = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    live1 = b1 < n_rows
    b1 = tl.where(live1, b1, 0)
    b, live = b1[:, None], live1[:, None]
    j = tl.arange(0, QB)[None, :]
    prop = (j < Q - 1) & live
    c = tl.load(count_ptr + b, mask=live, other=0)
    x = tl.load(prop_ptr + b * (Q - 1) + j, mask=prop, other=-1)
    y = tl.load(fallback_ptr + b * Q + j, mask=prop, other=-2)
    tl.store(accept_ptr + b * Q + j, (prop & (j < c) & (x == y)).to(tl.int32), mask=(j < Q) & live)


def _rows_per_program(device: torch.device, n: int) -> int:
    """1 row per program on the GPU (parallel programs); many in the CPU interpreter, whose cost
    is per program."""
    return 1 if device.type == "cuda" else min(64, triton.next_power_of_2(n))


def judge(logits: torch.Tensor, proposals: torch.Tensor, count: torch.Tensor,
          temperature: torch.Tensor, seed: torch.Tensor, step: torch.Tensor,
          accept: torch.Tensor, fallback: torch.Tensor, *, top_k: torch.Tensor | None = None,
          top_p: torch.Tensor | None = None) -> None:
    """Per verified position: accept [B, Q] int32 (1 = proposal j accepted if reached) and
    fallback [B, Q] int64 (the token emitted if position j is where the row stops).

    logits [B * Q, V] or [B, Q, V] (any float dtype), proposals [B, Q - 1] int64, count [B]
    int32 (real proposals per row), temperature [B] float32 (0 = greedy), seed [B] int64,
    step [B] int32 (draw index of the row's first emitted token this round); top_k [B] int32
    (0 = off) and top_p [B] float32 in (0, 1] (1 = off): the sampler's kept set, applied when
    either is given (a sort per verified row); None: no row uses them. One device.
    """
    b, q = accept.shape
    logits, filtered, k_arg, p_arg = check_judge(logits, proposals, count, temperature, seed, step, accept,
                                                 fallback, top_k, top_p)
    dev = logits.device
    # row b * Q + j draws with slot b's sampling row at draw index step[b] + j (the sampler reads
    # the [B] rows per slot: no [B * Q] copies)
    sample_tokens(logits, temperature, k_arg, p_arg, seed, step, fallback.view(b * q), advance=False,
                  filtered=filtered, rows_per_slot=q)
    rows = _rows_per_program(dev, b)
    _accept_kernel[(triton.cdiv(b, rows),)](fallback, proposals, count, accept, b, Q=q,
                                           QB=triton.next_power_of_2(q), ROWS=rows)


def advance(accept: torch.Tensor, fallback: torch.Tensor, proposals: torch.Tensor,
            token_buf: torch.Tensor, num_tokens: torch.Tensor, limit: torch.Tensor,
            step: torch.Tensor, out_tokens: torch.Tensor, emitted: torch.Tensor, *,
            current: torch.Tensor | None = None) -> None:
    """Emit each row's accepted prefix + its fallback token, clipped to the slot's limit.

    accept [B, Q] int32, fallback [B, Q] int64 (from `judge`), proposals [B, Q - 1] int64;
    token_buf [B, W] int32 (row b's tokens; the emitted ones are written at num_tokens[b]..),
    num_tokens [B] int32 (tokens held; 0 = empty slot, emits nothing), limit [B] int32 (the
    most tokens the slot may hold: prompt + max_tokens; clipped to W), step [B] int32 (advanced
    by the emitted count); out_tokens [B, Q] int64 (-1 past the emitted ones), emitted [B] int32;
    current: optional [B] int64 (contiguous): each non-empty slot's current token afterwards
    (token_buf[b, num_tokens[b] - 1]: the last emitted one, or the one it held), for the decode
    graphs that read it; an empty slot's entry is left as it is.
    """
    check_advance(accept, fallback, proposals, token_buf, num_tokens, limit, step, out_tokens, emitted, current)
    b, q = accept.shape
    rows = _rows_per_program(accept.device, b)
    _advance_kernel[(triton.cdiv(b, rows),)](
        accept, fallback, proposals, token_buf, token_buf.stride(0), token_buf.shape[1], b,
        num_tokens, limit, step, out_tokens, emitted, current if current is not None else out_tokens,
        Q=q, QB=triton.next_power_of_2(q), ROWS=rows, CUR=current is not None)


__all__ = ["judge", "advance"]
