"""N-gram prompt lookup on the device: propose each slot's continuation from its own tokens.

For slot s with tokens t[0..L) (prompt + output, L = lens[s]), the proposal follows the most
recent earlier occurrence of the longest suffix t[L-n..L) with n in [min_n, max_n] (n tried
longest first): it is t[e+1 .. e+1+k) clipped to L, where e < L - 1 is the last position of that
occurrence (the occurrence may overlap the suffix). No match: count 0.

One pass finds it: for every candidate end e the kernel counts the matched suffix length m(e)
(capped at max_n); the best candidate maximises (m, e) over those with m >= min_n. That is the
"for n from max_n down to min_n, most recent match" rule in one scan.

Grid: one program per slot, BLOCK candidate ends at a time; no host sync (graph-capturable);
runs on CPU under TRITON_INTERPRET=1. `ngram_propose_reference` is the plain-Python truth and
`NgramIndex` the engine's incremental host copy of the rule (ngram_rule.py, no Triton; re-exported
here); the torch set's twin is speculative/reference.py's.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from graphrt.speculative.ngram_rule import NgramIndex, ngram_propose_reference
from graphrt.speculative.reference import check_ngram

BLOCK = 256


@triton.jit(do_not_specialize=["width"])
def _ngram_kernel(tok_ptr, tok_stride, width, lens_ptr, out_ptr, count_ptr, min_n,
                  K: tl.constexpr, MAX_N: tl.constexpr, BLOCK: tl.constexpr, KB: tl.constexpr):
    s = tl.program_id(0)
    row = tok_ptr + s.to(tl.int64) * tok_stride
    n_tok = tl.minimum(tl.load(lens_ptr + s), width)
    offs = tl.arange(0, BLOCK)
    best = tl.full((), -1, tl.int64)                   # m * width + e of the best candidate
    for start in range(0, n_tok - 1, BLOCK):
        e = start + offs                               # candidate ends, e <= L - 2
        valid = e < n_tok - 1
        m = tl.zeros((BLOCK,), tl.int32)
        alive = valid
        for j in tl.static_range(MAX_N):
            ok = alive & (e - j >= 0)                    # then n_tok - 1 - j > e - j >= 0
            a = tl.load(row + e - j, mask=ok, other=-1)
            b = tl.load(row + tl.maximum(n_tok - 1 - j, 0))
            alive = ok & (a == b)
            m += alive.to(tl.int32)
        score = tl.where(valid & (m >= min_n), m.to(tl.int64) * width + e, -1)
        best = tl.maximum(best, tl.max(score, axis=0))
    k_offs = tl.arange(0, KB)
    e_best = best % width
    src = tl.where(best >= 0, e_best + 1, n_tok) + k_offs     # no match: nothing below n_tok
    keep = (k_offs < K) & (src < n_tok)
    toks = tl.load(row + src, mask=keep, other=0)
    tl.store(out_ptr + s * K + k_offs, toks.to(tl.int64), mask=k_offs < K)
    tl.store(count_ptr + s, tl.sum(keep.to(tl.int32), axis=0))


def ngram_propose(tokens: torch.Tensor, lens: torch.Tensor, out: torch.Tensor, count: torch.Tensor,
                  *, min_n: int, max_n: int) -> None:
    """Fill out[s, :count[s]] with slot s's proposal (see module docstring).

    tokens [S, W] int32 (device token buffer; row s holds slot s's tokens), lens [S] int32
    (tokens held; clipped to W; 0 = empty slot), out [S, k] int64 (entries past count are 0),
    count [S] int32. One device; capturable in a CUDA graph.
    """
    check_ngram(tokens, lens, out, count, min_n, max_n)
    s = tokens.shape[0]
    k = out.shape[1]
    _ngram_kernel[(s,)](tokens, tokens.stride(0), tokens.shape[1], lens, out, count, min_n,
                        K=k, MAX_N=max_n, BLOCK=min(BLOCK, triton.next_power_of_2(tokens.shape[1])),
                        KB=triton.next_power_of_2(k))


__all__ = ["ngram_propose", "ngram_propose_reference", "NgramIndex"]
