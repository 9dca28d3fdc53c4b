"""The verify round's inputs in one launch (speculative/prologue.py) against the torch ops it
replaces, on random slot states (empty, finished, live slots; caps below and above the count)."""
from __future__ import annotations

import pytest
import torch

from graphrt.speculative.prologue import round_inputs


def _reference(hist, num, limit, cap, proposals, count):
    active = (num > 0) & (num < limit)
    count = torch.minimum(count, cap)
    last = (num.long() - 1).clamp_min(0)[:, None]
    cur = hist.gather(1, last).long()
    tokens = torch.cat([cur, proposals], dim=1)
    cache_lens = torch.where(active, num - 1, -1).to(torch.int32)
    return tokens, cache_lens, count, torch.where(active, count, 0).to(torch.int32)


@pytest.mark.parametrize("b, k", [(1, 1), (3, 4), (8, 3), (70, 8)])
def test_round_inputs_equal_the_torch_ops(b, k):
    g = torch.Generator().manual_seed(b * 10 + k)
    w = 40
    hist = torch.randint(0, 5000, (b, w), generator=g, dtype=torch.int32)
    num = torch.randint(0, w + 1, (b,), generator=g, dtype=torch.int32)
    num[0] = 0                                               # an empty slot
    limit = torch.clamp(num + torch.randint(-2, 6, (b,), generator=g, dtype=torch.int32), 0, w)
    cap = torch.randint(0, k + 1, (b,), generator=g, dtype=torch.int32)
    count = torch.randint(0, k + 1, (b,), generator=g, dtype=torch.int32)
    proposals = torch.randint(0, 5000, (b, k), generator=g, dtype=torch.int64)
    want = _reference(hist, num, limit, cap, proposals, count)
    proposed = torch.full((b,), -7, dtype=torch.int32)
    got_count = count.clone()
    tokens, cache_lens = round_inputs(hist, num, limit, cap, proposals, got_count, proposed)
    assert torch.equal(tokens, want[0]) and tokens.dtype == torch.int64
    assert torch.equal(cache_lens, want[1]) and cache_lens.dtype == torch.int32
    assert torch.equal(got_count, want[2]) and torch.equal(proposed, want[3])
    assert (cache_lens[num == 0] == -1).all() and (cache_lens[num >= limit] == -1).all()
    # full=True (an EAGLE-3 head: k proposals every slot): count's values not read, only written
    full_count = torch.full((b,), -9, dtype=torch.int32)
    want = _reference(hist, num, limit, cap, proposals, torch.full((b,), k, dtype=torch.int32))
    tokens, cache_lens = round_inputs(hist, num, limit, cap, proposals, full_count, proposed, full=True)
    assert torch.equal(tokens, want[0]) and torch.equal(cache_lens, want[1])
    assert torch.equal(full_count, want[2]) and torch.equal(proposed, want[3])


def test_round_inputs_name_the_bad_field():
    b, k = 2, 3
    ok = dict(history=torch.zeros((b, 8), dtype=torch.int32), num_tokens=torch.ones(b, dtype=torch.int32),
              limit=torch.full((b,), 8, dtype=torch.int32), cap=torch.full((b,), k, dtype=torch.int32),
              proposals=torch.zeros((b, k), dtype=torch.int64), count=torch.zeros(b, dtype=torch.int32),
              proposed=torch.zeros(b, dtype=torch.int32))
    round_inputs(**ok)
    for name, bad in (("history", torch.zeros((b, 8), dtype=torch.int64)),
                      ("limit", torch.zeros(b, dtype=torch.int64)),
                      ("cap", torch.zeros(b + 1, dtype=torch.int32)),
                      ("proposals", torch.zeros((b, k), dtype=torch.int32)),
                      ("proposed", torch.zeros((b, 2), dtype=torch.int32)[:, 0])):
        with pytest.raises(ValueError, match=name):
            round_inputs(**(ok | {name: bad}))
    with pytest.raises(ValueError, match="^full: "):
        round_inputs(**ok, full="yes")
