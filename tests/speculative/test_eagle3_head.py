"""Eagle3Head / Eagle3Drafter on CPU (float32) against the dense float32 head of _eagle3_ref: the
target-hidden path over ragged prompts, chain steps, draft-extend after a verify with different
accepted counts, padding rows, norm_before_residual, the draft vocabulary mapping, bad input."""
from __future__ import annotations

import copy

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


def test_long_chain_steps_split_the_decode_attention_and_match_dense():
    """Chain steps attend through the one-launch decode kernel: at 150+ cached keys with the
    drafter's MAX_SPLITS (> 1: partials merged by the last split, in the drafter's scratch) and
    with one split, both equal the dense float32 head; the scratch's counters end at zero."""
    head, _, tensors, embed, _, _ = _setup(6)
    g = torch.Generator().manual_seed(8)
    pool = 48
    cache0 = PagedKVCache(torch.randn(pool, PAGE, HKV, D, generator=g), torch.randn(pool, PAGE, HKV, D, generator=g))
    table = torch.randperm(pool, generator=g)[None].to(torch.int32).contiguous()     # [1, 48]: 192 positions
    n = 150
    h3 = torch.randn(n, 3 * H, generator=g)
    toks = torch.randint(0, V, (n,), generator=g)
    chain = torch.randint(0, V, (3,), generator=g)
    drafter = Eagle3Drafter(head, cache0, 4, max_len=pool * PAGE, max_batch=2)
    splits = drafter.chain_splits(1)
    assert splits > 1
    ref = _dense(tensors, embed)
    for t in range(n):
        lg0, hh0 = ref.target(h3[t], int(toks[t]), t)
    err = torch.zeros(1, dtype=torch.int32)
    for s in (splits, 1):
        cache = PagedKVCache(cache0.k.clone(), cache0.v.clone())
        logits, h = head.prefill(h3, toks, [n], cache, table, err)
        _close(logits[0], lg0)
        r, hh = copy.deepcopy(ref), hh0                  # the dense head after the prompt, per variant
        for j in range(3):
            logits, h = head.chain_step(h, chain[j:j + 1], torch.tensor([n], dtype=torch.int32), cache, table, err,
                                        splits=s, offset=j, scratch=drafter.scratch if s > 1 else None)
            lg, hh = r.step(hh, int(chain[j]), n + j)
            _close(logits[0], lg)
            _close(h[0], hh)
    assert int(err) == 0 and int(drafter.scratch.counters.abs().sum()) == 0


def test_warm_prefill_reaches_every_specialisation_and_writes_nothing(monkeypatch):
    """Eagle3Head.warm_prefill (run at capture, before serving) runs the eager prompt pass's
    K/V kernels at a token count of each Triton specialisation class (1, a multiple of 16,
    another) and the last position's attention at one query token (on the H200 each new
    specialisation compiled while serving: ~1.4 s stalls), on a padding row: the cache is
    unchanged and no error is flagged."""
    import graphrt.speculative.eagle3.head as head_mod
    head, _, _, _, cache, table = _setup(3)
    seen, real = [], head_mod.rope_append_prefill
    attn, real_attn = [], head_mod.multiquery_attention

    def spy(qkv, *a, **kw):
        seen.append(qkv.shape[0])
        return real(qkv, *a, **kw)

    def spy_attn(q, *a, **kw):
        attn.append(q.shape[1])
        return real_attn(q, *a, **kw)
    aligned, real_embed = [], head_mod.embed_rms_norm

    def spy_embed(table_, ids, *a, **kw):
        aligned.append(ids.data_ptr() % 16 == 0)
        return real_embed(table_, ids, *a, **kw)
    monkeypatch.setattr(head_mod, "rope_append_prefill", spy)
    monkeypatch.setattr(head_mod, "multiquery_attention", spy_attn)
    monkeypatch.setattr(head_mod, "embed_rms_norm", spy_embed)
    before = [t.clone() for t in cache.as_tuple()]
    err = torch.zeros(1, dtype=torch.int32)
    head.warm_prefill(cache, table, err)
    assert sorted(set(seen)) == [1, 16, 17] == sorted(head_mod.WARM_TOKENS) and attn == [1]
    assert set(aligned) == {True, False}          # token pointers 16-byte aligned and not (Triton specialises)
    assert all(torch.equal(a, b) for a, b in zip(before, cache.as_tuple())) and int(err) == 0


