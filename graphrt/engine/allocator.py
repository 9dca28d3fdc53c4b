"""KV page allocator: refcounted pages, O(1) per page to allocate, share and free.

A page is free when its count is 0. `allocate` hands out free pages with count 1; `share`
adds an owner to pages already held (a prefix another request reuses); `free` drops one owner
per page and returns pages whose count reaches 0. A page is never handed out while held.

Cached pages (prefix_cache.py): a page marked with `set_cached` keeps its contents when its
last owner frees it. It is then free (counted in `num_free`) but parked in an LRU queue rather
than the plain free stack: `share` may take it back (a cache hit), and `allocate` hands it out
only once no plain free page is left, least recently freed first, calling `on_evict(page)` so
the cache forgets it.
"""
from __future__ import annotations

from collections import OrderedDict
from itertools import compress
from operator import not_

_INT = {int}


class PageAllocator:
    """Pages first .. first + num_pages - 1 of the KV pool (the same ids in every layer's cache);
    ids below `first` (the null page) are never handed out. Host only; owned by the engine loop
    (not thread-safe; `num_free` may be read from any thread). on_evict: called with each
    cached page that `allocate` reuses (set by the prefix cache)."""

    def __init__(self, num_pages: int, *, first: int = 0):
        if isinstance(num_pages, bool) or not isinstance(num_pages, int) or num_pages < 1:
            raise ValueError(f"num_pages: must be an int >= 1, got {num_pages!r}")
        if isinstance(first, bool) or not isinstance(first, int) or first < 0:
            raise ValueError(f"first: must be an int >= 0, got {first!r}")
        self.num_pages, self.first = num_pages, first
        self._free = list(range(first + num_pages - 1, first - 1, -1))  # a stack: pops low ids first
        self._refs = [0] * (first + num_pages)                          # owners per page id
        self._cached = bytearray(first + num_pages)                     # 1: contents kept when freed
        self._evictable: OrderedDict[int, None] = OrderedDict()         # cached, count 0; LRU first
        self.on_evict = None

    @property
    def num_free(self) -> int:
        """Pages `allocate` can hand out: plain free pages plus cached pages nobody holds."""
        return len(self._free) + len(self._evictable)

    @property
    def num_evictable(self) -> int:
        """Free pages that still hold a cached prefix."""
        return len(self._evictable)

    def can_allocate(self, n: int) -> bool:
        return n <= self.num_free

    def refcount(self, page: int) -> int:
        return self._refs[page]

    def is_cached(self, page: int) -> bool:
        return bool(self._cached[page])

    def refcounts(self, pages: list[int]) -> list[int]:
        """Owners of each page (one C-level pass; pages: ids in the pool)."""
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
        for _ in range(n - k):                        # evict: the cache forgets these pages
            p, _ = self._evictable.popitem(last=False)
            self._cached[p] = 0
            if self.on_evict is not None:
                self.on_evict(p)
            pages.append(p)
        refs = self._refs
        for p in pages:
            refs[p] = 1
        return pages

    def set_cached(self, pages: list[int]) -> None:
        """Keep each page's contents after its last owner frees it (it holds a full cached page)."""
        self._check(pages, "cannot cache a free page")
        cached = self._cached
        for p in pages:
            cached[p] = 1

    def _check(self, pages: list[int], what: str, *, revive: bool = False) -> list[int]:
        """ValueError unless every page is an int in the pool, held (or, revive, cached and
        free) and listed once; returns their owner counts. C-level passes over the list (a
        prefix's hundreds of pages cost microseconds); the per-page loop only names a failure."""
        lo, hi = self.first, self.first + self.num_pages
        if not pages:
            return []
        if set(map(type, pages)) <= _INT and lo <= min(pages) and max(pages) < hi:
            held = list(map(self._refs.__getitem__, pages))
            free = 0 in held and list(compress(pages, map(not_, held)))
            if (not free or revive and all(map(self._evictable.__contains__, free))) \
                    and len(set(pages)) == len(pages):
                return held
        for i, p in enumerate(pages):
            if isinstance(p, bool) or not isinstance(p, int) or not lo <= p < hi:
                raise ValueError(f"pages[{i}]: {p!r} outside the pool [{lo}, {hi})")
            if self._refs[p] == 0 and not (revive and p in self._evictable):
                raise ValueError(f"pages[{i}]: page {p} is not allocated ({what})")
        if len(set(pages)) != len(pages):
            seen: set[int] = set()
            dup = next(i for i, p in enumerate(pages) if p in seen or seen.add(p))
            raise ValueError(f"pages[{dup}]: page {pages[dup]} listed twice ({what})")
        return list(map(self._refs.__getitem__, pages))    # ints of a subclass of int: fine

    def share(self, pages: list[int]) -> None:
        """One more owner for each of `pages` (each allocated, or a cached page nobody holds,
        which leaves the LRU queue). ValueError, nothing changed, else."""
        held = self._check(pages, "cannot share a free page", revive=True)
        refs, ev = self._refs, self._evictable
        if 0 in held:
            for p in compress(pages, map(not_, held)):
                del ev[p]
        for p, n in zip(pages, held):
            refs[p] = n + 1

    def free(self, pages: list[int]) -> None:
        """Drop one owner of each page; pages with no owner left go back to the free list (a
        cached page to the LRU queue's newest end, in the order given). ValueError (and nothing
        freed) for a page that is out of range, not allocated (a double free) or listed twice."""
        held = self._check(pages, "double free")
        refs, free, cached, ev = self._refs, self._free, self._cached, self._evictable
        for p, n in zip(pages, held):
            refs[p] = n - 1
            if n == 1:
                if cached[p]:
                    ev[p] = None
                else:
                    free.append(p)


__all__ = ["PageAllocator"]
