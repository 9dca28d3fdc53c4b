"""top-k / top-p for speculative acceptance: mask the target logits to the sampler's kept set.

The kept set is kernels/sample.py's: the logits sorted in descending order (stable), the first
top_k (0 = all), then, over that renormalised top-k distribution at the row's temperature, the
smallest prefix whose mass reaches top_p. Tokens outside it become -inf, so `accept.judge`'s
p(x), residual draw and bonus draw all follow the filtered target distribution. Torch ops on
the device (a sort per row): capturable; used only by runners built with filtered=True.
"""
from __future__ import annotations

import torch


def filter_logits(logits: torch.Tensor, temperature: torch.Tensor, top_k: torch.Tensor,
                  top_p: torch.Tensor) -> torch.Tensor:
    """logits [R, V] (any float dtype); temperature [R] float32 (0 = greedy: row kept whole),
    top_k [R] int32 (0 = off), top_p [R] float32 in (0, 1] -> [R, V] float32 with -inf outside
    each row's kept set."""
    r, vocab = logits.shape
    for name, t in (("temperature", temperature), ("top_k", top_k), ("top_p", top_p)):
        if tuple(t.shape) != (r,):
            raise ValueError(f"{name}: expected [{r}], got {tuple(t.shape)}")
    vals, idx = torch.sort(logits.float(), dim=-1, descending=True, stable=True)     # [R, V]
    rank = torch.arange(vocab, device=logits.device)[None, :]
    k = torch.where((top_k <= 0) | (top_k > vocab), vocab, top_k)[:, None]
    keep = rank < k
    temp = torch.where(temperature > 0, temperature, 1.0)[:, None]
    e = torch.where(keep, torch.exp((vals - vals[:, :1]) / temp), 0.0)
    z = e.sum(dim=-1, keepdim=True)
    keep &= (torch.cumsum(e, dim=-1) - e) < top_p[:, None] * z
    keep |= (temperature <= 0)[:, None]
    out = torch.full_like(vals, float("-inf"))
    return out.scatter_(1, idx, torch.where(keep, vals, float("-inf")))


__all__ = ["filter_logits"]
