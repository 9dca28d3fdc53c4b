"""Eagle3Head / Eagle3Drafter on CPU (float32) against the dense float32 head of _eagle3_ref: the
target-hidden path over ragged prompts, chain steps, draft-extend after a verify with different
accepted counts, padding rows, norm_before_residual, the draft vocabulary mapping, bad input."""
from __future__ import annotations

import pytest
import torch

from _eagle3_ref import D, H, HKV, V, DenseHead, original_config, random_tensors
from graphrt.attention.kvcache import PagedKVCache
from graphrt.speculative.eagle3 import Eagle3Drafter, Eagle3Head, parse_config
from graphrt.speculative.eagle3.weights import fuse

PAGE, POOL, WIDTH, VD = 4, 40, 10, 40
ATOL = 2e-4


def _setup(seed=0, *, norm_before_residual=False):
    cfg = parse_config(original_config(draft_vocab=VD, norm_before_residual=norm_before_residual))
    tensors = random_tensors(draft_vocab=VD, seed=seed)
    g = torch.Generator().manual_seed(seed + 1)
    embed = torch.randn(V, H, generator=g)
    head = Eagle3Head(cfg, fuse(cfg, tensors, dtype=torch.float32, device="cpu", where="t"),
                      target_embed=embed, max_positions=256)
    cache = PagedKVCache(torch.randn(POOL, PAGE, HKV, D, generator=g), torch.randn(POOL, PAGE, HKV, D, generator=g))
    table = torch.randperm(POOL, generator=g)[: 3 * WIDTH].view(3, WIDTH).to(torch.int32).contiguous()
    return head, DenseHead(tensors, embed, norm_before_residual=norm_before_residual), tensors, embed, cache, table


def _dense(tensors, embed, nbr=False):
    return DenseHead(tensors, embed, norm_before_residual=nbr)


def _close(a, b):
    assert torch.allclose(a.float(), b.float(), atol=ATOL, rtol=1e-4), (a - b).abs().max()


@pytest.mark.parametrize("nbr", [False, True])
def test_prefill_then_chain_matches_dense(nbr):
    head, _, tensors, embed, cache, table = _setup(int(nbr), norm_before_residual=nbr)
    lens = [7, 19]                                     # 19: two prefill chunks and a partial one
    g = torch.Generator().manual_seed(5)
    h3 = torch.randn(sum(lens), 3 * H, generator=g)
    toks = torch.randint(0, V, (sum(lens),), generator=g)
    err = torch.zeros(1, dtype=torch.int32)
    logits, h = head.prefill(h3, toks, lens, cache, table, err)
    dense, start = [], 0
    for r, n in enumerate(lens):
        ref = _dense(tensors, embed, nbr)
        for t in range(n):
            lg, hh = ref.target(h3[start + t], int(toks[start + t]), t)
        _close(logits[r], lg)
        _close(h[r], hh)
        dense.append((ref, hh))
        start += n
    # three chain steps with chosen tokens, both rows in one batch
    cl = torch.tensor(lens, dtype=torch.int32)
    for j in range(3):
        tok = torch.randint(0, V, (2,), generator=g)
        logits, h = head.chain_step(h, tok, cl + j, cache, table, err)
        for r in range(2):
            ref, prev = dense[r]
            lg, hh = ref.step(prev, int(tok[r]), lens[r] + j)
            _close(logits[r], lg)
            _close(h[r], hh)
            dense[r] = (ref, hh)
    assert int(err) == 0


def test_prefill_pieces_take_few_query_lengths():
    """head.prefill_chunks: the pieces tile [0, n) in order; over every n the query lengths are
    the chunk and the powers of two below it (the multi-query kernel is compiled per length: a
    prompt of a new length must not compile it again, which stalled every stream for seconds)."""
    from graphrt.speculative.eagle3.head import PREFILL_CHUNK, prefill_chunks
    sizes = set()
    for n in range(1, 200):
        pieces = prefill_chunks(n)
        assert [s for s, _ in pieces] == [sum(q for _, q in pieces[:i]) for i in range(len(pieces))]
        assert sum(q for _, q in pieces) == n
        sizes.update(q for _, q in pieces)
    assert sizes == {PREFILL_CHUNK, 8, 4, 2, 1}
    assert prefill_chunks(12, 12) == [(0, 12)] and prefill_chunks(23, 12) == [(0, 12), (12, 8), (20, 2), (22, 1)]
    assert prefill_chunks(0) == []
    for bad, field in (((5, 0), "chunk"), ((5, -2), "chunk"), ((5, 2.0), "chunk"), ((-1,), "n"), ((True,), "n")):
        with pytest.raises(ValueError, match=field):
            prefill_chunks(*bad)


