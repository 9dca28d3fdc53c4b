"""Acceptance of proposed tokens on the device, and the advance of each slot's state.

Row b verified Q = k + 1 query tokens: its current token and k proposals x_0..x_{k-1}, of
which the first count[b] are real. Target logits row (b, j) is the distribution of the token
after x_{j-1} (after the current token for j = 0).

- Greedy rows (temperature 0): accept x_j while x_j == argmax_j (torch.argmax's rule: lowest id
  among ties); emit the accepted x's and then argmax at the first mismatch (or the bonus argmax
  after all count proposals). Same tokens as plain greedy decoding.
- Sampled rows: the proposal is a point mass (n-gram), so x_j is accepted with probability
  p_j(x_j) (p = softmax(logits / T)); on reject the token is drawn from p_j with x_j removed,
  renormalised; after all count accepted, the bonus token is drawn from p_count. The emitted
  tokens then follow the target distribution exactly (Chen et al. 2023 with q = point mass).
  Randomness is keyed like kernels/sample.py: Philox(key = seed_b, counter = (t, token id)) with
  t = step[b] + j the request's own draw index of that output position; the acceptance uniform
  uses token field V (no token has that id). So a seeded request draws the same tokens whatever
  else is in the batch.

Two launches: `judge` (one program per row of B * Q on the GPU: a vocabulary pass, all rows
in parallel) writes
accept [B, Q] and fallback [B, Q]; `advance` (grid B) takes the accepted prefix, clips it to
the slot's token limit and writes the tokens into the slot's token buffer, moving num_tokens and
step. No host sync: capturable. Runs on CPU under TRITON_INTERPRET=1.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK_V = 1024


@triton.jit(do_not_specialize=["vocab", "n_rows"])
def _judge_kernel(logits_ptr, vocab, n_rows, prop_ptr, count_ptr, temp_ptr, seed_ptr, step_ptr,
                  accept_ptr, fallback_ptr, Q: tl.constexpr, ROWS: tl.constexpr,
                  BLOCK: tl.constexpr):
    r = tl.program_id(0) * ROWS + tl.arange(0, ROWS)  # rows r = b * Q + j
    live = r < n_rows
    r = tl.where(live, r, 0)
    b = r // Q
    j = r % Q
    row = logits_ptr + r.to(tl.int64)[:, None] * vocab
    count = tl.load(count_ptr + b)
    has_x = j < count
    x = tl.load(prop_ptr + b * (Q - 1) + tl.minimum(j, Q - 2))      # Q >= 2: always in bounds
    x = tl.where(has_x, x, -1).to(tl.int64)
    temp = tl.load(temp_ptr + b)
    offs = tl.arange(0, BLOCK)[None, :]
    # greedy: argmax (first maximum), one pass
    best = tl.full((ROWS,), float("-inf"), tl.float32)
    best_tok = tl.zeros((ROWS,), tl.int64)
    for start in range(0, vocab, BLOCK):
        i = start + offs
        v = tl.load(row + i, mask=i < vocab, other=float("-inf")).to(tl.float32)
        m = tl.max(v, axis=1)
        tok = (tl.argmax(v, axis=1) + start).to(tl.int64)
        best_tok = tl.where(m > best, tok, best_tok)
        best = tl.maximum(best, m)
    accept = has_x & (best_tok == x)
    fallback = best_tok
    if tl.max(tl.where(live, temp, 0.0), axis=0) > 0:  # some row samples
        safe_t = tl.where(temp > 0, temp, 1.0)[:, None]
        seed = tl.load(seed_ptr + b)[:, None]
        t = (tl.load(step_ptr + b) + j).to(tl.int64)[:, None]
        z = tl.zeros((ROWS,), tl.float32)
        g_best = tl.full((ROWS,), float("-inf"), tl.float32)
        g_tok = tl.zeros((ROWS,), tl.int64)
        for start in range(0, vocab, BLOCK):
            i = start + offs
            v = tl.load(row + i, mask=i < vocab, other=float("-inf")).to(tl.float32)
            e = (v - best[:, None]) / safe_t
            z += tl.sum(tl.where(i < vocab, tl.exp(e), 0.0), axis=1)
            u = tl.rand(seed, (t << 32) | i.to(tl.int64))
            score = tl.where((i < vocab) & (i != x[:, None]), e - tl.log(-tl.log(u)),
                             float("-inf"))
            m = tl.max(score, axis=1)
            tok = (tl.argmax(score, axis=1) + start).to(tl.int64)
            g_tok = tl.where(m > g_best, tok, g_tok)
            g_best = tl.maximum(g_best, m)
        lx = tl.load(logits_ptr + r.to(tl.int64) * vocab + tl.maximum(x, 0)).to(tl.float32)
        p_x = tl.exp((lx - best) / safe_t.reshape(ROWS)) / z
        u_acc = tl.rand(seed.reshape(ROWS), (t.reshape(ROWS) << 32) | vocab)
        sampled = temp > 0
        accept = tl.where(sampled, has_x & (u_acc < p_x), accept)
        fallback = tl.where(sampled, g_tok, fallback)  # residual draw (x excluded) or the bonus
    tl.store(accept_ptr + r, accept.to(tl.int32), mask=live)
    tl.store(fallback_ptr + r, fallback, mask=live)


@triton.jit(do_not_specialize=["width", "n_rows"])
def _advance_kernel(accept_ptr, fallback_ptr, prop_ptr, tok_ptr, tok_stride, width, n_rows,
                    num_ptr, limit_ptr, step_ptr, out_ptr, emitted_ptr, Q: tl.constexpr,
                    QB: tl.constexpr, ROWS: tl.constexpr):
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


def _rows_per_program(device: torch.device, n: int) -> int:
    """1 row per program on the GPU (parallel programs); many in the CPU interpreter, whose cost
    is per program."""
    return 1 if device.type == "cuda" else min(64, triton.next_power_of_2(n))


def _need(cond: bool, msg: str) -> None:
    if not cond:
        raise ValueError(msg)


def judge(logits: torch.Tensor, proposals: torch.Tensor, count: torch.Tensor,
          temperature: torch.Tensor, seed: torch.Tensor, step: torch.Tensor,
          accept: torch.Tensor, fallback: torch.Tensor) -> None:
    """Per verified position: accept [B, Q] int32 (1 = proposal j accepted if reached) and
    fallback [B, Q] int64 (the token emitted if position j is where the row stops).

    logits [B * Q, V] or [B, Q, V] (any float dtype), proposals [B, Q - 1] int64, count [B]
    int32 (real proposals per row), temperature [B] float32 (0 = greedy), seed [B] int64,
    step [B] int32 (draw index of the row's first emitted token this round). One device.
    """
    b, q = accept.shape
    _need(accept.dtype == torch.int32 and accept.is_contiguous(), "accept: expected contiguous [B, Q] int32")
    _need(tuple(fallback.shape) == (b, q) and fallback.dtype == torch.int64 and fallback.is_contiguous(),
          f"fallback: expected contiguous [{b}, {q}] int64, got {tuple(fallback.shape)} {fallback.dtype}")
    logits = logits.reshape(b * q, -1)
    _need(logits.is_contiguous() and logits.is_floating_point(),
          f"logits: expected contiguous [B * Q = {b * q}, V] floats, got {tuple(logits.shape)}")
    _need(q >= 2 and tuple(proposals.shape) == (b, q - 1) and proposals.dtype == torch.int64
          and proposals.is_contiguous(),
          f"proposals: expected contiguous [{b}, {q - 1}] int64 (Q >= 2), got "
          f"{tuple(proposals.shape)} {proposals.dtype}")
    for name, t, dt in (("count", count, torch.int32), ("temperature", temperature, torch.float32),
                        ("seed", seed, torch.int64), ("step", step, torch.int32)):
        _need(tuple(t.shape) == (b,) and t.dtype == dt, f"{name}: expected [{b}] {dt}, got "
              f"{tuple(t.shape)} {t.dtype}")
    vocab, rows = logits.shape[1], _rows_per_program(logits.device, b * q)
    block = min(BLOCK_V, triton.next_power_of_2(vocab))
    if rows > 1:
        block = min(block, max(16, 4096 // rows))
    _judge_kernel[(triton.cdiv(b * q, rows),)](
        logits, vocab, b * q, proposals, count, temperature, seed, step, accept, fallback,
        Q=q, ROWS=rows, BLOCK=block, num_warps=4)


def advance(accept: torch.Tensor, fallback: torch.Tensor, proposals: torch.Tensor,
            token_buf: torch.Tensor, num_tokens: torch.Tensor, limit: torch.Tensor,
            step: torch.Tensor, out_tokens: torch.Tensor, emitted: torch.Tensor) -> None:
    """Emit each row's accepted prefix + its fallback token, clipped to the slot's limit.

    accept [B, Q] int32, fallback [B, Q] int64 (from `judge`), proposals [B, Q - 1] int64;
    token_buf [B, W] int32 (row b's tokens; the emitted ones are written at num_tokens[b]..),
    num_tokens [B] int32 (tokens held; 0 = empty slot, emits nothing), limit [B] int32 (the
    most tokens the slot may hold: prompt + max_tokens; clipped to W), step [B] int32 (advanced
    by the emitted count); out_tokens [B, Q] int64 (-1 past the emitted ones), emitted [B] int32.
    """
    b, q = accept.shape
    _need(token_buf.dim() == 2 and token_buf.shape[0] == b and token_buf.dtype == torch.int32
          and token_buf.stride(1) == 1, f"token_buf: expected [{b}, W] int32, got "
          f"{tuple(token_buf.shape)} {token_buf.dtype}")
    for name, t in (("num_tokens", num_tokens), ("limit", limit), ("step", step), ("emitted", emitted)):
        _need(tuple(t.shape) == (b,) and t.dtype == torch.int32, f"{name}: expected [{b}] int32, "
              f"got {tuple(t.shape)} {t.dtype}")
    _need(tuple(out_tokens.shape) == (b, q) and out_tokens.dtype == torch.int64
          and out_tokens.is_contiguous(), f"out_tokens: expected contiguous [{b}, {q}] int64, got "
          f"{tuple(out_tokens.shape)} {out_tokens.dtype}")
    rows = _rows_per_program(accept.device, b)
    _advance_kernel[(triton.cdiv(b, rows),)](
        accept, fallback, proposals, token_buf, token_buf.stride(0), token_buf.shape[1], b,
        num_tokens, limit, step, out_tokens, emitted, Q=q, QB=triton.next_power_of_2(q), ROWS=rows)


__all__ = ["judge", "advance"]
