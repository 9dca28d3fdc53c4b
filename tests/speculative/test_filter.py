"""top-k / top-p for speculative acceptance: the kept set vs the rule spelled out in Python, and
rejection sampling over filtered logits follows the filtered target distribution (chi-square)."""
from __future__ import annotations

import pytest
import torch

from _spec_helpers import CHI2_999, chi2
from graphrt.speculative.accept import advance, judge
from graphrt.speculative.filter import filter_logits


def _kept(row, temp, k, p):
    order = sorted(range(len(row)), key=lambda i: (-row[i], i))
    if temp <= 0:
        return set(order)
    k = len(row) if k <= 0 or k > len(row) else k
    top = order[:k]
    w = torch.softmax(torch.tensor([row[i] for i in top]) / temp, 0).tolist()
    kept, mass = [], 0.0
    for i, wi in zip(top, w):
        if mass >= p - 1e-6:
            break
        kept.append(i)
        mass += wi
    return set(kept)


def test_kept_set_matches_rule():
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn((8, 30), generator=gen)
    temp = torch.tensor([1.0, 0.5, 0.0, 2.0, 1.0, 0.7, 1.0, 1.0])
    top_k = torch.tensor([0, 5, 3, 0, 1, 10, 40, 4], dtype=torch.int32)
    top_p = torch.tensor([0.5, 1.0, 0.3, 0.9, 1.0, 0.8, 1.0, 0.6])
    out = filter_logits(logits, temp, top_k, top_p)
    for r in range(8):
        got = set(torch.nonzero(out[r] > float("-inf")).flatten().tolist())
        assert got == _kept(logits[r].tolist(), float(temp[r]), int(top_k[r]), float(top_p[r])), r
        assert torch.equal(out[r][list(got)], logits[r][list(got)])


def test_rejection_sampling_over_filtered_logits():
    n, v = 3000, 6
    base = torch.tensor([[0.9, 0.1, 0.5, -0.3, 0.7, 0.0], [0.2, 0.4, -0.1, 0.3, 0.0, 0.6]])
    logits = base.expand(n, 2, v).reshape(2 * n, v)
    filt = filter_logits(logits, torch.ones(2 * n), torch.full((2 * n,), 3, dtype=torch.int32),
                         torch.ones(2 * n)).view(n, 2, v).contiguous()
    p = torch.softmax(filt[0], -1)                                   # [2, V], 0 outside the top 3
    x = 2                                                            # a kept proposal
    props = torch.full((n, 1), x, dtype=torch.int64)
    acc = torch.empty((n, 2), dtype=torch.int32)
    fb = torch.empty((n, 2), dtype=torch.int64)
    step = torch.zeros(n, dtype=torch.int32)
    judge(filt, props, torch.ones(n, dtype=torch.int32), torch.ones(n),
          torch.arange(n, dtype=torch.int64) * 31 + 5, step, acc, fb)
    out = torch.empty((n, 2), dtype=torch.int64)
    advance(acc, fb, props, torch.zeros((n, 4), dtype=torch.int32), torch.ones(n, dtype=torch.int32),
            torch.full((n,), 4, dtype=torch.int32), step, out, torch.empty(n, dtype=torch.int32))
    kept0 = torch.nonzero(p[0] > 0).flatten()
    assert torch.isin(out[:, 0], kept0).all()                        # never outside the top 3
    remap = {int(t): i for i, t in enumerate(kept0)}
    first = torch.tensor([remap[int(t)] for t in out[:, 0]])
    assert chi2(first, p[0][kept0]) < CHI2_999[2]                   # 3 outcomes: df 2
