"""On-device sampling: greedy, temperature, top-k, top-p with a per-row seed (graph-capturable).

Row r draws its token at step t with Gumbel-max over the kept tokens: argmax_i (l_i / T + g_i),
g_i = -log(-log(u)), u = Philox(key = seed_r, counter = (t, token id)). So the randomness of a
row depends only on (seed_r, t, token id): not on the batch, its order, the bucket or K.

Kept tokens are a prefix of the logits sorted in descending order (torch.sort, stable, on the
device): the first top_k (0 = all), then, over that renormalised top-k distribution, the
smallest prefix whose mass reaches top_p (vLLM's order: temperature, top-k, top-p).
Temperature 0 takes the first sorted token (== torch.argmax: the lowest id among ties).
The kernel advances step[r] by one, so K calls in one graph draw steps t .. t+K-1.
Grid: one program per row; no host sync, no allocation besides torch.sort's outputs.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK = 1024


@triton.jit(do_not_specialize=["vocab"])
def _sample_kernel(vals_ptr, idx_ptr, vocab, temperature_ptr, top_k_ptr, top_p_ptr, seed_ptr,
                   step_ptr, out_ptr, BLOCK: tl.constexpr):
    r = tl.program_id(0)
    row = r.to(tl.int64) * vocab
    temp = tl.load(temperature_ptr + r)
    t = tl.load(step_ptr + r)
    best_tok = tl.load(idx_ptr + row)                     # sorted position 0 = argmax
    if temp > 0:
        k = tl.load(top_k_ptr + r)
        k = tl.where((k <= 0) | (k > vocab), vocab, k)
        p = tl.load(top_p_ptr + r)
        seed = tl.load(seed_ptr + r)
        top = tl.load(vals_ptr + row)
        offs = tl.arange(0, BLOCK)
        # pass 1: softmax denominator over the top-k prefix
        z = 0.0
        for start in range(0, k, BLOCK):
            i = start + offs
            v = tl.load(vals_ptr + row + i, mask=i < k, other=float("-inf"))
            z += tl.sum(tl.exp((v - top) / temp), axis=0)
        # pass 2: m = length of the prefix whose exclusive cumulative mass is below top_p
        m = k
        if p < 1.0:
            carry = 0.0
            m = 0
            for start in range(0, k, BLOCK):
                i = start + offs
                v = tl.load(vals_ptr + row + i, mask=i < k, other=float("-inf"))
                e = tl.exp((v - top) / temp)
                incl = tl.cumsum(e, axis=0) + carry
                keep = (incl - e < p * z) & (i < k)
                m += tl.sum(keep.to(tl.int32), axis=0)
                carry += tl.sum(e, axis=0)
        # pass 3: Gumbel-max over the kept prefix, noise keyed by (seed, t, token id)
        best = float("-inf")
        for start in range(0, m, BLOCK):
            i = start + offs
            v = tl.load(vals_ptr + row + i, mask=i < m, other=float("-inf"))
            tok = tl.load(idx_ptr + row + i, mask=i < m, other=0)
            u = tl.rand(seed, (t.to(tl.int64) << 32) | tok.to(tl.int64))
            score = (v - top) / temp - tl.log(-tl.log(u))
            score = tl.where(i < m, score, float("-inf"))
            blk_best = tl.max(score, axis=0)
            blk_tok = tl.sum(tl.where(i == tl.argmax(score, axis=0) + start, tok, 0), axis=0)
            if blk_best > best:
                best = blk_best
                best_tok = blk_tok
    tl.store(out_ptr + r, best_tok.to(tl.int64))
    tl.store(step_ptr + r, t + 1)


def sample_tokens(logits: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor,
                  top_p: torch.Tensor, seed: torch.Tensor, step: torch.Tensor,
                  out: torch.Tensor) -> None:
    """Draw one token per row into `out`; advance `step` by one. All tensors on one device.

    logits [B, V] float32; temperature [B] float32 (0 = greedy); top_k [B] int32 (0 = off);
    top_p [B] float32 in (0, 1] (1 = off); seed [B] int64; step [B] int32 (the row's draw
    index t, incremented in place); out [B] int64. Capturable in a CUDA graph.
    """
    b, vocab = logits.shape
    vals, idx = torch.sort(logits, dim=-1, descending=True, stable=True)   # [B, V] each
    _sample_kernel[(b,)](vals, idx, vocab, temperature, top_k, top_p, seed, step, out,
                         BLOCK=min(BLOCK, triton.next_power_of_2(vocab)), num_warps=4)


__all__ = ["sample_tokens"]
