"""top-k / top-p as a logits mask: -inf outside the sampler's kept set (kernels/sample.py).

The kept set is the one the sampler draws from (one rule, computed by the sampler's kernel): the
logits sorted in descending order (stable), the first top_k (0 = all), then, over that
renormalised top-k distribution at the row's temperature, the smallest prefix whose mass reaches
top_p; greedy rows are kept whole. `accept.judge` applies the same set itself when given top_k /
top_p, so the mask is for code that needs the filtered distribution as logits (probabilities of a
non-point-mass proposer, log-probs). Device ops and one kernel launch: capturable.
"""
from __future__ import annotations

import torch

from graphrt.kernels.sample import kept_lengths


def filter_logits(logits: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor,
                  top_p: torch.Tensor) -> torch.Tensor:
    """logits [R, V] (any float dtype); temperature [R] float32 (0 = greedy: row kept whole),
    top_k [R] int32 (0 = off), top_p [R] float32 in (0, 1] -> [R, V] float32 with -inf outside
    each row's kept set."""
    r, vocab = logits.shape
    for name, t, dt in (("temperature", temperature, torch.float32), ("top_k", top_k, torch.int32),
                        ("top_p", top_p, torch.float32)):
        if tuple(t.shape) != (r,) or t.dtype != dt:
            raise ValueError(f"{name}: expected [{r}] {dt}, got {tuple(t.shape)} {t.dtype}")
    order, kept = kept_lengths(logits.contiguous(), temperature, top_k, top_p)      # [R, V], [R]
    rank = torch.arange(vocab, device=logits.device)[None, :]
    inside = torch.zeros((r, vocab), dtype=torch.bool, device=logits.device)
    inside.scatter_(1, order, rank < kept[:, None])
    return torch.where(inside, logits.float(), float("-inf"))


__all__ = ["filter_logits"]
