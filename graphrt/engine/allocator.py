"""KV page allocator: refcounted pages, O(1) per page to allocate, share and free.

A page is free when its count is 0. `allocate` hands out free pages with count 1; `share`
adds an owner to pages already held (a prefix another request reuses); `free` drops one owner
per page and returns pages whose count reaches 0. A page is never handed out while held.
"""
from __future__ import annotations


class PageAllocator:
    """Pages first .. first + num_pages - 1 of the KV pool (the same ids in every layer's cache);
    ids below `first` (the null page) are never handed out. Host only; owned by the engine loop
    (not thread-safe; `num_free` may be read from any thread)."""

    def __init__(self, num_pages: int, *, first: int = 0):
        if isinstance(num_pages, bool) or not isinstance(num_pages, int) or num_pages < 1:
            raise ValueError(f"num_pages: must be an int >= 1, got {num_pages!r}")
        if isinstance(first, bool) or not isinstance(first, int) or first < 0:
            raise ValueError(f"first: must be an int >= 0, got {first!r}")
        self.num_pages, self.first = num_pages, first
        self._free = list(range(first + num_pages - 1, first - 1, -1))  # a stack: pops low ids first
        self._refs = [0] * (first + num_pages)                          # owners per page id

    @property
    def num_free(self) -> int:
        return len(self._free)

    def can_allocate(self, n: int) -> bool:
        return n <= len(self._free)

    def refcount(self, page: int) -> int:
        return self._refs[page]

    def allocate(self, n: int) -> list[int] | None:
        """n distinct free pages (count 1 each), or None (nothing taken) when fewer are free."""
        if isinstance(n, bool) or not isinstance(n, int) or not 0 <= n <= self.num_pages:
            raise ValueError(f"pages: must be an int in [0, num_pages={self.num_pages}], got {n!r}")
        if n > len(self._free):
            return None
        free = self._free
        pages = free[len(free) - n:][::-1]
        del free[len(free) - n:]
        refs = self._refs
        for p in pages:
            refs[p] = 1
        return pages

    def _check(self, pages: list[int], what: str) -> None:
        lo, hi = self.first, self.first + self.num_pages
        for i, p in enumerate(pages):
            if isinstance(p, bool) or not isinstance(p, int) or not lo <= p < hi:
                raise ValueError(f"pages[{i}]: {p!r} outside the pool [{lo}, {hi})")
            if self._refs[p] == 0:
                raise ValueError(f"pages[{i}]: page {p} is not allocated ({what})")
        if len(set(pages)) != len(pages):
            seen: set[int] = set()
            dup = next(i for i, p in enumerate(pages) if p in seen or seen.add(p))
            raise ValueError(f"pages[{dup}]: page {pages[dup]} listed twice ({what})")

    def share(self, pages: list[int]) -> None:
        """One more owner for each of `pages` (all allocated). ValueError, nothing changed, else."""
        self._check(pages, "cannot share a free page")
        for p in pages:
            self._refs[p] += 1

    def free(self, pages: list[int]) -> None:
        """Drop one owner of each page; pages with no owner left go back to the free list.
        ValueError (and nothing freed) for a page that is out of range, not allocated (a double
        free) or listed twice."""
        self._check(pages, "double free")
        refs, free = self._refs, self._free
        for p in pages:
            refs[p] -= 1
            if refs[p] == 0:
                free.append(p)


__all__ = ["PageAllocator"]
