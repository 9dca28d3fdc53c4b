"""engine/allocator.py + kv_manager.py: refcounted pages, the null page, growth, O(1) frees."""
from __future__ import annotations

import random
import time

import pytest

from graphrt.engine.allocator import PageAllocator
from graphrt.engine.kv_manager import NULL_PAGE, KVCacheManager


def test_shared_pages_return_only_when_the_last_owner_frees():
    alloc = PageAllocator(6)
    a = alloc.allocate(3)
    alloc.share(a[:2])                              # a prefix reused by a second request
    assert [alloc.refcount(p) for p in a] == [2, 2, 1]
    alloc.free(a)                                   # the first owner leaves
    assert alloc.num_free == 4 and [alloc.refcount(p) for p in a] == [1, 1, 0]
    assert a[2] in alloc.allocate(4)                # only the unshared page came back
    alloc.free(a[:2])
    assert alloc.num_free == 2
    with pytest.raises(ValueError, match="cannot share a free page"):
        alloc.share([a[0]])
    with pytest.raises(ValueError, match="listed twice"):
        alloc.share([a[2], a[2]])


def test_random_refcounts_match_a_reference_count():
    rng = random.Random(1)
    alloc = PageAllocator(30, first=1)
    owners: list[list[int]] = []
    for _ in range(500):
        r = rng.random()
        if owners and r < 0.4:
            alloc.free(owners.pop(rng.randrange(len(owners))))
        elif owners and r < 0.55:
            src = owners[rng.randrange(len(owners))]
            pre = src[:rng.randint(0, len(src))]
            alloc.share(pre)
            owners.append(list(pre))
        else:
            got = alloc.allocate(rng.randint(0, 6))
            if got is not None:
                assert all(1 <= p <= 30 for p in got)
                owners.append(got)
        count = {}
        for o in owners:
            for p in o:
                count[p] = count.get(p, 0) + 1
        assert all(alloc.refcount(p) == count.get(p, 0) for p in range(1, 31))
        assert alloc.num_free == 30 - len(count)


def test_free_of_a_large_request_is_linear():
    alloc = PageAllocator(65536)
    pages = alloc.allocate(65536)
    t0 = time.perf_counter()
    alloc.free(pages)
    assert time.perf_counter() - t0 < 0.5           # the old O(n^2) check took minutes here
    assert alloc.num_free == 65536


def test_manager_never_hands_out_the_null_page_and_grows_per_page():
    kv = KVCacheManager(pool_pages=5, page_size=4)
    assert kv.num_pages == 4 and kv.num_free == 4
    pages: list[int] = []
    assert kv.grow(pages, 1) == pages and len(pages) == 1
    assert kv.grow(pages, 4) == []                  # still fits one page
    new = kv.grow(pages, 9)                         # 9 tokens: 3 pages
    assert len(new) == 2 and pages[1:] == new
    assert kv.grow(pages, 21) is None and len(pages) == 3 and kv.num_free == 1   # short: nothing taken
    assert NULL_PAGE not in pages + kv.grow(pages, 16)
    kv.release(pages)
    assert kv.num_free == 4
    with pytest.raises(ValueError, match="outside the pool"):
        kv.release([NULL_PAGE])
    with pytest.raises(ValueError, match="pool_pages"):
        KVCacheManager(pool_pages=1, page_size=4)
    with pytest.raises(ValueError, match="page_size"):
        KVCacheManager(pool_pages=4, page_size=0)


def _spec_8b():
    from graphrt.model.spec import LlamaSpec
    return LlamaSpec(vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_layers=32,
                     num_heads=32, num_kv_heads=8, head_dim=128, rms_norm_eps=1e-5, rope_theta=5e5,
                     tie_word_embeddings=False, attention_bias=False)


def test_pool_from_gpu_memory_fits_the_utilization_and_caps_at_the_slots():
    from graphrt.engine.config import EngineConfig
    spec, gib = _spec_8b(), 2**30
    cfg = EngineConfig(max_batch=128, steps_per_graph=8, gpu_memory_utilization=0.9)
    total, free = 139.8 * gib, 139.8 * gib - 16.6 * gib          # an H200 after the 8B weights
    pages = cfg.pool_pages_from_memory(spec, max_model_len=8192, dtype_bytes=2, free_bytes=free, total_bytes=total)
    page_bytes = 2 * 32 * 16 * 8 * 128 * 2                          # K and V, 32 layers, bf16: 2 MiB
    used = (total - free) + (pages + 1) * page_bytes + cfg.reserve_bytes(spec, dtype_bytes=2)
    assert used <= 0.9 * total < used + page_bytes                  # fills the budget to one page
    assert pages < 128 * cfg.pages_per_seq(8192)                    # 128 x 8k would need ~138 GB
    small = EngineConfig(max_batch=2, steps_per_graph=8)
    assert small.pool_pages_from_memory(spec, max_model_len=8192, dtype_bytes=2, free_bytes=free,
                                        total_bytes=total) == 2 * small.pages_per_seq(8192)   # the cap
    with pytest.raises(ValueError, match="gpu_memory_utilization"):
        EngineConfig(gpu_memory_utilization=0.12).pool_pages_from_memory(
            spec, max_model_len=8192, dtype_bytes=2, free_bytes=free, total_bytes=total)
    for bad in (0, 1.5, True, "0.9"):
        with pytest.raises(ValueError, match="gpu_memory_utilization"):
            EngineConfig(gpu_memory_utilization=bad)


@pytest.mark.parametrize("bad", [0, -0.5, 1.5, float("nan"), "0.9", True])
def test_gpu_memory_utilization_out_of_range_names_the_field(bad):
    from graphrt.engine.config import EngineConfig
    with pytest.raises(ValueError, match="^gpu_memory_utilization: must be a number in \\(0, 1\\]"):
        EngineConfig(gpu_memory_utilization=bad)


def test_fork_shares_full_pages_copies_the_partial_one_and_refuses_a_short_pool():
    kv = KVCacheManager(pool_pages=1 + 8, page_size=4)
    parent = kv.allocator.allocate(3)                               # 10 tokens: 2 full pages + 2
    pages, copy = kv.fork(parent, tokens=10, total=4)
    assert pages[:2] == parent[:2] and copy == (parent[2], pages[2]) and len(set(pages) | set(parent)) == 5
    assert [kv.allocator.refcount(p) for p in parent] == [2, 2, 1]
    whole, none = kv.fork(parent, tokens=8, total=2)                # whole pages: nothing to copy
    assert whole == parent[:2] and none is None and kv.num_free == 3
    assert kv.fork(parent, tokens=10, total=6) is None and kv.num_free == 3   # short: nothing taken
    with pytest.raises(ValueError, match="^fork: 13 tokens in 3 pages of 4"):
        kv.fork(parent, tokens=13, total=4)
    for p in (parent, pages, whole):
        kv.release(p)
    assert kv.num_free == kv.num_pages
