"""KV page allocator: refcounted pages, O(1) per page to allocate, share and free.

A page is free when its count is 0. `allocate` hands out free pages with count 1; `share`
adds an owner to pages already held (a prefix another request reuses); `free` drops one owner
per page and returns pages whose count reaches 0. A page is never handed out while held.

Cached pages (prefix_cache.py): a page marked with `set_cached` keeps its contents when its
last owner frees it. It is then free (counted in `num_free`) but parked in an LRU queue rather
than the plain free stack: `share` may take it back (a cache hit), and `allocate` hands it out
only once no plain free page is left, least recently freed first, calling `on_evict(pages)` so
the cache forgets them. The queue is lazy: `share` leaves a revived page's entry in place (it
only counts it out), `allocate` drops entries of pages held again as it meets them, and `free`
moves a page's entry to the newest end: a cache hit costs no per-page queue work.

Cost: the counts and cached flags are flat arrays over the pool with a numpy view of each, so a
call over many pages (a 4k-token prefix is 256 of them; BULK_PAGES or more) is a few numpy
passes, and a call over a few pages (a decode block's growth) a short Python loop, which is
cheaper there than numpy's per-call cost. The same rules either way; on a refused bulk call the
per-page loop names what was wrong.
"""
from __future__ import annotations

from array import array
from collections import OrderedDict, deque
from operator import countOf

import numpy as np

BULK_PAGES = 32                            # calls over this many pages or more run in numpy
_consume = deque(maxlen=0).extend          # runs an iterator to its end in C (itertools' recipe)


