"""rope_append (q/k norm + RoPE + paged K/V write, one launch) vs a float32 torch reference.

Decode mode over random geometries (head_dim 64/128, GQA groups, NHD/HND, odd batches), with
positions at page boundaries and at the table's last row, padding rows, slots past the block
table, bad page ids and positions outside the cos/sin table; prefill mode over ragged requests
with explicit positions and row ids. TRITON_INTERPRET=1 on CPU.
"""
from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings, strategies as st

from graphrt.kernels import reference as ref
from graphrt.kernels.flags import ERR_KV_SLOT, ERR_PAGE_ID, ERR_POSITION
from graphrt.kernels.rope_append import rope_append_decode, rope_append_prefill
from graphrt.attention.kvcache import PagedKVCache

EPS = 1e-6


def _reference(qkv, cos_sin, cache, table, hq, qn, kn, *, lens=None, pos=None, rows=None):
    """Expected q, the expected K/V cache contents and flags: the kernel's torch reference
    (graphrt/kernels/reference.py, the CPU path's rope_append) on a copy of the cache; decode
    mode with lens, prefill mode with pos / rows."""
    exp = PagedKVCache(cache.k.clone(), cache.v.clone(), cache.layout)
    err = torch.zeros(1, dtype=torch.int32)
    if lens is not None:
        q = ref.rope_append_decode(qkv, cos_sin, exp, table, lens, err, num_q_heads=hq, q_norm=qn,
                                   k_norm=kn, eps=EPS)
    else:
        q = ref.rope_append_prefill(qkv, cos_sin, exp, table, pos, rows, err, num_q_heads=hq, q_norm=qn,
                                    k_norm=kn, eps=EPS)
    return q.float(), exp, int(err)


def _check(q, cache, want_q, want_cache, dtype):
    tol = dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else dict(rtol=1.6e-2, atol=2e-2)
    torch.testing.assert_close(q.float(), want_q, **tol)
    torch.testing.assert_close(cache.k.float(), want_cache.k.float(), **tol)
    torch.testing.assert_close(cache.v, want_cache.v, rtol=0, atol=0)   # v is copied exactly


@st.composite
def geometry(draw):
    d = draw(st.sampled_from([64, 128]))
    hkv = draw(st.sampled_from([1, 2, 4]))
    hq = hkv * draw(st.sampled_from([1, 2, 4]))
    page_size = draw(st.sampled_from([1, 4, 16]))
    max_pages = draw(st.integers(1, 5))
    layout = draw(st.sampled_from(["NHD", "HND"]))
    dtype = draw(st.sampled_from([torch.float32, torch.bfloat16]))
    qk_norm = draw(st.booleans())
    extra = draw(st.sampled_from([0, 2 * page_size]))   # cos/sin rows past the table's reach
    return d, hkv, hq, page_size, max_pages, layout, dtype, qk_norm, extra


