"""Acceptance on the device: greedy vs a plain-Python rule; rejection sampling preserves the
target distribution (chi-square over thousands of seeds; a wrong rule fails the same test);
seeded rows are batch-invariant."""
from __future__ import annotations

import pytest
import torch

from _spec_helpers import CHI2_999, chi2
from graphrt.speculative.accept import advance, judge


def _round(logits, props, count, temp, seed, step, token_buf, num, limit):
    b, q, _ = logits.shape
    acc = torch.empty((b, q), dtype=torch.int32)
    fb = torch.empty((b, q), dtype=torch.int64)
    judge(logits.contiguous(), props, count, temp, seed, step, acc, fb)
    out = torch.empty((b, q), dtype=torch.int64)
    emitted = torch.empty(b, dtype=torch.int32)
    advance(acc, fb, props, token_buf, num, limit, step, out, emitted)
    return out, emitted, acc


def test_greedy_prefix_and_limits():
    gen = torch.Generator().manual_seed(0)
    b, k, v = 6, 3, 50
    logits = torch.randn((b, k + 1, v), generator=gen)
    logits[1, 2, :] = logits[1, 2].max()                 # an exact tie: lowest id wins (torch.argmax)
    target = logits.argmax(-1)                           # [B, Q]
    props = torch.randint(0, v, (b, k), generator=gen)
    props[0] = target[0, :k]                             # all accepted -> bonus
    props[1, :2] = target[1, :2]                         # 2 accepted, then the tie position
    props[2, 0] = (target[2, 0] + 1) % v                 # first rejected
    props[3] = target[3, :k]                             # all accepted but count 1
    props[4] = target[4, :k]                             # limit clips to 2 tokens
    props[5] = target[5, :k]                             # empty slot
    count = torch.tensor([3, 3, 3, 1, 3, 3], dtype=torch.int32)
    num = torch.tensor([5, 5, 5, 5, 5, 0], dtype=torch.int32)
    limit = torch.tensor([100, 100, 100, 100, 7, 100], dtype=torch.int32)
    width = 12
    buf = torch.full((b, width), 9999, dtype=torch.int32)
    step = torch.tensor([3, 0, 0, 0, 0, 0], dtype=torch.int32)
    zeros = torch.zeros(b)
    out, emitted, _ = _round(logits, props, count, zeros, torch.zeros(b, dtype=torch.int64), step,
                             buf, num.clone(), limit)
    for r in range(b):                                   # the rule, spelled out in Python
        want = []
        for j in range(k + 1):
            want.append(int(target[r, j]))
            if j >= int(count[r]) or int(props[r, j]) != int(target[r, j]):
                break
        want = want[: max(0, int(limit[r]) - int(num[r]))] if num[r] > 0 else []
        assert int(emitted[r]) == len(want), r
        assert out[r, : len(want)].tolist() == want and out[r, len(want):].eq(-1).all(), r
        assert buf[r, int(num[r]): int(num[r]) + len(want)].tolist() == want
        assert buf[r, int(num[r]) + len(want):].eq(9999).all() and buf[r, : int(num[r])].eq(9999).all()
    assert int(emitted[0]) == 4 and int(emitted[1]) == 3 and int(emitted[2]) == 1
    assert step.tolist() == [3 + 4, 3, 1, 2, 2, 0]


def _sampled(logits_row, x, n, *, rule="exact"):
    """n seeded requests, each verifying one proposal x against fixed target logits [2, V]."""
    v = logits_row.shape[-1]
    logits = logits_row.expand(n, 2, v).contiguous()
    props = torch.full((n, 1), x, dtype=torch.int64)
    count = torch.ones(n, dtype=torch.int32)
    temp = torch.ones(n)
    seed = torch.arange(n, dtype=torch.int64) * 7919 + 11
    step = torch.zeros(n, dtype=torch.int32)
    acc = torch.empty((n, 2), dtype=torch.int32)
    fb = torch.empty((n, 2), dtype=torch.int64)
    judge(logits, props, count, temp, seed, step, acc, fb)
    if rule == "always-accept":                         # the deliberately wrong rule
        acc[:, 0] = 1
    buf = torch.zeros((n, 4), dtype=torch.int32)
    out = torch.empty((n, 2), dtype=torch.int64)
    emitted = torch.empty(n, dtype=torch.int32)
    advance(acc, fb, props, buf, torch.ones(n, dtype=torch.int32), torch.full((n,), 4, dtype=torch.int32),
            step, out, emitted)
    return out, emitted


@pytest.mark.parametrize("rule", ["exact", "always-accept"])
def test_rejection_sampling_preserves_distribution(rule):
    logits = torch.tensor([[0.3, -0.5, 1.2, 0.0], [1.0, 0.2, -0.7, 0.4]])
    p = torch.softmax(logits, -1)
    x = 2                                               # the proposal (point mass), p_0(x) ~ 0.5
    out, emitted = _sampled(logits, x, 3000, rule=rule)
    first = out[:, 0]
    stat_first = chi2(first, p[0])
    both = first == x                                   # accepted: the bonus token follows p_1
    stat_bonus = chi2(out[both, 1], p[1])
    if rule == "exact":
        assert stat_first < CHI2_999[3], stat_first
        assert stat_bonus < CHI2_999[3], stat_bonus
        assert emitted.eq(torch.where(both, 2, 1)).all()
    else:
        assert stat_first > 10 * CHI2_999[3], stat_first   # always x: far from p_0