class PageAllocator:
    """Pages first .. first + num_pages - 1 of the KV pool (the same ids in every layer's cache);
    ids below `first` (the null page) are never handed out. Host only; owned by the engine loop
    (not thread-safe; `num_free` may be read from any thread). on_evict: called with the list of
    cached pages that an `allocate` reuses (set by the prefix cache)."""

    def __init__(self, num_pages: int, *, first: int = 0):
        if isinstance(num_pages, bool) or not isinstance(num_pages, int) or num_pages < 1:
            raise ValueError(f"num_pages: must be an int >= 1, got {num_pages!r}")
        if isinstance(first, bool) or not isinstance(first, int) or first < 0:
            raise ValueError(f"first: must be an int >= 0, got {first!r}")
        self.num_pages, self.first = num_pages, first
        self._free = list(range(first + num_pages - 1, first - 1, -1))  # a stack: pops low ids first
        size = first + num_pages
        self._refs = array("i", bytes(4 * size))                        # [pool] owners per page id
        self._cached = bytearray(size)                                  # [pool] 1: contents kept when freed
        self._refs_np = np.frombuffer(self._refs, dtype=np.int32)       # numpy views of the same memory
        self._cached_np = np.frombuffer(self._cached, dtype=bool)       # (both are never resized)
        # cached pages with count 0, least recently freed first (+ stale entries of pages held again)
        self._lru: OrderedDict[int, None] = OrderedDict()
        self._evictable = 0                                              # cached pages with count 0
        self.on_evict = None

    @property
    def num_free(self) -> int:
        """Pages `allocate` can hand out: plain free pages plus cached pages nobody holds."""
        return len(self._free) + self._evictable

    @property
    def num_evictable(self) -> int:
        """Free pages that still hold a cached prefix."""
        return self._evictable

    def can_allocate(self, n: int) -> bool:
        return n <= self.num_free

    def refcount(self, page: int) -> int:
        return self._refs[page]

    def is_cached(self, page: int) -> bool:
        return bool(self._cached[page])

    def refcounts(self, pages: list[int]) -> list[int]:
        """Owners of each page (pages: ids in the pool; one C-level pass)."""
        return list(map(self._refs.__getitem__, pages))

    def any_cached(self, pages: list[int]) -> bool:
        """Whether some page holds a cached prefix (one C-level pass)."""
        return any(map(self._cached.__getitem__, pages))

    def allocate(self, n: int) -> list[int] | None:
        """n distinct free pages (count 1 each), or None (nothing taken) when fewer are free.
        Plain free pages first; then cached ones, least recently freed first (evicted)."""
        if isinstance(n, bool) or not isinstance(n, int) or not 0 <= n <= self.num_pages:
            raise ValueError(f"pages: must be an int in [0, num_pages={self.num_pages}], got {n!r}")
        if n > self.num_free:
            return None
        free = self._free
        k = min(n, len(free))
        pages = free[len(free) - k:][::-1]
        del free[len(free) - k:]
        if n > k:                                     # evict: the cache forgets these pages
            pop, refs, evicted = self._lru.popitem, self._refs, []
            while len(evicted) < n - k:
                p = pop(last=False)[0]
                if not refs[p]:                       # else a stale entry: held again
                    evicted.append(p)
            self._set(self._cached, self._cached_np, evicted, 0)
            self._evictable -= len(evicted)
            if self.on_evict is not None:
                self.on_evict(evicted)
            pages += evicted
        self._set(self._refs, self._refs_np, pages, 1)
        return pages

    @staticmethod
    def _set(flat, view, pages: list[int], value: int) -> None:
        """flat[p] = value for each page (through the numpy view for BULK_PAGES or more)."""
        if len(pages) >= BULK_PAGES:
            view[pages] = value
        else:
            for p in pages:
                flat[p] = value

    def set_cached(self, pages: list[int]) -> None:
        """Keep each page's contents after its last owner frees it (it holds a full cached page)."""
        self._check(pages, "cannot cache a free page")
        self._set(self._cached, self._cached_np, pages, 1)

    def _check(self, pages: list[int], what: str, *, revive: bool = False) -> np.ndarray | None:
        """ValueError unless every page is an int in the pool, held (or, revive, cached and
        free: in the LRU queue) and listed once. Returns the pages as an int64 array [n] for a
        bulk call (numpy checks; the per-page loop only to name a failure), else None."""
        lo, hi = self.first, self.first + self.num_pages
        if len(pages) >= BULK_PAGES and countOf(map(type, pages), int) == len(pages):
            try:
                idx = np.array(pages, dtype=np.int64)
            except OverflowError:                     # beyond int64: outside the pool
                idx = None
            if idx is not None and lo <= idx.min() and idx.max() < hi:
                held = self._refs_np[idx]
                if (held.all() or revive and self._cached_np[idx[held == 0]].all()) and len(set(pages)) == len(pages):
                    return idx
        for i, p in enumerate(pages):
            if isinstance(p, bool) or not isinstance(p, int) or not lo <= p < hi:
                raise ValueError(f"pages[{i}]: {p!r} outside the pool [{lo}, {hi})")
            if self._refs[p] == 0 and not (revive and self._cached[p]):
                raise ValueError(f"pages[{i}]: page {p} is not allocated ({what})")
        if len(set(pages)) != len(pages):
            seen: set[int] = set()
            dup = next(i for i, p in enumerate(pages) if p in seen or seen.add(p))
            raise ValueError(f"pages[{dup}]: page {pages[dup]} listed twice ({what})")
        return np.array(pages, dtype=np.int64) if len(pages) >= BULK_PAGES else None

    def share(self, pages: list[int]) -> None:
        """One more owner for each of `pages` (each allocated, or a cached page nobody holds,
        which leaves the LRU queue: its entry goes stale). ValueError, nothing changed, else."""
        idx = self._check(pages, "cannot share a free page", revive=True)
        if idx is None:
            refs = self._refs
            for p in pages:
                if not refs[p]:
                    self._evictable -= 1
                refs[p] += 1
            return
        refs = self._refs_np
        held = refs[idx]
        self._evictable -= int(np.count_nonzero(held == 0))
        refs[idx] = held + 1                          # pages are distinct (checked)

    def free(self, pages: list[int]) -> None:
        """Drop one owner of each page; pages with no owner left go back to the free list (a
        cached page to the LRU queue's newest end, in the order given). ValueError (and nothing
        freed) for a page that is out of range, not allocated (a double free) or listed twice."""
        idx = self._check(pages, "double free")
        lru = self._lru
        if idx is None:
            refs, cached = self._refs, self._cached
            for p in pages:
                refs[p] -= 1
                if not refs[p]:
                    if cached[p]:                     # to the LRU queue's newest end
                        lru[p] = None
                        lru.move_to_end(p)
                        self._evictable += 1
                    else:
                        self._free.append(p)
            return
        left = self._refs_np[idx] - 1
        self._refs_np[idx] = left
        done = idx[left == 0]
        kept = self._cached_np[done]
        self._free.extend(done[~kept].tolist())
        back = done[kept].tolist()
        if back:                                      # to the LRU queue's newest end, in order
            lru.update(dict.fromkeys(back))
            _consume(map(lru.move_to_end, back))
            self._evictable += len(back)

__all__ = ["PageAllocator"]
