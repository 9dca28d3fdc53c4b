"""The torch references of the speculative kernels: n-gram lookup, a round's inputs, acceptance,
the advance of each slot, a draft round's inputs.

As kernels/reference_sample.py for the drawing kernels: the kernel tests' oracle and the torch
set's implementation (speculative/ops.py picks the set of the target model's kernels), so a CPU
speculates without Triton. Same signatures, in-place outputs and argument checks (kept here; the
Triton wrappers call them). The rules are the kernels' module docstrings': ngram.py (the longest
suffix match, latest occurrence), prologue.py (count capped, current token + proposals, cache
lengths), accept.py (the sampler's draw at each verified position, the accepted prefix clipped to
the slot's limit, tokens written into its history), draft.py (the last two tokens, the base
position). Integer work, equal to the kernels' outputs element for element; acceptance draws
with kernels/reference_sample.py's sampler, which draws what kernels/sample.py draws. No host
sync. This module imports no Triton.
"""
from __future__ import annotations

import torch

from graphrt.kernels.reference_sample import sample_tokens


def _need(cond: bool, msg: str) -> None:
    if not cond:
        raise ValueError(msg)


# ---- n-gram lookup (speculative/ngram.py) ------------------------------------------------------
def check_ngram(tokens, lens, out, count, min_n, max_n) -> None:
    if tokens.dim() != 2 or tokens.dtype != torch.int32 or tokens.stride(1) != 1:
        raise ValueError(f"tokens: expected [S, W] int32 with unit column stride, got "
                         f"{tuple(tokens.shape)} {tokens.dtype}")
    s = tokens.shape[0]
    if tuple(lens.shape) != (s,) or lens.dtype != torch.int32:
        raise ValueError(f"lens: expected [{s}] int32, got {tuple(lens.shape)} {lens.dtype}")
    if out.dim() != 2 or out.shape[0] != s or out.dtype != torch.int64 or not out.is_contiguous():
        raise ValueError(f"out: expected contiguous [{s}, k] int64, got {tuple(out.shape)} {out.dtype}")
    if tuple(count.shape) != (s,) or count.dtype != torch.int32:
        raise ValueError(f"count: expected [{s}] int32, got {tuple(count.shape)} {count.dtype}")
    if not 1 <= min_n <= max_n:
        raise ValueError(f"min_n, max_n: need 1 <= min_n <= max_n, got {min_n}, {max_n}")
    if len({t.device for t in (tokens, lens, out, count)}) != 1:
        raise ValueError("tokens, lens, out, count: must be on one device")


def ngram_propose(tokens: torch.Tensor, lens: torch.Tensor, out: torch.Tensor, count: torch.Tensor,
                  *, min_n: int, max_n: int) -> None:
    """speculative/ngram.py's ngram_propose: out[s, :count[s]] <- slot s's proposal."""
    check_ngram(tokens, lens, out, count, min_n, max_n)
    s, width = tokens.shape
    k, dev = out.shape[1], tokens.device
    n_tok = lens.to(torch.int64).clamp(max=width)                        # [S]
    e = torch.arange(width, device=dev)[None, :]                          # candidate ends [1, W]
    valid = e < (n_tok - 1)[:, None]
    m = torch.zeros((s, width), dtype=torch.int64, device=dev)
    alive = valid
    for j in range(max_n):                    # the suffix's j-th token from its end, against e - j
        ok = alive & (e - j >= 0)
        a = tokens.gather(1, (e - j).clamp_min(0).expand(s, width))
        b = tokens.gather(1, (n_tok - 1 - j).clamp_min(0)[:, None])
        alive = ok & (a == b)
        m += alive.to(torch.int64)
    score = torch.where(valid & (m >= min_n), m * width + e, -1)
    best = score.max(1).values                                            # [S] (-1: no match)
    j = torch.arange(k, device=dev)[None, :]
    src = torch.where(best >= 0, best % width + 1, n_tok)[:, None] + j   # [S, k]
    keep = src < n_tok[:, None]
    out.copy_(torch.where(keep, tokens.gather(1, src.clamp(max=width - 1)).to(torch.int64), 0))
    count.copy_(keep.sum(1))


