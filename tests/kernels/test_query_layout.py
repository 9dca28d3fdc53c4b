"""The query rows' layout in one launch (kernels/query_layout.py) against the torch ops it
replaces in the multi-query layer loop and the EAGLE-3 head: padding rows, partial rows (q_lens)."""
from __future__ import annotations

import pytest
import torch

from graphrt.kernels.query_layout import query_layout


def _reference(cache_lens, nq, q_lens, offset=0):
    b = cache_lens.shape[0]
    live = cache_lens >= 0
    cache_lens = torch.where(live, cache_lens + offset, cache_lens)
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


@pytest.mark.parametrize("offset", [1, 3, 17])
def test_query_layout_offset_shifts_live_rows_only(offset):
    """The EAGLE-3 chain's form: one base tensor (-1 = idle slot), each step at its own offset;
    the same as the torch ops on base + offset with the padding rows left at -1."""
    cache_lens = torch.tensor([-1, 0, 5, 40, -1, 2], dtype=torch.int32)
    want = _reference(cache_lens, 1, None, offset)
    got = query_layout(cache_lens, 1, offset=offset)
    for w, x in zip(want, got):
        assert torch.equal(x, w.to(torch.int32))
    shifted = torch.where(cache_lens >= 0, cache_lens + offset, -1).to(torch.int32)
    for w, x in zip(query_layout(shifted, 1), got):
        assert torch.equal(x, w)


def test_query_layout_names_the_bad_field():
    ok = torch.zeros(3, dtype=torch.int32)
    with pytest.raises(ValueError, match="cache_lens"):
        query_layout(ok.long(), 2)
    with pytest.raises(ValueError, match="nq"):
        query_layout(ok, 0)
    with pytest.raises(ValueError, match="q_lens"):
        query_layout(ok, 2, torch.zeros(4, dtype=torch.int32))
    for bad in (-1, True, 2.0, 2 ** 30):
        with pytest.raises(ValueError, match="^offset: "):
            query_layout(ok, 2, offset=bad)
