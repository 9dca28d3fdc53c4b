"""The speculative rounds' inputs in one launch each (eagle3/propose.py round_prep, draft_prep.py draft_prep)
against the torch ops they replace: idle slots (emitted 0 or cache_lens -1; empty or finished),
every accepted count, q = 1 (the first draft after a prompt)."""
from __future__ import annotations

import pytest
import torch

from graphrt.speculative.eagle3.propose import round_prep


def _reference(emitted, cache_lens, q):
    active = (emitted > 0) & (cache_lens >= 0)
    accepted = (emitted - 1).clamp_min(0)
    cl = torch.where(active, cache_lens, -1).to(torch.int32)
    at = torch.arange(emitted.shape[0]) * q + accepted.long().clamp(0, q - 1)
    base = torch.where(active, cache_lens + accepted + 1, -1).to(torch.int32)
    return cl, at, base


@pytest.mark.parametrize("b, q", [(1, 1), (6, 5), (70, 3)])
def test_round_prep_equals_the_torch_ops(b, q):
    g = torch.Generator().manual_seed(b + q)
    emitted = torch.randint(0, q + 1, (b,), generator=g, dtype=torch.int32)
    cache_lens = torch.randint(-1, 300, (b,), generator=g, dtype=torch.int32)
    emitted[0], cache_lens[-1] = 0, -1                   # an idle slot of each kind
    got = round_prep(emitted, cache_lens, q)
    for w, x in zip(_reference(emitted, cache_lens, q), got):
        assert x.dtype == w.dtype and torch.equal(x, w)


def test_round_prep_names_the_bad_field():
    ok = torch.zeros(3, dtype=torch.int32)
    with pytest.raises(ValueError, match="^emitted: "):
        round_prep(ok.long(), ok, 2)
    with pytest.raises(ValueError, match="^cache_lens: "):
        round_prep(ok, torch.zeros(4, dtype=torch.int32), 2)
    with pytest.raises(ValueError, match="^q: "):
        round_prep(ok, ok, 0)


@pytest.mark.parametrize("b, k", [(1, 1), (5, 4), (70, 3)])
def test_draft_prep_equals_the_torch_ops(b, k):
    """The draft-model proposer's round inputs (speculative/draft_prep.py) against the torch
    ops they replace: active iff 0 < n < limit, tokens n - 2 and n - 1 of the history."""
    from graphrt.speculative.draft_prep import draft_prep
    g = torch.Generator().manual_seed(b * 10 + k)
    w = 40
    history = torch.randint(0, 1000, (b, w), generator=g, dtype=torch.int32)
    num = torch.randint(0, w + 1, (b,), generator=g, dtype=torch.int32)
    limit = torch.randint(1, w + 1, (b,), generator=g, dtype=torch.int32)
    num[0], limit[-1] = 0, 0                                 # an empty slot, a finished one
    active = (num > 0) & (num < limit)
    n = num.long()
    idx = torch.stack([(n - 2).clamp(0, w - 1), (n - 1).clamp(0, w - 1)], dim=1)
    count = torch.full((b,), -3, dtype=torch.int32)
    toks, base = draft_prep(history, num, limit, k, count)
    assert torch.equal(toks, history.gather(1, idx).long())
    assert torch.equal(base, torch.where(active, num - 2, -1).to(torch.int32))
    assert torch.equal(count, torch.where(active, k, 0).to(torch.int32))
    with pytest.raises(ValueError, match="^limit: "):
        draft_prep(history, num, limit.long(), k, count)
    for bad in (0, True, 2.0):
        with pytest.raises(ValueError, match="^k: "):
            draft_prep(history, num, limit, bad, count)
