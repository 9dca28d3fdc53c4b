"""KV page allocator: a free list of page ids; never hands a page out twice, refuses double frees."""
from __future__ import annotations

from collections import deque


class PageAllocator:
    """Pages 0 .. num_pages-1 of the KV pool (the same ids in every layer's cache). Host only;
    owned by the engine loop (not thread-safe)."""

    def __init__(self, num_pages: int):
        if isinstance(num_pages, bool) or not isinstance(num_pages, int) or num_pages < 1:
            raise ValueError(f"num_pages: must be an int >= 1, got {num_pages!r}")
        self.num_pages = num_pages
        self._free = deque(range(num_pages))
        self._used = [False] * num_pages

    @property
    def num_free(self) -> int:
        return len(self._free)

    def can_allocate(self, n: int) -> bool:
        return n <= len(self._free)

    def allocate(self, n: int) -> list[int] | None:
        """n distinct free pages, or None (nothing taken) when fewer than n are free."""
        if isinstance(n, bool) or not isinstance(n, int) or not 0 <= n <= self.num_pages:
            raise ValueError(f"pages: must be an int in [0, num_pages={self.num_pages}], got {n!r}")
        if n > len(self._free):
            return None
        pages = [self._free.popleft() for _ in range(n)]
        for p in pages:
            self._used[p] = True
        return pages

    def free(self, pages: list[int]) -> None:
        """Return pages to the free list. ValueError (and nothing freed) for a page that is out of
        range, not allocated (a double free) or listed twice."""
        for i, p in enumerate(pages):
            if not 0 <= p < self.num_pages:
                raise ValueError(f"pages[{i}]: {p} outside the pool [0, {self.num_pages})")
            if not self._used[p] or p in pages[:i]:
                raise ValueError(f"pages[{i}]: page {p} is not allocated (double free)")
        for p in pages:
            self._used[p] = False
            self._free.append(p)


__all__ = ["PageAllocator"]