def test_warm_first_compiles_the_q1_round_and_writes_nothing(monkeypatch):
    """Eagle3Drafter.warm_first (run at capture on CUDA): the eager first draft on a padding row,
    its round inputs at q = 1 (the variant no round graph compiles where the prompt pass is
    eager); the head's cache unchanged, no error flagged."""
    import graphrt.speculative.eagle3.head as head_mod
    import graphrt.speculative.eagle3.propose as propose_mod
    head, _, _, _, cache, table = _setup(3)
    qs, real = [], propose_mod.round_prep
    splits, real_attn = [], head_mod.decode_attention

    def spy(emitted, cache_lens, q):
        qs.append(q)
        return real(emitted, cache_lens, q)

    def spy_attn(*a, max_splits=1, **kw):
        splits.append(max_splits)
        return real_attn(*a, max_splits=max_splits, **kw)
    monkeypatch.setattr(propose_mod, "round_prep", spy)
    monkeypatch.setattr(head_mod, "decode_attention", spy_attn)
    before = [t.clone() for t in cache.as_tuple()]
    err = torch.zeros(1, dtype=torch.int32)
    drafter = Eagle3Drafter(head, cache, 3, max_len=4096, max_batch=24)
    drafter.warm_first(table, err)
    assert qs == [1]
    # every MAX_SPLITS a chain step can take (batch rounded up to a power of two, <= max_batch):
    # the eager first draft runs at any row count, and each value is a kernel of its own
    variants = drafter.chain_variants()
    assert set(splits) == set(variants) and len(variants) > 2
    assert variants == sorted({drafter.chain_splits(b) for b in range(1, 25)}, reverse=True)
    assert drafter.chain_splits(5) == drafter.chain_splits(8) and drafter.chain_splits(24) == drafter.chain_splits(17)
    assert all(torch.equal(a, b) for a, b in zip(before, cache.as_tuple())) and int(err) == 0
    assert int(drafter.scratch.counters.abs().sum()) == 0


def test_write_kv_writes_the_extend_kv_and_padding_writes_nothing():
    """write_kv (the prompt pass: no attention) writes the K/V extend writes; with q_lens the
    padding positions of each row write nothing, and a padding row (cache_lens -1) nothing."""
    head, _, _, _, cache, table = _setup(5)
    g = torch.Generator().manual_seed(2)
    h3 = torch.randn(3, 6, 3 * H, generator=g)
    toks = torch.randint(0, V, (3, 6), generator=g)
    cl = torch.tensor([0, 5, -1], dtype=torch.int32)
    err = torch.zeros(1, dtype=torch.int32)
    ref = PagedKVCache(cache.k.clone(), cache.v.clone())
    head.extend(h3[:2, :4], toks[:2, :4], cl[:2], ref, table, err)         # the real positions only
    head.write_kv(h3, toks, cl, cache, table, err, q_lens=torch.tensor([4, 4, 6], dtype=torch.int32))
    assert torch.allclose(cache.k, ref.k, atol=1e-6) and torch.allclose(cache.v, ref.v, atol=1e-6)
    assert int(err) == 0


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
    drafter.round(vh, emitted, torch.tensor(lens, dtype=torch.int32), acc + 1, table, props, err)
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
    with pytest.raises(ValueError, match="max_batch: must be"):
        Eagle3Drafter(head, cache, 2, max_len=8, max_batch=0)
    with pytest.raises(ValueError, match="scratch"):     # a split chain step needs the drafter's scratch
        head.chain_step(torch.zeros(1, H), torch.zeros(1, dtype=torch.int64), torch.tensor([3], dtype=torch.int32),
                        cache, table, torch.zeros(1, dtype=torch.int32), splits=2)
    err = torch.zeros(1, dtype=torch.int32)
    with pytest.raises(ValueError, match="lens"):
        head.prefill(torch.randn(5, 3 * H), torch.zeros(5, dtype=torch.int64), [2, 2], cache, table, err)


def test_bad_at_and_offset_name_the_field():
    """extend(at=): [B] int64 rows of B * Q on the head's device; chain_step(offset=): a host int >= 0."""
    head, _, _, _, cache, table = _setup(3)
    h3, toks = torch.zeros(2, 3, 3 * H), torch.zeros(2, 3, dtype=torch.int64)
    cl, err = torch.tensor([0, 4], dtype=torch.int32), torch.zeros(1, dtype=torch.int32)
    for bad in (torch.zeros(2, dtype=torch.int32), torch.zeros(3, dtype=torch.int64), [0, 1]):
        with pytest.raises(ValueError, match="^at: "):
            head.extend(h3, toks, cl, cache, table, err, at=bad)
    with pytest.raises(ValueError, match="^offset: "):
        head.chain_step(torch.zeros(2, H), toks[:, 0], cl, cache, table, err, offset=-2)
