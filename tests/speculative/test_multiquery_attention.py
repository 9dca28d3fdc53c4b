"""Plan-free multi-query paged attention (kernels/multiquery_attention.py) vs float32 torch over
K/V gathered from the pages with an explicit causal mask; split-KV, GQA, both layouts, padding."""
from __future__ import annotations

import pytest
import torch

from _spec_helpers import PAGE, multiquery_reference
from graphrt.attention.kvcache import PagedKVCache
from graphrt.kernels.multiquery_attention import multiquery_attention

@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("splits,nq,hq,hkv", [(1, 3, 4, 2), (2, 5, 4, 2), (3, 2, 2, 2), (1, 1, 8, 2)])
def test_matches_reference(layout, splits, nq, hq, hkv):
    gen = torch.Generator().manual_seed(splits * 100 + nq)
    d, pool = 32, 30
    shape = (pool, PAGE, hkv, d) if layout == "NHD" else (pool, hkv, PAGE, d)
    cache = PagedKVCache(torch.randn(shape, generator=gen), torch.randn(shape, generator=gen), layout)
    lens = torch.tensor([nq, 0, 37, 16 + nq, 70][: 5], dtype=torch.int32)
    table = torch.randperm(pool, generator=gen)[:25].to(torch.int32).view(5, 5)
    q = torch.randn((5, nq, hq, d), generator=gen)
    got = multiquery_attention(q, cache, table, lens, splits=splits)
    torch.testing.assert_close(got, multiquery_reference(q, cache, table, lens), rtol=1e-4, atol=1e-4)
    assert got[1].eq(0).all()                              # padding row


def test_bad_input():
    cache = PagedKVCache(torch.zeros(4, PAGE, 2, 32), torch.zeros(4, PAGE, 2, 32), "NHD")
    q = torch.zeros(2, 3, 4, 32)
    table = torch.zeros((2, 2), dtype=torch.int32)
    lens = torch.full((2,), 3, dtype=torch.int32)
    with pytest.raises(ValueError, match="q:"):
        multiquery_attention(q[..., :16].contiguous(), cache, table, lens)
    with pytest.raises(ValueError, match="block_table"):
        multiquery_attention(q, cache, table.long(), lens)
    with pytest.raises(ValueError, match="kv_lens"):
        multiquery_attention(q, cache, table, lens[:1])
    with pytest.raises(ValueError, match="splits"):
        multiquery_attention(q, cache, table, lens, splits=0)