def _setup(geo, b, gen):
    d, hkv, hq, page_size, max_pages, layout, dtype, qk_norm, extra = geo
    npages = b * max_pages + 1
    shape = (npages, page_size, hkv, d) if layout == "NHD" else (npages, hkv, page_size, d)
    cache = PagedKVCache(torch.randn(shape, generator=gen).to(dtype),
                         torch.randn(shape, generator=gen).to(dtype), layout)
    max_len = page_size * max_pages
    angles = torch.rand(max_len + extra, d // 2, generator=gen) * 6.3
    cos_sin = torch.cat((angles.cos(), angles.sin()), -1)
    table = torch.randperm(npages, generator=gen)[: b * max_pages].to(torch.int32).view(b, max_pages)
    qkv = torch.randn(b, (hq + 2 * hkv) * d, generator=gen).to(dtype)
    qn = kn = None
    if qk_norm:
        qn, kn = (torch.rand(d, generator=gen) + 0.5).to(dtype), (torch.rand(d, generator=gen) + 0.5).to(dtype)
    return cache, cos_sin, table, qkv, qn, kn, max_len


@settings(max_examples=25, deadline=None)
@given(geo=geometry(), b=st.sampled_from([1, 3, 5, 7]), data=st.data(), seed=st.integers(0, 2**16))
def test_decode_matches_reference(geo, b, data, seed):
    gen = torch.Generator().manual_seed(seed)
    page_size, extra, hq, dtype = geo[3], geo[8], geo[2], geo[6]
    cache, cos_sin, table, qkv, qn, kn, max_len = _setup(geo, b, gen)
    special = [0, 1, page_size, page_size + 1, max_len, max(1, max_len - 1), max_len + 1,
               max_len + extra + 1]                         # padding, boundaries, past the table
    lens = torch.tensor(data.draw(st.lists(st.one_of(st.sampled_from(special), st.integers(0, max_len)),
                                           min_size=b, max_size=b)), dtype=torch.int32)
    for r in data.draw(st.lists(st.integers(0, b - 1), max_size=2)):  # bad page ids
        col = max(int(lens[r]) - 1, 0) // page_size
        if col < table.shape[1]:
            table[r, col] = data.draw(st.sampled_from([-1, cache.num_pages, 2**30]))
    want_q, want_cache, flags = _reference(qkv, cos_sin, cache, table, hq, qn, kn, lens=lens)
    err = torch.zeros(1, dtype=torch.int32)
    bh = data.draw(st.sampled_from([1, 2, None]))   # 1: the GPU's decode choice; None: all heads
    q = rope_append_decode(qkv, cos_sin, cache, table, lens, err, num_q_heads=hq, q_norm=qn,
                           k_norm=kn, eps=EPS, heads_per_program=bh)
    assert q.shape == (b, hq, geo[0]) and q.dtype == dtype
    _check(q, cache, want_q, want_cache, dtype)
    assert int(err) == flags


@settings(max_examples=12, deadline=None)
@given(geo=geometry(), data=st.data(), seed=st.integers(0, 2**16))
def test_prefill_ragged_matches_reference(geo, data, seed):
    gen = torch.Generator().manual_seed(seed)
    hq, dtype = geo[2], geo[6]
    n_req = data.draw(st.integers(1, 3))
    cache, cos_sin, table, _, qn, kn, max_len = _setup(geo, n_req, gen)
    lens = data.draw(st.lists(st.integers(1, max_len), min_size=n_req, max_size=n_req))
    pos = torch.cat([torch.arange(n) for n in lens] + [torch.zeros(2, dtype=torch.int64)])
    rows = torch.cat([torch.full((n,), r) for r, n in enumerate(lens)] + [torch.full((2,), -1)])
    order = torch.randperm(pos.shape[0], generator=gen)              # tokens in any order
    pos, rows = pos[order].to(torch.int32), rows[order].to(torch.int32)
    t, d, hkv = pos.shape[0], geo[0], geo[1]
    qkv = torch.randn(t, (hq + 2 * hkv) * d, generator=gen).to(dtype)
    want_q, want_cache, flags = _reference(qkv, cos_sin, cache, table, hq, qn, kn, pos=pos, rows=rows)
    err = torch.zeros(1, dtype=torch.int32)
    q = rope_append_prefill(qkv, cos_sin, cache, table, pos, rows, err, num_q_heads=hq, q_norm=qn,
                            k_norm=kn, eps=EPS, heads_per_program=data.draw(st.sampled_from([1, 4, None])))
    _check(q, cache, want_q, want_cache, dtype)
    assert int(err) == flags == 0


@pytest.mark.parametrize("rope_append_prefill", [rope_append_prefill, ref.rope_append_prefill],
                         ids=["triton", "torch"])
def test_prefill_flags_rows_past_the_table_and_bad_positions(rope_append_prefill):
    gen = torch.Generator().manual_seed(0)
    geo = (64, 1, 2, 4, 2, "NHD", torch.float32, False, 0)
    cache, cos_sin, table, _, _, _, _ = _setup(geo, 2, gen)
    before = cache.k.clone()
    qkv = torch.randn(2, 4 * 64, generator=gen)
    err = torch.zeros(1, dtype=torch.int32)
    rope_append_prefill(qkv, cos_sin, cache, table, torch.tensor([0, 0], dtype=torch.int32),
                        torch.tensor([2, 5], dtype=torch.int32), err, num_q_heads=2)
    assert int(err) == ERR_KV_SLOT and torch.equal(cache.k, before)
    err.zero_()
    q = rope_append_prefill(qkv, cos_sin, cache, table, torch.tensor([-1, 8], dtype=torch.int32),
                            torch.tensor([0, 1], dtype=torch.int32), err, num_q_heads=2)
    assert int(err) == ERR_POSITION and torch.equal(cache.k, before)
    assert not q.any()                                 # no table row: q is zero, not garbage


def test_bad_arguments_name_the_field():
    gen = torch.Generator().manual_seed(0)
    geo = (64, 1, 2, 4, 2, "HND", torch.float32, False, 0)
    cache, cos_sin, table, qkv, _, _, _ = _setup(geo, 2, gen)
    lens, err = torch.tensor([1, 2], dtype=torch.int32), torch.zeros(1, dtype=torch.int32)
    call = dict(num_q_heads=2)
    with pytest.raises(ValueError, match="qkv"):
        rope_append_decode(qkv[:, :-64], cos_sin, cache, table, lens, err, **call)
    with pytest.raises(ValueError, match="cos_sin"):
        rope_append_decode(qkv, cos_sin.double(), cache, table, lens, err, **call)
    with pytest.raises(ValueError, match="seq_lens"):
        rope_append_decode(qkv, cos_sin, cache, table, lens[:1], err, **call)
    with pytest.raises(ValueError, match="block_table"):
        rope_append_decode(qkv, cos_sin, cache, table.long(), lens, err, **call)
    with pytest.raises(ValueError, match="q_norm, k_norm"):
        rope_append_decode(qkv, cos_sin, cache, table, lens, err, q_norm=torch.ones(64), **call)
    with pytest.raises(ValueError, match="heads_per_program"):
        rope_append_decode(qkv, cos_sin, cache, table, lens, err, heads_per_program=3, **call)
    with pytest.raises(ValueError, match="k_norm"):
        rope_append_decode(qkv, cos_sin, cache, table, lens, err, q_norm=torch.ones(64),
                           k_norm=torch.ones(32), **call)


def test_context_rope_append_after_prepare_guards_the_cache():
    """Through AttentionContext (decode_step's order): prepare(), then rope_append; a bad page id
    is flagged and nothing is written (not redirected into page 0), padding rows write nothing."""
    from graphrt import RuntimeConfig
    from graphrt.attention.backends import make_backend
    from graphrt.attention.buffers import StaticBuffers
    from graphrt.model.context import AttentionContext
    cfg = RuntimeConfig(num_qo_heads=4, num_kv_heads=2, head_dim=64, page_size=4, max_pages_per_seq=4,
                        buckets=[3], dtype="float32", backend="reference")
    kv = PagedKVCache.allocate(cfg, 8, "cpu")
    view = StaticBuffers(cfg, torch.device("cpu")).view(3)
    backend = make_backend(cfg, kv, torch.device("cpu"))
    backend.setup([view])
    view.block_table.copy_(torch.tensor([[1, 2, 3, 4], [5, 99, 6, 7], [0, 0, 0, 0]], dtype=torch.int32))
    view.seq_lens.copy_(torch.tensor([3, 6, 0], dtype=torch.int32))   # row 1 -> page 99; row 2 padding
    before = kv.k.clone()
    ctx = AttentionContext(backend, view, [kv])
    ctx.prepare()
    angles = torch.rand(16, 32)
    q = ctx.rope_append(0, torch.randn(3, 8 * 64), torch.cat((angles.cos(), angles.sin()), -1),
                        num_q_heads=4)
    assert q.shape == (3, 4, 64)
    assert int(view.device_error) == ERR_PAGE_ID
    changed = (kv.k != before).flatten(1).any(1).nonzero().flatten().tolist()
    assert changed == [1]                                 # only row 0's page (pos 2 -> page 1)