def test_sampled_rows_are_batch_invariant():
    gen = torch.Generator().manual_seed(3)
    b, k, v = 5, 3, 40
    logits = torch.randn((b, k + 1, v), generator=gen) * 0.5
    props = torch.randint(0, v, (b, k), generator=gen)
    props[:, 0] = logits[:, 0].argmax(-1)                # likely accepted: exercise later positions
    count = torch.full((b,), k, dtype=torch.int32)
    temp = torch.full((b,), 0.8)
    seed = torch.arange(b, dtype=torch.int64) + 100
    step = torch.arange(b, dtype=torch.int32)
    num = torch.full((b,), 2, dtype=torch.int32)
    limit = torch.full((b,), 20, dtype=torch.int32)
    out, emitted, _ = _round(logits, props, count, temp, seed, step.clone(),
                             torch.zeros((b, 20), dtype=torch.int32), num.clone(), limit)
    perm = torch.tensor([3, 0, 4, 1, 2])
    out_p, emitted_p, _ = _round(logits[perm], props[perm], count, temp[perm], seed[perm],
                                 step[perm].clone(), torch.zeros((b, 20), dtype=torch.int32),
                                 num.clone(), limit)
    assert torch.equal(out_p, out[perm]) and torch.equal(emitted_p, emitted[perm])


def test_bad_input():
    b, q, v = 2, 3, 8
    args = dict(logits=torch.zeros(b * q, v), proposals=torch.zeros((b, q - 1), dtype=torch.int64),
                count=torch.zeros(b, dtype=torch.int32), temperature=torch.zeros(b),
                seed=torch.zeros(b, dtype=torch.int64), step=torch.zeros(b, dtype=torch.int32),
                accept=torch.zeros((b, q), dtype=torch.int32),
                fallback=torch.zeros((b, q), dtype=torch.int64))
    for name, bad in (("proposals", torch.zeros((b, q), dtype=torch.int64)),
                      ("count", torch.zeros(b, dtype=torch.int64)),
                      ("seed", torch.zeros(b + 1, dtype=torch.int64)),
                      ("fallback", torch.zeros((b, q), dtype=torch.int32))):
        with pytest.raises(ValueError, match=name):
            judge(**{**args, name: bad})


def test_advance_leaves_each_slot_current_token():
    """`current`: the token a slot holds last after the round (what the decode graphs read as
    its current token): the last emitted one; for a slot at its limit (emits nothing) the one
    it held; an empty slot's entry untouched. The same as the gather of the history at n - 1."""
    gen = torch.Generator().manual_seed(4)
    b, k, v, width = 5, 3, 40, 12
    logits = torch.randn((b, k + 1, v), generator=gen)
    target = logits.argmax(-1)
    props = torch.randint(0, v, (b, k), generator=gen)
    props[0] = target[0, :k]                                          # all accepted + bonus
    props[1, 0] = (target[1, 0] + 1) % v                               # rejected at once: 1 token
    props[4] = target[4, :k]                                          # all accepted, clipped to 2
    count = torch.full((b,), k, dtype=torch.int32)
    num = torch.tensor([4, 4, 6, 0, 5], dtype=torch.int32)
    limit = torch.tensor([50, 50, 6, 50, 7], dtype=torch.int32)       # slot 2 at its limit, 4 clipped
    buf = torch.randint(0, v, (b, width), generator=gen, dtype=torch.int32)
    acc = torch.empty((b, k + 1), dtype=torch.int32)
    fb = torch.empty((b, k + 1), dtype=torch.int64)
    step = torch.zeros(b, dtype=torch.int32)
    judge(logits, props, count, torch.zeros(b), torch.zeros(b, dtype=torch.int64), step, acc, fb)
    current = torch.full((b,), -7, dtype=torch.int64)
    out, emitted, n = torch.empty((b, k + 1), dtype=torch.int64), torch.empty(b, dtype=torch.int32), num.clone()
    advance(acc, fb, props, buf, n, limit, step, out, emitted, current=current)
    assert emitted.tolist()[:3] == [4, 1, 0] and int(emitted[3]) == 0 and int(emitted[4]) == 2
    want = buf.gather(1, (n.long() - 1).clamp_min(0)[:, None])[:, 0]
    assert torch.equal(current[n > 0], want[n > 0]) and int(current[3]) == -7
    assert int(current[0]) == int(target[0, k]) and int(current[2]) == int(buf[2, 5])
    with pytest.raises(ValueError, match="^current: "):
        advance(acc, fb, props, buf, n, limit, step, out, emitted, current=current.int())