def test_warm_prefill_compiles_every_tile_size_and_writes_nothing(monkeypatch):
    """Eagle3Head.warm_prefill (run at capture, before serving) launches the multi-query kernel
    at every query length prefill_chunks can use, for any n and chunk (on the H200 each new length
    compiled it while serving: ~1.4 s stalls on the first prompts of new lengths), on a padding
    row: the cache is unchanged and no error is flagged."""
    import graphrt.speculative.eagle3.head as head_mod
    from graphrt.speculative.eagle3.head import prefill_chunks, prefill_tile_sizes
    head, _, _, _, cache, table = _setup(3)
    seen, real = [], head_mod.multiquery_attention

    def spy(q, *a, **kw):
        seen.append(q.shape[1])
        return real(q, *a, **kw)
    monkeypatch.setattr(head_mod, "multiquery_attention", spy)
    before = [t.clone() for t in cache.as_tuple()]
    err = torch.zeros(1, dtype=torch.int32)
    for chunk in (16, 12, 5, 1):
        seen.clear()
        head.warm_prefill(cache, table, err, chunk=chunk)
        used = {q for n in range(1, 80) for _, q in prefill_chunks(n, chunk)}
        assert used <= set(seen) == set(prefill_tile_sizes(chunk)), (chunk, used, seen)
    assert prefill_tile_sizes(16) == (1, 2, 4, 8, 16) and prefill_tile_sizes(12) == (1, 2, 4, 8, 12)
    assert all(torch.equal(a, b) for a, b in zip(before, cache.as_tuple())) and int(err) == 0
    for bad in (0, -3, 2.0, True):
        with pytest.raises(ValueError, match="chunk"):
            prefill_tile_sizes(bad)


@pytest.mark.parametrize("accepted", [(0, 3), (3, 1), (2, 0)])
def test_round_after_verify_matches_dense(accepted):
    """Prefill n0 tokens, chain k - 1 steps (draft K/V), then a verify's draft-extend over k + 1
    slots with accepted counts a: the round's proposals equal the dense head that saw the true
    hidden states at 0 .. n0 + a and then chained greedily."""
    k, lens = 3, [6, 9]
    head, _, tensors, embed, cache, table = _setup(3)
    g = torch.Generator().manual_seed(11)
    h3 = torch.randn(sum(lens), 3 * H, generator=g)
    toks = torch.randint(0, V, (sum(lens),), generator=g)
    err = torch.zeros(1, dtype=torch.int32)
    drafter = Eagle3Drafter(head, cache, k, max_len=64)
    first = torch.empty(2, k, dtype=torch.int64)
    drafter.prefill(h3, toks, lens, table, first, err)
    # the verify: hidden states of [t_n, d_1 .. d_k] at n .. n + k; emitted tokens e_0 .. e_a
    vh = torch.randn(2, k + 1, 3 * H, generator=g)
    acc = torch.tensor(accepted, dtype=torch.int32)
    emitted = torch.full((2, k + 1), -1, dtype=torch.int64)
    for r in range(2):
        a = accepted[r]
        emitted[r, :a] = first[r, :a]
        emitted[r, a] = int(torch.randint(0, V, (1,), generator=g))
    props = torch.empty(2, k, dtype=torch.int64)
    drafter.round(vh, emitted, torch.tensor(lens, dtype=torch.int32), acc, torch.ones(2, dtype=torch.bool),
                  table, props, err)
    start = 0
    for r, n in enumerate(lens):
        ref = _dense(tensors, embed)
        for t in range(n):
            ref.target(h3[start + t], int(toks[start + t]), t)
        for j in range(accepted[r] + 1):
            lg, hh = ref.target(vh[r, j], int(emitted[r, j]), n + j)
        want, ids = [], ref.draft_ids()
        for j in range(k):
            d = int(ids[lg.argmax()])
            want.append(d)
            if j + 1 < k:
                lg, hh = ref.step(hh, d, n + accepted[r] + 1 + j)
        assert props[r].tolist() == want
        start += n
    assert int(err) == 0


def test_padding_row_writes_nothing():
    head, _, _, _, cache, table = _setup(4)
    before_k, before_v = cache.k.clone(), cache.v.clone()
    err = torch.zeros(1, dtype=torch.int32)
    h3 = torch.randn(2, 3, 3 * H)
    toks = torch.randint(0, V, (2, 3))
    head.extend(h3, toks, torch.tensor([-1, 5], dtype=torch.int32), cache, table, err)
    pages0 = table[0].long()
    assert torch.equal(cache.k[pages0], before_k[pages0]) and torch.equal(cache.v[pages0], before_v[pages0])
    p1 = int(table[1, 5 // PAGE])                      # row 1 wrote positions 5, 6, 7
    assert not torch.equal(cache.k[p1], before_k[p1])
    assert int(err) == 0


def test_draft_vocabulary_maps_to_target_ids():
    head, ref, *_ = _setup(2)
    ids = ref.draft_ids()
    assert torch.equal(head.weights.draft_ids, ids) and torch.equal(ids, torch.arange(0, 2 * VD, 2))
    x = torch.randn(3, VD)
    full = head.target_logits(x)
    assert full.shape == (3, V) and torch.equal(full[:, ids], x)
    assert torch.isinf(full[:, 1]).all()
    assert torch.equal(head.to_target(x.argmax(-1)), full.argmax(-1))


def test_bad_input():
    head, _, tensors, embed, cache, table = _setup(1)
    with pytest.raises(ValueError, match="target_embed"):
        Eagle3Head(head.config, head.weights, target_embed=embed[:, :10])
    with pytest.raises(ValueError, match="target_embed"):
        Eagle3Head(head.config, head.weights, target_embed=None)
    with pytest.raises(ValueError, match="k: must be"):
        Eagle3Drafter(head, cache, 0, max_len=8)
    err = torch.zeros(1, dtype=torch.int32)
    with pytest.raises(ValueError, match="lens"):
        head.prefill(torch.randn(5, 3 * H), torch.zeros(5, dtype=torch.int64), [2, 2], cache, table, err)
