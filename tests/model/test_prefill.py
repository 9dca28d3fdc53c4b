"""graphrt.model.prefill: chunk planning and the float32 paged causal reference (CPU); FlashInfer on GPU."""
from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given, settings, strategies as st

from graphrt import RuntimeConfig
from graphrt.attention.kvcache import PagedKVCache
from graphrt.model.prefill import PrefillAttention, plan_chunks


@settings(max_examples=50, deadline=None)
@given(st.lists(st.integers(1, 300), min_size=1, max_size=6), st.integers(1, 200))
def test_plan_chunks_covers_every_token_once_in_order(lens, max_tokens):
    chunks = plan_chunks(lens, max_tokens=max_tokens)
    seen = {i: [] for i in range(len(lens))}
    for c in chunks:
        assert 1 <= c.num_tokens <= max_tokens
        for i, s, n in zip(c.seqs, c.starts, c.lens):
            seen[i] += list(range(s, s + n))
    assert all(seen[i] == list(range(n)) for i, n in enumerate(lens))
    assert len(chunks) == -(-sum(lens) // max_tokens)


def test_plan_chunks_rejects_bad_input():
    with pytest.raises(ValueError, match="max_tokens"):
        plan_chunks([3], max_tokens=0)
    with pytest.raises(ValueError, match="prompt_lens"):
        plan_chunks([3, 0], max_tokens=4)


def _dense_causal(q, k, v, hkv):
    """q [n, Hq, D], k/v [n, Hkv, D] of one sequence from position 0: plain causal attention."""
    n, hq, d = q.shape
    k = k.repeat_interleave(hq // hkv, dim=1).double()
    v = v.repeat_interleave(hq // hkv, dim=1).double()
    s = torch.einsum("nhd,lhd->hnl", q.double(), k) / math.sqrt(d)
    s = s.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
    return torch.einsum("hnl,lhd->nhd", torch.softmax(s, -1), v)


def _setup(layout, device="cpu", dtype="float32", lens=(37, 5, 64)):
    cfg = RuntimeConfig(num_qo_heads=8, num_kv_heads=2, head_dim=64, page_size=16,
                        max_context_len=256, buckets=[4], dtype=dtype, kv_layout=layout,
                        backend="reference")
    kv = PagedKVCache.allocate(cfg, 64, device, seed=1)
    g = torch.Generator().manual_seed(0)
    table = torch.randperm(64, generator=g)[:4 * 16].view(4, 16).to(torch.int32)
    # each prompt's K/V, written into its pages (what rope_append_prefill does per chunk)
    ks, vs = [], []
    for r, n in enumerate(lens):
        k, v = torch.randn(n, 2, 64, generator=g), torch.randn(n, 2, 64, generator=g)
        ks.append(k), vs.append(v)
        for p in range(n):
            page, slot = int(table[r, p // 16]), p % 16
            if layout == "NHD":
                kv.k[page, slot], kv.v[page, slot] = k[p].to(kv.k), v[p].to(kv.v)
            else:
                kv.k[page, :, slot], kv.v[page, :, slot] = k[p].to(kv.k), v[p].to(kv.v)
    return cfg, kv, table, ks, vs, g


@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("max_tokens", [1000, 23])
def test_reference_prefill_chunked_equals_dense_causal(layout, max_tokens):
    lens = (37, 5, 64)
    cfg, kv, table, ks, vs, g = _setup(layout, lens=lens)
    qs = [torch.randn(n, 8, 64, generator=g) for n in lens]
    attn = PrefillAttention(cfg, "cpu")
    got = [[] for _ in lens]
    for chunk in plan_chunks(lens, max_tokens=max_tokens):
        meta = attn.plan(chunk, table)
        q = torch.cat([qs[i][s: s + n] for i, s, n in zip(chunk.seqs, chunk.starts, chunk.lens)])
        assert meta.positions.tolist() == sum([list(range(s, s + n)) for s, n in
                                               zip(chunk.starts, chunk.lens)], [])
        out = attn.run(q, kv)
        o = 0
        for i, n in zip(chunk.seqs, chunk.lens):
            got[i].append(out[o: o + n])
            o += n
    for i in range(len(lens)):
        ref = _dense_causal(qs[i], ks[i], vs[i], 2)
        torch.testing.assert_close(torch.cat(got[i]).double(), ref, rtol=1e-4, atol=1e-5)


def test_prefill_attention_rejects_bad_arguments():
    cfg = _setup("NHD")[0]
    with pytest.raises(ValueError, match="backend: 'fa4' is not one of"):
        PrefillAttention(cfg, "cpu", backend="fa4")
    with pytest.raises(ValueError, match="workspace_mb"):
        PrefillAttention(cfg, "cpu", workspace_mb=0)
    with pytest.raises(RuntimeError, match="before plan"):
        PrefillAttention(cfg, "cpu").run(torch.zeros(1, 8, 64), None)


def test_plan_refuses_a_table_too_narrow_or_too_long_prompt():
    cfg, kv, table, *_ = _setup("NHD")
    attn = PrefillAttention(cfg, "cpu")
    with pytest.raises(ValueError, match="block_table: row 0 holds 2 pages"):
        attn.plan(plan_chunks([40], max_tokens=64)[0], table[:, :2])
    with pytest.raises(ValueError, match="max_context_len=256"):
        attn.plan(plan_chunks([300], max_tokens=400)[0], table)


@pytest.mark.gpu
@pytest.mark.parametrize("layout", ["NHD", "HND"])
def test_flashinfer_prefill_equals_reference_bf16(layout):
    lens = (37, 5, 64, 200)
    cfg, kv, table, ks, vs, g = _setup(layout, "cuda", "bfloat16", lens=lens)
    attn = PrefillAttention(cfg, "cuda")
    for max_tokens in (4096, 50):
        for chunk in plan_chunks(lens, max_tokens=max_tokens):
            attn.plan(chunk, table)
            q = torch.randn(chunk.num_tokens, 8, 64, generator=g).to("cuda", torch.bfloat16)
            out = attn.run(q, kv).float()
            ref = attn.run(q, kv, force_reference=True).float()
            err = ((out - ref).norm() / ref.norm()).item()
            assert err < 2e-2, f"chunk {chunk}: rel err {err}"
