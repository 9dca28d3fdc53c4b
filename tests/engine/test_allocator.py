"""engine/allocator.py: pages are never handed out twice, double frees are refused, all come back."""
from __future__ import annotations

import random

import pytest

from graphrt.engine import allocator
from graphrt.engine.allocator import PageAllocator


@pytest.fixture(params=["loop", "bulk"])
def path(request, monkeypatch):
    """Both implementations of each rule: per-page loops (a few pages) and numpy (every call
    counts as a bulk call)."""
    if request.param == "bulk":
        monkeypatch.setattr(allocator, "BULK_PAGES", 1)
    return request.param


def test_random_allocate_free_never_hands_a_page_out_twice():
    rng = random.Random(0)
    alloc = PageAllocator(40)
    held: list[list[int]] = []
    for _ in range(400):
        if held and rng.random() < 0.45:
            alloc.free(held.pop(rng.randrange(len(held))))
        else:
            n = rng.randint(0, 9)
            got = alloc.allocate(n)
            owned = sum(len(h) for h in held)
            if got is None:
                assert n > 40 - owned and alloc.num_free == 40 - owned   # refused: nothing taken
            else:
                held.append(got)
        flat = [p for h in held for p in h]
        assert len(flat) == len(set(flat)) and all(0 <= p < 40 for p in flat)
        assert alloc.num_free == 40 - len(flat)
    for h in held:
        alloc.free(h)
    assert alloc.num_free == 40


def test_double_free_and_bad_pages_are_refused_without_freeing(path):
    alloc = PageAllocator(4)
    a = alloc.allocate(2)
    alloc.free(a)
    with pytest.raises(ValueError, match="double free"):
        alloc.free(a)
    b = alloc.allocate(3)
    with pytest.raises(ValueError, match="double free"):
        alloc.free([b[0], b[0]])
    with pytest.raises(ValueError, match="outside the pool"):
        alloc.free([b[1], 4])
    assert alloc.num_free == 1                      # nothing was freed by the refused calls
    with pytest.raises(ValueError, match="pages"):
        alloc.allocate(5)
    with pytest.raises(ValueError, match="num_pages"):
        PageAllocator(0)


def test_shared_pages_return_only_when_the_last_owner_frees_them(path):
    alloc = PageAllocator(6, first=1)                  # ids 1..6; 0 is the null page
    prefix = alloc.allocate(3)
    alloc.share(prefix[:2])                          # a second request reuses two prefix pages
    alloc.share(prefix[:1])                          # and a third the first one
    assert [alloc.refcount(p) for p in prefix] == [3, 2, 1] and alloc.num_free == 3
    alloc.free(prefix)                               # the first owner leaves: only prefix[2] is free
    assert [alloc.refcount(p) for p in prefix] == [2, 1, 0] and alloc.num_free == 4
    fresh = alloc.allocate(4)                        # every free page, never a held one
    assert fresh is not None and not set(fresh) & set(prefix[:2]) and prefix[2] in fresh
    assert alloc.allocate(1) is None                 # held pages are not free pages
    alloc.free(prefix[:2])
    assert [alloc.refcount(p) for p in prefix[:2]] == [1, 0] and alloc.num_free == 1
    with pytest.raises(ValueError, match="double free"):
        alloc.free(prefix[:2])                       # prefix[1] has no owner left: nothing freed
    assert alloc.refcount(prefix[0]) == 1 and alloc.num_free == 1
    with pytest.raises(ValueError, match="cannot share a free page"):
        alloc.share([prefix[1]])
    with pytest.raises(ValueError, match="listed twice"):
        alloc.share([prefix[0], prefix[0]])
    with pytest.raises(ValueError, match="outside the pool"):
        alloc.share([0])                             # the null page is never held
    alloc.free(prefix[:1])
    alloc.free(fresh)
    assert alloc.num_free == 6 and all(alloc.refcount(p) == 0 for p in range(1, 7))


def test_random_share_and_free_keep_counts_exact(path):
    """Random allocate / share / free against a model of owners per page."""
    rng = random.Random(1)
    alloc = PageAllocator(24, first=1)
    owners: dict[int, int] = {}
    held: list[list[int]] = []                       # one list per owner
    for _ in range(600):
        r = rng.random()
        if held and r < 0.35:
            pages = held.pop(rng.randrange(len(held)))
            alloc.free(pages)
            for p in pages:
                owners[p] -= 1
        elif held and r < 0.6:
            src = rng.choice(held)
            pages = rng.sample(src, rng.randint(1, len(src))) if src else []
            alloc.share(pages)
            held.append(pages)
            for p in pages:
                owners[p] += 1
        else:
            got = alloc.allocate(rng.randint(0, 5))
            if got is not None:
                assert all(owners.get(p, 0) == 0 for p in got)      # never a held page
                held.append(got)
                owners.update({p: 1 for p in got})
        assert all(alloc.refcount(p) == owners.get(p, 0) for p in range(1, 25))
        assert alloc.num_free == sum(1 for p in range(1, 25) if owners.get(p, 0) == 0)
    for pages in held:
        alloc.free(pages)
    assert alloc.num_free == 24


