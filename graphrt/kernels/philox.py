"""Triton's Philox random numbers in torch, bit for bit (no Triton imported).

    u = uniform(seed, offset)        # == tl.rand(seed, offset): float32 in [0, 1)
    x = randint(seed, offset)        # == tl.randint(seed, offset): the uint32 word (in int64)

Philox4x32 with 10 rounds, as triton/language/random.py runs it for a 64-bit offset: counter
(offset low 32 bits, offset high 32 bits, 0, 0), key (seed low 32 bits, seed high 32 bits), the
first output word; `uniform` maps it as Triton's uint_to_uniform_float does (the word read as
int32, negative ones complemented, times 4.6566127342e-10 in float32). The sampler's noise
(kernels/sample.py `gumbel_score`) is keyed by (seed, draw index << 32 | token id), so the torch
kernel set draws exactly the tokens the Triton kernels draw from the same scores.

All arithmetic is on int64 tensors holding 32-bit words; products are split into 16-bit halves
so no intermediate leaves int64 (no overflow). Element-wise, any broadcastable shapes, any
device; capturable (no host sync).
"""
from __future__ import annotations

import torch

ROUNDS = 10
KEY_A, KEY_B = 0x9E3779B9, 0xBB67AE85            # the key's increments per round (32-bit Philox)
ROUND_A, ROUND_B = 0xD2511F53, 0xCD9E8D57        # the round multipliers
MASK32 = 0xFFFFFFFF
UNIFORM_SCALE = 4.6566127342e-10                  # Triton's: the largest with (2**31 - 1) * s < 1


def _mul_hi_lo(a: int, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The 64-bit product of the 32-bit constant a and words b (int64 in [0, 2**32)), as its
    high and low 32-bit words."""
    p_hi, p_lo = a * (b >> 16), a * (b & 0xFFFF)                   # each < 2**48
    return (p_hi + (p_lo >> 16)) >> 16, (((p_hi & 0xFFFF) << 16) + p_lo) & MASK32


def randint(seed: torch.Tensor, offset: torch.Tensor) -> torch.Tensor:
    """tl.randint(seed, offset) for int64 seed and offset (broadcast): the first Philox word,
    an int64 tensor of values in [0, 2**32)."""
    seed, offset = seed.to(torch.int64), offset.to(torch.int64)
    c0, c1 = offset & MASK32, (offset >> 32) & MASK32
    c2 = c3 = torch.zeros_like(c0)
    k0, k1 = seed & MASK32, (seed >> 32) & MASK32
    for _ in range(ROUNDS):
        hi_b, lo_b = _mul_hi_lo(ROUND_B, c2)
        hi_a, lo_a = _mul_hi_lo(ROUND_A, c0)
        c0, c1, c2, c3 = hi_b ^ c1 ^ k0, lo_b, hi_a ^ c3 ^ k1, lo_a
        k0, k1 = (k0 + KEY_A) & MASK32, (k1 + KEY_B) & MASK32
    return c0


def uniform(seed: torch.Tensor, offset: torch.Tensor) -> torch.Tensor:
    """tl.rand(seed, offset): float32 in [0, 1), bit-equal to Triton's."""
    x = randint(seed, offset)
    x = torch.where(x >= 2 ** 31, x - 2 ** 32, x)                  # the word as int32
    x = torch.where(x < 0, -x - 1, x)                               # ~x
    return x.to(torch.float32) * torch.tensor(UNIFORM_SCALE, dtype=torch.float32, device=x.device)


def gumbel_score(v: torch.Tensor, top: torch.Tensor, safe_t: torch.Tensor, seed: torch.Tensor,
                 t: torch.Tensor, tok: torch.Tensor) -> torch.Tensor:
    """kernels/sample.py's gumbel_score in torch: (v - top) / T - log(-log(u)), u = uniform(seed,
    t << 32 | tok); float32 v, top, safe_t (T, > 0), int64 seed, t (draw index) and tok (token
    ids), broadcast. The drawn token is the highest score, ties to the lowest id."""
    u = uniform(seed, (t.to(torch.int64) << 32) | tok.to(torch.int64))
    return (v - top) / safe_t - torch.log(-torch.log(u))


__all__ = ["randint", "uniform", "gumbel_score", "ROUNDS"]