# ---- a round's inputs (speculative/prologue.py) -------------------------------------------------
def check_round_inputs(history, num_tokens, limit, cap, proposals, count, proposed, full) -> None:
    b = num_tokens.shape[0]
    if history.dim() != 2 or history.shape[0] != b or history.dtype != torch.int32 or history.stride(1) != 1:
        raise ValueError(f"history: expected [{b}, W] int32 with unit column stride, got "
                         f"{tuple(history.shape)} {history.dtype}")
    for name, t in (("num_tokens", num_tokens), ("limit", limit), ("cap", cap), ("count", count),
                    ("proposed", proposed)):
        if tuple(t.shape) != (b,) or t.dtype != torch.int32 or not t.is_contiguous():
            raise ValueError(f"{name}: expected a contiguous [{b}] int32 tensor, got {tuple(t.shape)} {t.dtype}")
    if proposals.dim() != 2 or proposals.shape[0] != b or proposals.shape[1] < 1 \
            or proposals.dtype != torch.int64 or not proposals.is_contiguous():
        raise ValueError(f"proposals: expected a contiguous [{b}, k >= 1] int64 tensor, got "
                         f"{tuple(proposals.shape)} {proposals.dtype}")
    if len({t.device for t in (history, num_tokens, limit, cap, proposals, count, proposed)}) != 1:
        raise ValueError("history, num_tokens, limit, cap, proposals, count, proposed: must be on one device")
    if not isinstance(full, bool):
        raise ValueError(f"full: expected a bool, got {full!r}")