def test_a_refused_call_names_the_first_bad_page_and_changes_nothing(path):
    """The checks run as C-level passes; a failure is named as the per-page rule names it."""
    alloc = PageAllocator(6, first=1)
    held = alloc.allocate(3)
    free = next(p for p in range(1, 7) if p not in held)
    for pages, what in (([held[0], 7], "pages\\[1\\]: 7 outside the pool \\[1, 7\\)"),
                        ([held[0], True], "pages\\[1\\]: True outside the pool"),
                        ([held[0], 2.0], "pages\\[1\\]: 2.0 outside the pool"),
                        ([held[0], 2**70], f"pages\\[1\\]: {2**70} outside the pool"),
                        ([free, 0], f"pages\\[0\\]: page {free} is not allocated"),
                        ([held[1], held[0], held[1]], f"pages\\[2\\]: page {held[1]} listed twice")):
        for call in (alloc.free, alloc.share):
            with pytest.raises(ValueError, match=what):
                call(pages)
    assert [alloc.refcount(p) for p in held] == [1, 1, 1] and alloc.num_free == 3


def test_int_subclass_pages_are_accepted(path):
    class Page(int):
        pass
    alloc = PageAllocator(4)
    pages = alloc.allocate(2)
    alloc.share([Page(p) for p in pages])
    assert alloc.refcounts(pages) == [2, 2]
    alloc.free([Page(p) for p in pages])
    alloc.free(pages)
    assert alloc.num_free == 4


def test_cached_pages_wait_in_lru_order_and_are_revived_by_share(path):
    alloc = PageAllocator(4)
    evicted = []
    alloc.on_evict = evicted.extend
    a = alloc.allocate(4)
    alloc.set_cached(a[:3])
    assert alloc.any_cached(a) and not alloc.any_cached(a[3:])
    alloc.free([a[1], a[0], a[2], a[3]])                 # LRU: a[1], a[0], a[2]; a[3] plain
    assert alloc.num_free == 4 and alloc.num_evictable == 3
    alloc.share([a[0]])                                   # a hit takes it back from the queue
    assert alloc.refcounts(a) == [1, 0, 0, 0] and alloc.num_evictable == 2
    with pytest.raises(ValueError, match="not allocated"):
        alloc.share([a[3]])                               # a plain free page is not revived
    got = alloc.allocate(3)                               # the plain page, then the LRU's oldest
    assert got == [a[3], a[1], a[2]] and evicted == [a[1], a[2]] and not alloc.any_cached(got)
    alloc.free(got + [a[0]])
    assert alloc.num_free == 4 and alloc.num_evictable == 1


class _Reference:
    """The allocator's rules, one Python step per page (an independent model): a free stack that
    pops low ids first, counts, and cached pages with count 0 in an LRU queue (eager removal)."""

    def __init__(self, n: int, first: int):
        self.stack, self.refs, self.cached, self.lru = list(range(first + n - 1, first - 1, -1)), {}, set(), {}
        self.evicted = []

    def allocate(self, n: int):
        if n > len(self.stack) + len(self.lru):
            return None
        out = [self.stack.pop() for _ in range(min(n, len(self.stack)))]
        while len(out) < n:
            p = next(iter(self.lru))
            del self.lru[p]
            self.cached.discard(p)
            self.evicted.append(p)
            out.append(p)
        for p in out:
            self.refs[p] = 1
        return out

    def share(self, pages):
        for p in pages:
            if self.refs.get(p, 0) == 0:
                del self.lru[p]
            self.refs[p] = self.refs.get(p, 0) + 1

    def free(self, pages):
        for p in pages:
            self.refs[p] -= 1
            if self.refs[p] == 0:
                if p in self.cached:
                    self.lru[p] = None
                else:
                    self.stack.append(p)


def test_random_calls_match_the_per_page_reference(path):
    """Allocations (their ids and order), evictions, counts and the LRU order of the numpy,
    lazy-queue allocator equal a per-page reference over random calls, cache hits included."""
    rng = random.Random(7)
    for first in (0, 1):
        alloc, ref = PageAllocator(30, first=first), _Reference(30, first)
        evicted = []
        alloc.on_evict = evicted.extend
        held: list[list[int]] = []
        revived = 0
        for _ in range(1500):
            r = rng.random()
            if held and r < 0.3:
                pages = held.pop(rng.randrange(len(held)))
                alloc.free(pages)
                ref.free(pages)
            elif r < 0.5:                              # a hit: held or cached-and-free pages
                pool = [p for p in ref.refs if ref.refs[p] > 0 or p in ref.lru]
                pages = rng.sample(pool, rng.randint(0, min(len(pool), 8)))
                revived += sum(p in ref.lru for p in pages)
                alloc.share(pages)
                ref.share(pages)
                held.append(pages)
            elif held and r < 0.6:
                pages = [p for p in rng.choice(held) if p not in ref.cached]
                alloc.set_cached(pages)
                ref.cached.update(pages)
            else:
                n = rng.randint(0, 6)
                got, want = alloc.allocate(n), ref.allocate(n)
                assert got == want
                if got is not None:
                    held.append(got)
            assert evicted == ref.evicted
            assert alloc.num_free == len(ref.stack) + len(ref.lru) and alloc.num_evictable == len(ref.lru)
            assert alloc.refcounts(list(range(first, first + 30))) == [ref.refs.get(p, 0) for p in range(first, first + 30)]
        assert len(evicted) > 20 and revived > 20          # the queue was exercised both ways
        for pages in held:
            alloc.free(pages)
        assert alloc.num_free == 30
