"""The query rows' layout in one launch (kernels/query_layout.py) against the torch ops it
replaces in the multi-query layer loop and the EAGLE-3 head: padding rows, partial rows (q_lens)."""
from __future__ import annotations

import pytest
import torch

from graphrt.kernels.query_layout import query_layout


def _reference(cache_lens, nq, q_lens):
    b = cache_lens.shape[0]
    live = cache_lens >= 0
    steps = torch.arange(nq, dtype=torch.int32)
    positions = (cache_lens.clamp_min(0)[:, None] + steps[None, :]).reshape(-1)
    real = live[:, None] if q_lens is None else live[:, None] & (steps[None, :] < q_lens[:, None])
    rows = torch.where(real, torch.arange(b, dtype=torch.int32)[:, None], -1)
    rows = rows.expand(b, nq).reshape(-1).contiguous()
    kv_lens = torch.where(live, cache_lens + (nq if q_lens is None else q_lens), 0).to(torch.int32)
    return positions, rows, kv_lens


@pytest.mark.parametrize("b, nq", [(1, 1), (4, 5), (9, 16), (70, 3)])
@pytest.mark.parametrize("partial", [False, True])
def test_query_layout_equals_the_torch_ops(b, nq, partial):
    g = torch.Generator().manual_seed(b * 100 + nq)
    cache_lens = torch.randint(-1, 500, (b,), generator=g, dtype=torch.int32)
    cache_lens[0] = -1
    q_lens = torch.randint(0, nq + 1, (b,), generator=g, dtype=torch.int32) if partial else None
    want = _reference(cache_lens, nq, q_lens)
    got = query_layout(cache_lens, nq, q_lens)
    for w, x in zip(want, got):
        assert x.dtype == torch.int32 and torch.equal(x, w.to(torch.int32))


def test_query_layout_names_the_bad_field():
    ok = torch.zeros(3, dtype=torch.int32)
    with pytest.raises(ValueError, match="cache_lens"):
        query_layout(ok.long(), 2)
    with pytest.raises(ValueError, match="nq"):
        query_layout(ok, 0)
    with pytest.raises(ValueError, match="q_lens"):
        query_layout(ok, 2, torch.zeros(4, dtype=torch.int32))
