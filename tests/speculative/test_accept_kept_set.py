"""top-k / top-p in speculative acceptance: `judge(top_k=, top_p=)` applies the sampler's kept set
(kernels/sample.py, one rule): its fallback draws are the sampler's own draws seed by seed, they
lie inside the kept set spelled out in Python, and a proposal outside the kept set is never
emitted."""
from __future__ import annotations

import torch

from graphrt.kernels.sample import sample_tokens
from graphrt.speculative.accept import advance, judge


def _kept(row, temp, k, p):
    """The kept set as stated: stable descending order, the first top_k, then the smallest
    prefix of the top-k distribution at temperature `temp` whose mass reaches top_p."""
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


def test_judge_draws_the_samplers_tokens_inside_the_kept_set():
    gen = torch.Generator().manual_seed(0)
    rows, seeds, v = 8, 64, 30
    base = torch.randn((rows, v), generator=gen)
    temp1 = torch.tensor([1.0, 0.5, 0.0, 2.0, 1.0, 0.7, 1.0, 1.0])
    top_k1 = torch.tensor([0, 5, 3, 0, 1, 10, 40, 4], dtype=torch.int32)
    top_p1 = torch.tensor([0.5, 1.0, 0.3, 0.9, 1.0, 0.8, 1.0, 0.6])
    b = rows * seeds                                        # every row under `seeds` seeds
    rep = lambda t: t.repeat(seeds)                         # noqa: E731
    logits = base.repeat(seeds, 1)[:, None, :].expand(b, 2, v).contiguous()    # [B, Q = 2, V]
    temp, top_k, top_p = rep(temp1), rep(top_k1), rep(top_p1)
    seed = torch.arange(b, dtype=torch.int64) * 7 + 1
    step = torch.zeros(b, dtype=torch.int32)
    acc, fb = torch.empty((b, 2), dtype=torch.int32), torch.empty((b, 2), dtype=torch.int64)
    judge(logits, torch.zeros((b, 1), dtype=torch.int64), torch.zeros(b, dtype=torch.int32), temp, seed,
          step, acc, fb, top_k=top_k, top_p=top_p)
    want = torch.empty(b, dtype=torch.int64)
    sample_tokens(logits[:, 0].contiguous(), temp, top_k, top_p, seed, step.clone(), want)
    assert torch.equal(fb[:, 0], want)                      # one rule: the sampler's draw
    for r in range(rows):
        kept = _kept(base[r].tolist(), float(temp1[r]), int(top_k1[r]), float(top_p1[r]))
        drawn = set(fb[r::rows, 0].tolist())
        assert drawn <= kept, r
        if float(temp1[r]) > 0 and len(kept) > 1:
            assert len(drawn) > 1, r                        # really sampled


def test_a_proposal_outside_the_kept_set_is_never_emitted():
    n, v = 2000, 6
    base = torch.tensor([[0.9, 0.1, 0.5, -0.3, 0.7, 0.0], [0.2, 0.4, -0.1, 0.3, 0.0, 0.6]])
    logits = base.expand(n, 2, v).contiguous()
    top_k = torch.full((n,), 3, dtype=torch.int32)           # kept after position 0: {0, 4, 2}
    for x, inside in ((2, True), (1, False)):
        props = torch.full((n, 1), x, dtype=torch.int64)
        acc, fb = torch.empty((n, 2), dtype=torch.int32), torch.empty((n, 2), dtype=torch.int64)
        step = torch.zeros(n, dtype=torch.int32)
        judge(logits, props, torch.ones(n, dtype=torch.int32), torch.ones(n),
              torch.arange(n, dtype=torch.int64) * 31 + 5, step, acc, fb, top_k=top_k)
        out = torch.empty((n, 2), dtype=torch.int64)
        advance(acc, fb, props, torch.zeros((n, 4), dtype=torch.int32), torch.ones(n, dtype=torch.int32),
                torch.full((n,), 4, dtype=torch.int32), step, out, torch.empty(n, dtype=torch.int32))
        assert torch.isin(out[:, 0], torch.tensor([0, 4, 2])).all()
        assert bool((out[:, 0] == x).any()) == inside