def round_inputs(history: torch.Tensor, num_tokens: torch.Tensor, limit: torch.Tensor, cap: torch.Tensor,
                 proposals: torch.Tensor, count: torch.Tensor, proposed: torch.Tensor, *, full: bool = False
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """speculative/prologue.py's round_inputs -> (tokens [B, k + 1] int64, cache_lens [B] int32);
    count capped in place, proposed written."""
    check_round_inputs(history, num_tokens, limit, cap, proposals, count, proposed, full)
    k, width = proposals.shape[1], history.shape[1]
    n = num_tokens.to(torch.int64)
    act = (n > 0) & (n < limit)
    c = torch.minimum(torch.full_like(cap, k) if full else count, cap)
    count.copy_(c)
    cur = history.gather(1, (n - 1).clamp(0, width - 1)[:, None]).to(torch.int64)
    proposed.copy_(torch.where(act, c, 0))
    return torch.cat([cur, proposals], dim=1), torch.where(act, n - 1, -1).to(torch.int32)


# ---- acceptance and advance (speculative/accept.py) ---------------------------------------------
def check_judge(logits, proposals, count, temperature, seed, step, accept, fallback, top_k, top_p):
    """judge's contract -> (logits as [B * Q, V], filtered, top_k, top_p: the sampler's arguments)."""
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
    filtered = top_k is not None or top_p is not None
    dev = logits.device
    if filtered:
        top_k = torch.zeros(b, dtype=torch.int32, device=dev) if top_k is None else top_k
        top_p = torch.ones(b, dtype=torch.float32, device=dev) if top_p is None else top_p
    for name, t, dt in (("count", count, torch.int32), ("temperature", temperature, torch.float32),
                        ("seed", seed, torch.int64), ("step", step, torch.int32),
                        ("top_k", top_k, torch.int32), ("top_p", top_p, torch.float32)):
        if t is not None:
            _need(tuple(t.shape) == (b,) and t.dtype == dt, f"{name}: expected [{b}] {dt}, got "
                  f"{tuple(t.shape)} {t.dtype}")
    # unfiltered: the sampler reads no top_k / top_p (any [B] tensors of the right size stand in)
    return logits, filtered, top_k if filtered else step, top_p if filtered else temperature


def judge(logits: torch.Tensor, proposals: torch.Tensor, count: torch.Tensor,
          temperature: torch.Tensor, seed: torch.Tensor, step: torch.Tensor,
          accept: torch.Tensor, fallback: torch.Tensor, *, top_k: torch.Tensor | None = None,
          top_p: torch.Tensor | None = None) -> None:
    """speculative/accept.py's judge: fallback [B, Q] <- the sampler's draw at each verified
    position (slot b's row at draw index step[b] + j); accept [B, Q] <- 1 where proposal j < count
    equals it (0 at Q - 1)."""
    b, q = accept.shape
    flat, filtered, k_arg, p_arg = check_judge(logits, proposals, count, temperature, seed, step, accept,
                                               fallback, top_k, top_p)
    sample_tokens(flat, temperature, k_arg, p_arg, seed, step, fallback.view(b * q), advance=False,
                  filtered=filtered, rows_per_slot=q)
    j = torch.arange(q - 1, device=accept.device)[None, :]
    hit = (j < count[:, None]) & (fallback[:, :q - 1] == proposals)
    accept.copy_(torch.cat([hit, torch.zeros_like(hit[:, :1])], dim=1))


def check_advance(accept, fallback, proposals, token_buf, num_tokens, limit, step, out_tokens, emitted,
                  current) -> None:
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
    _need(current is None or (tuple(current.shape) == (b,) and current.dtype == torch.int64
                              and current.is_contiguous() and current.device == accept.device),
          f"current: expected contiguous [{b}] int64 on {accept.device}, got "
          f"{None if current is None else (tuple(current.shape), current.dtype, str(current.device))}")


def advance(accept: torch.Tensor, fallback: torch.Tensor, proposals: torch.Tensor,
            token_buf: torch.Tensor, num_tokens: torch.Tensor, limit: torch.Tensor,
            step: torch.Tensor, out_tokens: torch.Tensor, emitted: torch.Tensor, *,
            current: torch.Tensor | None = None) -> None:
    """speculative/accept.py's advance: each row's accepted prefix + its fallback token, clipped
    to the slot's limit, into out_tokens (-1 past them) and token_buf at num_tokens; num_tokens
    and step += emitted; current (optional) <- each non-empty slot's last token."""
    check_advance(accept, fallback, proposals, token_buf, num_tokens, limit, step, out_tokens, emitted, current)
    b, q = accept.shape
    width, dev = token_buf.shape[1], accept.device
    j = torch.arange(q, device=dev)[None, :]
    a = torch.where(accept == 0, j, q).min(1).values.clamp(max=q - 1)[:, None]   # accepted prefix [B, 1]
    x = torch.cat([proposals, torch.zeros_like(proposals[:, :1])], dim=1)           # [B, Q]
    toks = torch.where(j < a, x, fallback)
    n = num_tokens.to(torch.int64)[:, None]
    lim = limit.to(torch.int64).clamp(max=width)[:, None]
    e = torch.minimum(a + 1, lim - n).clamp_min(0)
    e = torch.where(n > 0, e, 0)                                          # an empty slot emits nothing
    keep = j < e
    out_tokens.copy_(torch.where(keep, toks, -1))
    cols = torch.arange(width, device=dev)[None, :]
    at = (cols >= n) & (cols < n + e)                                     # the emitted tokens' columns
    new = toks.gather(1, (cols - n).clamp(0, q - 1))
    held = token_buf.gather(1, (n - 1).clamp(0, width - 1))[:, 0].to(torch.int64)   # before the writes
    token_buf.copy_(torch.where(at, new.to(token_buf.dtype), token_buf))
    e1 = e[:, 0]
    if current is not None:
        last = toks.gather(1, (e - 1).clamp_min(0))[:, 0]
        current.copy_(torch.where(n[:, 0] > 0, torch.where(e1 > 0, last, held), current))
    num_tokens.add_(e1.to(num_tokens.dtype))
    step.add_(e1.to(step.dtype))
    emitted.copy_(e1)


# ---- a draft round's inputs (speculative/draft_prep.py) -----------------------------------------
def check_draft_prep(history, num_tokens, limit, k, count) -> None:
    b = num_tokens.shape[0]
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"k: must be an int >= 1, got {k!r}")
    if history.dim() != 2 or history.shape[0] != b or history.dtype != torch.int32 or history.stride(1) != 1:
        raise ValueError(f"history: expected [{b}, W] int32 with unit column stride, got "
                         f"{tuple(history.shape)} {history.dtype}")
    for name, t in (("num_tokens", num_tokens), ("limit", limit), ("count", count)):
        if tuple(t.shape) != (b,) or t.dtype != torch.int32 or not t.is_contiguous() or t.device != history.device:
            raise ValueError(f"{name}: expected a contiguous [{b}] int32 tensor on {history.device}, got "
                             f"{tuple(t.shape)} {t.dtype} on {t.device}")


def draft_prep(history: torch.Tensor, num_tokens: torch.Tensor, limit: torch.Tensor, k: int, count: torch.Tensor
               ) -> tuple[torch.Tensor, torch.Tensor]:
    """speculative/draft_prep.py's draft_prep -> (tokens [B, 2] int64: history[b, n - 2],
    history[b, n - 1] (indices clamped into [0, W)), base [B] int32: n - 2 for an active slot
    (0 < n < limit), else -1); count <- k for an active slot, else 0 (in place)."""
    check_draft_prep(history, num_tokens, limit, k, count)
    width = history.shape[1]
    n = num_tokens.to(torch.int64)
    act = (n > 0) & (n < limit)
    at = (n[:, None] - 2 + torch.arange(2, device=history.device)[None, :]).clamp(0, width - 1)
    count.copy_(torch.where(act, k, 0))
    return history.gather(1, at).to(torch.int64), torch.where(act, n - 2, -1).to(torch.int32)


__all__ = ["ngram_propose", "round_inputs", "judge", "advance", "draft_prep", "check_ngram", "check_round_inputs",
           "check_judge", "check_advance", "check_draft_prep"]
