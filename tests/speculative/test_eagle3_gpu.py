"""EAGLE-3 head on CUDA: the float32 round matches the dense head, and a captured round replays with
fresh inputs to the same proposals, K/V and device_error as the eager round (no host sync inside)."""
from __future__ import annotations

import pytest
import torch

from _eagle3_ref import D, H, HKV, V, DenseHead, original_config, random_tensors
from graphrt.attention.kvcache import PagedKVCache
from graphrt.speculative.eagle3 import Eagle3Drafter, Eagle3Head, parse_config
from graphrt.speculative.eagle3.weights import fuse

pytestmark = pytest.mark.gpu
PAGE, POOL, WIDTH, VD, K = 4, 40, 10, 40, 3


def _parts(dtype):
    dev = torch.device("cuda")
    cfg = parse_config(original_config(draft_vocab=VD))
    tensors = random_tensors(draft_vocab=VD, seed=7)
    g = torch.Generator().manual_seed(8)
    embed = torch.randn(V, H, generator=g)
    head = Eagle3Head(cfg, fuse(cfg, tensors, dtype=dtype, device=dev, where="t"),
                      target_embed=embed.to(dev, dtype), max_positions=256)
    cache = PagedKVCache(torch.randn(POOL, PAGE, HKV, D, generator=g).to(dev, dtype),
                         torch.randn(POOL, PAGE, HKV, D, generator=g).to(dev, dtype))
    table = torch.randperm(POOL, generator=g)[: 2 * WIDTH].view(2, WIDTH).to(dev, torch.int32).contiguous()
    return head, cache, table, tensors, embed


def _inputs(seed, dev, dtype):
    g = torch.Generator().manual_seed(seed)
    vh = torch.randn(2, K + 1, 3 * H, generator=g).to(dev, dtype)
    emitted = torch.randint(0, V, (2, K + 1), generator=g).to(dev)
    lens = torch.randint(3, 20, (2,), generator=g).to(dev, torch.int32)
    count = torch.randint(1, K + 2, (2,), generator=g).to(dev, torch.int32)   # a + 1 emitted
    return vh, emitted, lens, count


def test_round_float32_matches_dense():
    head, cache, table, tensors, embed = _parts(torch.float32)
    dev = head.device
    err = torch.zeros(1, dtype=torch.int32, device=dev)
    g = torch.Generator().manual_seed(3)
    n = 12
    h3 = torch.randn(n, 3 * H, generator=g)
    toks = torch.randint(0, V, (n,), generator=g)
    drafter = Eagle3Drafter(head, cache, K, max_len=64)
    props = torch.empty(1, K, dtype=torch.int64, device=dev)
    drafter.prefill(h3.to(dev), toks.to(dev), [n], table, props, err)
    ref = DenseHead(tensors, embed)
    for t in range(n):
        lg, hh = ref.target(h3[t], int(toks[t]), t)
    want, ids = [], ref.draft_ids()
    for j in range(K):
        want.append(int(ids[lg.argmax()]))
        if j + 1 < K:
            lg, hh = ref.step(hh, want[-1], n + j)
    assert props[0].tolist() == want and int(err) == 0


def test_captured_round_replays_like_eager():
    head, cache, table, _, _ = _parts(torch.bfloat16)
    dev, dt = head.device, torch.bfloat16
    drafter = Eagle3Drafter(head, cache, K, max_len=64)
    static = [t.clone() for t in _inputs(0, dev, dt)]
    props = torch.empty(2, K, dtype=torch.int64, device=dev)
    err = torch.zeros(1, dtype=torch.int32, device=dev)
    k0, v0 = cache.k.clone(), cache.v.clone()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        drafter.round(*static, table, props, err)             # warm-up (compiles)
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        drafter.round(*static, table, props, err)
    for seed in (1, 2):
        fresh = _inputs(seed, dev, dt)
        cache.k.copy_(k0)
        cache.v.copy_(v0)
        for dst, src in zip(static, fresh):
            dst.copy_(src)
        graph.replay()
        got, got_k = props.clone(), cache.k.clone()
        cache.k.copy_(k0)
        cache.v.copy_(v0)
        want = torch.empty_like(props)
        drafter.round(*fresh, table, want, err)
        assert torch.equal(got, want) and torch.equal(got_k, cache.k)
    assert int(err) == 0
