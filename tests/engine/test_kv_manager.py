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
