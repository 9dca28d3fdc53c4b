"""On-device sampling: greedy, temperature, top-k, top-p with a per-row seed (graph-capturable).

The one sampling rule of graphrt: decode sampling and speculative acceptance both draw here.
Row r draws its token at draw index t with Gumbel-max over the kept tokens:
argmax_i ((l_i - l_max) / T + g_i), g_i = -log(-log(u)), u = Philox(key = seed_r, counter =
(t, token id)). So the randomness of a row depends only on (seed_r, t, token id): not on the
batch, its order, the bucket, K, or whether the row is a decode step or a verified position.
Exact score ties (measure zero) go to the lowest token id.

Kept tokens are a prefix of the logits sorted in descending order (torch.sort, stable, on the
device): the first top_k (0 = all), then, over that renormalised top-k distribution, the
smallest prefix whose mass reaches top_p (vLLM's order: temperature, top-k, top-p).
Temperature 0 takes the maximum logit, lowest id among ties (== torch.argmax).
`filtered=False` skips the sort (no row may use top-k / top-p: they are ignored); it draws the
same token as the sorted path (same scores, same tie rule): the greedy token and the row max come
from kernels/argmax.py's chunked pass, then one vocabulary pass scores the sampled rows.
Grid: one row per program on the GPU, many per program in the CPU interpreter (whose cost is per
program). No host sync, no allocation besides torch.sort's outputs (filtered) or the row maxima
and argmax_into's chunk scratch (unfiltered), all of shapes fixed by [B, V].
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from graphrt.kernels.argmax import BIG as _BIG, argmax_into   # _BIG: the lowest-id tie rule's neutral element
from graphrt.kernels.reference_sample import check_sample_args

BLOCK = 1024


@triton.jit
def gumbel_score(v, top, safe_t, seed, t_shifted, tok):
    """The sampling rule's Gumbel-max score of token ids `tok` with float32 logits `v` (any
    broadcastable shapes): (v - top) / T - log(-log(u)), u Philox-uniform keyed by (seed, draw
    index t, token id) (t_shifted = t << 32, int64). The drawn token is the highest score, ties
    to the lowest id. Every sampler (this module, kernels/logits_process.py) scores with it."""
    u = tl.rand(seed, t_shifted | tok)
    return (v - top) / safe_t - tl.log(-tl.log(u))


@triton.jit(do_not_specialize=["vocab", "n_rows"])
def _sample_kernel(vals_ptr, idx_ptr, vocab, n_rows, temperature_ptr, top_k_ptr, top_p_ptr,
                   seed_ptr, step_ptr, out_ptr, kept_ptr, top_ptr, SORTED: tl.constexpr,
                   ADVANCE: tl.constexpr, KEPT: tl.constexpr, ROWS: tl.constexpr,
                   BLOCK: tl.constexpr, Q: tl.constexpr):
    r = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    live = r < n_rows
    r = tl.where(live, r, 0)
    row = vals_ptr + r.to(tl.int64)[:, None] * vocab           # [ROWS, 1] row starts
    irow = idx_ptr + r.to(tl.int64)[:, None] * vocab
    offs = tl.arange(0, BLOCK)[None, :]
    sr = r // Q                                                # the row's slot (Q rows a slot)
    temp = tl.load(temperature_ptr + sr)
    t = tl.load(step_ptr + sr) + r % Q                         # draw index: the slot's, + j
    sampled = live & (temp > 0)
    safe_t = tl.where(temp > 0, temp, 1.0)
    # row maximum and greedy token (lowest id among the maxima); unsorted: kernels/argmax.py's,
    # written into top and out before this launch
    if SORTED:
        top = tl.load(vals_ptr + r.to(tl.int64) * vocab).to(tl.float32)
        best_tok = tl.load(idx_ptr + r.to(tl.int64) * vocab).to(tl.int64)
    else:
        top = tl.load(top_ptr + r)
        best_tok = tl.load(out_ptr + r)
    # kept prefix length m (sorted only): top-k, then top-p over the renormalised top-k mass
    k = tl.full((ROWS,), 0, tl.int32) + vocab
    m_kept = k
    if SORTED:
        k = tl.load(top_k_ptr + sr)
        k = tl.where((k <= 0) | (k > vocab), vocab, k)
        p = tl.load(top_p_ptr + sr)
        if KEPT:
            need = live                                   # every row's kept set is asked for
        else:
            need = sampled
        kmax = tl.max(tl.where(need, k, 0), axis=0)
        m_kept = k
        if tl.max(tl.where(need & (p < 1.0), 1, 0), axis=0) > 0:
            z = tl.zeros((ROWS,), tl.float32)
            for start in range(0, kmax, BLOCK):
                i = start + offs
                inside = i < k[:, None]
                v = tl.load(row + i, mask=inside, other=float("-inf")).to(tl.float32)
                z += tl.sum(tl.where(inside, tl.exp((v - top[:, None]) / safe_t[:, None]), 0.0), axis=1)
            carry = tl.zeros((ROWS,), tl.float32)
            cnt = tl.zeros((ROWS,), tl.int32)
            for start in range(0, kmax, BLOCK):
                i = start + offs
                inside = i < k[:, None]
                v = tl.load(row + i, mask=inside, other=float("-inf")).to(tl.float32)
                e = tl.where(inside, tl.exp((v - top[:, None]) / safe_t[:, None]), 0.0)
                incl = tl.cumsum(e, axis=1) + carry[:, None]
                keep = ((incl - e) < (p * z)[:, None]) & inside
                cnt += tl.sum(keep.to(tl.int32), axis=1)
                carry += tl.sum(e, axis=1)
            m_kept = tl.where(p < 1.0, cnt, k)
    # Gumbel-max over the kept tokens, noise keyed by (seed, t, token id)
    if tl.max(sampled.to(tl.int32), axis=0) > 0:
        seed = tl.load(seed_ptr + sr)[:, None]
        tt = t.to(tl.int64)[:, None] << 32
        n_scan = tl.max(tl.where(sampled, m_kept, 0), axis=0)
        g_best = tl.full((ROWS,), float("-inf"), tl.float32)
        g_tok = tl.full((ROWS,), _BIG, tl.int64)
        for start in range(0, n_scan, BLOCK):
            i = start + offs
            inside = i < m_kept[:, None]
            v = tl.load(row + i, mask=inside, other=float("-inf")).to(tl.float32)
            if SORTED:
                tok = tl.load(irow + i, mask=inside, other=0).to(tl.int64)
            else:
                tok = tl.zeros((ROWS, BLOCK), tl.int64) + i
            score = tl.where(inside, gumbel_score(v, top[:, None], safe_t[:, None], seed, tt, tok),
                             float("-inf"))
            bm = tl.max(score, axis=1)
            bt = tl.min(tl.where((score == bm[:, None]) & inside, tok, _BIG), axis=1)
            better = (bm > g_best) | ((bm == g_best) & (bt < g_tok))
            g_tok = tl.where(better, bt, g_tok)
            g_best = tl.where(better, bm, g_best)
        best_tok = tl.where(sampled & (g_tok < _BIG), g_tok, best_tok)
    tl.store(out_ptr + r, best_tok, mask=live)
    if ADVANCE:
        tl.store(step_ptr + r, t + 1, mask=live)
    if KEPT:
        tl.store(kept_ptr + r, tl.where(temp > 0, m_kept, vocab), mask=live)


def _rows_per_program(device: torch.device, n: int) -> int:
    return 1 if device.type == "cuda" else min(512, triton.next_power_of_2(max(n, 1)))


def _launch(vals, idx, temperature, top_k, top_p, seed, step, out, kept, *, sorted_: bool,
            advance: bool, q: int = 1) -> None:
    n, vocab = vals.shape
    if n == 0:
        return
    top = vals
    if not sorted_:                         # greedy token and row max: the chunked argmax
        top = torch.empty(n, dtype=torch.float32, device=vals.device)
        argmax_into(vals, out, top=top)
    rows = _rows_per_program(vals.device, n)
    block = min(BLOCK, triton.next_power_of_2(vocab))
    if rows > 1:
        block = min(block, max(16, 4096 // rows))
    _sample_kernel[(triton.cdiv(n, rows),)](
        vals, idx, vocab, n, temperature, top_k, top_p, seed, step, out,
        kept if kept is not None else out, top, SORTED=sorted_, ADVANCE=advance, KEPT=kept is not None,
        ROWS=rows, BLOCK=block, Q=q, num_warps=4)


def sample_tokens(logits: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor,
                  top_p: torch.Tensor, seed: torch.Tensor, step: torch.Tensor,
                  out: torch.Tensor, *, advance: bool = True, filtered: bool = True,
                  rows_per_slot: int = 1) -> None:
    """Draw one token per row into `out`; with `advance`, step += 1. All tensors on one device.

    logits [B, V] float (float32 or the model dtype), contiguous; every [B] tensor contiguous
    (ValueError otherwise: the kernel indexes them densely); temperature [B] float32
    (0 = greedy); top_k [B] int32 (0 = off); top_p [B] float32 in (0, 1] (1 = off); seed [B]
    int64; step [B] int32 (the row's draw index t); out [B] int64. filtered=False: no sort,
    top_k / top_p are not read (the caller guarantees every row has them off). Capturable.

    rows_per_slot Q > 1 (a verify: Q positions per slot, advance=False): logits and out have
    S * Q rows, the sampling tensors S (one per slot); row s * Q + j draws with slot s's
    sampling row at draw index step[s] + j, exactly as if each were expanded to its Q rows.
    """
    q = check_sample_args(logits, temperature, top_k, top_p, seed, step, out, advance=advance,
                          rows_per_slot=rows_per_slot)
    if filtered:
        vals, idx = torch.sort(logits, dim=-1, descending=True, stable=True)   # [B, V] each
    else:
        vals, idx = logits, logits
    _launch(vals, idx, temperature, top_k, top_p, seed, step, out, None, sorted_=filtered,
            advance=advance, q=q)


def kept_lengths(logits: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor,
                 top_p: torch.Tensor):
    """The kept set of every row, as the sampler sees it: (order [R, V] int64, the token ids
    sorted by descending logit (stable), kept [R] int32, the kept prefix length of `order`; V
    for greedy rows). logits [R, V] float; temperature [R] float32; top_k [R] int32; top_p [R]
    float32. Capturable (device tensors, no sync)."""
    r = logits.shape[0]
    vals, idx = torch.sort(logits, dim=-1, descending=True, stable=True)
    kept = torch.empty(r, dtype=torch.int32, device=logits.device)
    scratch_out = torch.empty(r, dtype=torch.int64, device=logits.device)
    zeros64 = torch.zeros(r, dtype=torch.int64, device=logits.device)
    zeros32 = torch.zeros(r, dtype=torch.int32, device=logits.device)
    _launch(vals, idx, temperature, top_k, top_p, zeros64, zeros32, scratch_out, kept,
            sorted_=True, advance=False)
    return idx, kept


__all__ = ["sample_tokens", "kept_lengths"]
