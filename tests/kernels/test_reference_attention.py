"""kernels/reference_attention.py (the torch kernel set's multi-query attention and query layout)
against the Triton kernels, run by the interpreter on the same inputs: both layouts, GQA, a verify
step (every token real), a prompt piece after a cached prefix with per-row q_lens (padding tokens,
a padding row), FP8 pages with their scales; query_layout's positions, rows and lengths equal; and
both refuse the same bad arguments (kernels/mq_launch.py's check)."""
from __future__ import annotations

import pytest
import torch

from graphrt.attention.kvcache import PagedKVCache
from graphrt.kernels import multiquery_attention as tri_mq, query_layout as tri_ql
from graphrt.kernels import reference_attention as ref

PAGE = 4


def _cache(layout: str, hkv: int, d: int, seed: int, fp8: bool = False) -> PagedKVCache:
    g = torch.Generator().manual_seed(seed)
    shape = (24, PAGE, hkv, d) if layout == "NHD" else (24, hkv, PAGE, d)
    k, v = torch.randn(shape, generator=g), torch.randn(shape, generator=g)
    if not fp8:
        return PagedKVCache(k, v, layout)
    return PagedKVCache(k.to(torch.float8_e4m3fn), v.to(torch.float8_e4m3fn), layout,
                        scale=torch.tensor([0.5, 2.0]))


@pytest.mark.parametrize("layout,hq,hkv,nq,q_lens,fp8", [
    ("NHD", 4, 2, 3, None, False),                          # a verify step: k + 1 = 3 tokens a row
    ("HND", 6, 2, 5, [5, 2, 0, 1], False),                  # prompt pieces: padding tokens, an empty row
    ("NHD", 2, 2, 2, None, True)])                          # FP8 pages
def test_multiquery_attention_equals_tritons(layout, hq, hkv, nq, q_lens, fp8):
    d, b = 16, 4
    cache = _cache(layout, hkv, d, nq, fp8)
    table = torch.randperm(24, generator=torch.Generator().manual_seed(1))[:20].to(torch.int32).view(b, 5)
    kv_lens = torch.tensor([nq, 11, 0, 17], dtype=torch.int32)             # row 2: padding (no keys)
    ql = None if q_lens is None else torch.tensor(q_lens, dtype=torch.int32)
    if ql is not None:
        kv_lens = torch.where(ql > 0, kv_lens.clamp_min(1), 0).to(torch.int32)
    q = torch.randn((b, nq, hq, d), generator=torch.Generator().manual_seed(2))
    want = tri_mq.multiquery_attention(q, cache, table, kv_lens, q_lens=ql, splits=2)
    got = ref.multiquery_attention(q, cache, table, kv_lens, q_lens=ql, splits=2)
    real = torch.arange(nq)[None, :] < (ql if ql is not None else torch.full((b,), nq))[:, None]
    real &= kv_lens[:, None] > 0                             # padding tokens: unused (zeros here)
    torch.testing.assert_close(got[real], want[real], rtol=1e-4, atol=1e-4)
    assert bool(got[~real].eq(0).all()) and bool(got[2].eq(0).all())


@pytest.mark.parametrize("q_lens,offset", [(None, 0), ([3, 1, 0], 2)])
def test_query_layout_equals_tritons(q_lens, offset):
    cache_lens = torch.tensor([5, -1, 0], dtype=torch.int32)
    ql = None if q_lens is None else torch.tensor(q_lens, dtype=torch.int32)
    want = tri_ql.query_layout(cache_lens, 3, ql, offset=offset)
    got = ref.query_layout(cache_lens, 3, ql, offset=offset)
    assert all(torch.equal(a, b) and a.dtype == b.dtype for a, b in zip(got, want))


def test_bad_arguments_are_refused_alike():
    cache = _cache("NHD", 2, 16, 0)
    q, table, lens = torch.zeros(2, 3, 4, 16), torch.zeros(2, 5, dtype=torch.int32), torch.zeros(2, dtype=torch.int32)
    for impl in (tri_mq, ref):
        with pytest.raises(ValueError, match="^q: expected contiguous"):
            impl.multiquery_attention(q[..., :8], cache, table, lens)
        with pytest.raises(ValueError, match="^kv_lens: "):
            impl.multiquery_attention(q, cache, table, lens.long())
        with pytest.raises(ValueError, match="^splits: "):
            impl.multiquery_attention(q, cache, table, lens, splits=0)
    for impl in (tri_ql, ref):
        with pytest.raises(ValueError, match="^nq: "):
            impl.query_layout(lens, 0)
        with pytest.raises(ValueError, match="^offset: "):
            impl.query_layout(lens, 2, offset=-1)
