"""The KV cache manager: which pages hold which request's tokens, grown block by block.

    kv = KVCacheManager(pool_pages=1 + 4096, page_size=16, cache_seed="model|dtype")
    hit = kv.match(hashes)                   # cached pages of a prompt's longest cached prefix
    kv.share(hit)                            # the request now holds them (count + 1 each)
    pages = kv.allocate(n)                   # n fresh pages, or None (pool short)
    new = kv.grow(req.pages, tokens=300)     # pages appended to req.pages, or None (pool short)
    kv.check_writable(req.pages, first, end) # before a write of positions [first, end)
    kv.cache_full_pages(hashes, req.pages, start, end)   # pages[start:end] are full: cache them
    kv.release(req.pages)                    # one owner dropped per page
    pages, copy = kv.fork(parent.pages, tokens=len(prompt), total=12)   # n > 1: share the prompt

Page NULL_PAGE (0) is reserved: it never holds a request's tokens, so a CUDA-graph capture may
use it as scratch (the warm-up steps write K/V there) without saving and restoring anything.
Pages are refcounted (`PageAllocator`): a page may be shared by requests (a cached prefix) and
returns to the free list when its last owner releases it. With a prefix cache (cache_seed
given, prefix_cache.py) full pages stay findable by their tokens after their last owner left,
until the pool needs them; `num_free` counts them as free.

Policy lives in the scheduler (admission, preemption); this module only counts pages.
"""
from __future__ import annotations

from graphrt.engine.allocator import PageAllocator
from graphrt.engine.prefix_cache import PrefixCache

NULL_PAGE = 0  # never allocated; capture scratch


class KVCacheManager:
    """pool_pages: every page of the KV pool, the null page included (num_pages = pool_pages - 1
    are handed out); page_size: tokens per page; cache_seed: names the model (and anything else
    that changes a page's K/V) and turns the prefix cache on (None: off). Host only; owned by
    the engine loop."""

    def __init__(self, *, pool_pages: int, page_size: int, cache_seed: str | None = None):
        if isinstance(pool_pages, bool) or not isinstance(pool_pages, int) or pool_pages < 2:
            raise ValueError(f"pool_pages: must be an int >= 2 (the null page and one more), got {pool_pages!r}")
        if isinstance(page_size, bool) or not isinstance(page_size, int) or page_size < 1:
            raise ValueError(f"page_size: must be an int >= 1, got {page_size!r}")
        self.page_size = page_size
        self.allocator = PageAllocator(pool_pages - 1, first=NULL_PAGE + 1)
        self.cache = None if cache_seed is None else PrefixCache(self.allocator, page_size=page_size,
                                                                 seed=cache_seed)

    @property
    def num_pages(self) -> int:
        """Pages requests can hold (the pool less the null page)."""
        return self.allocator.num_pages

    @property
    def num_free(self) -> int:
        """Pages that can be allocated now (cached pages nobody holds included)."""
        return self.allocator.num_free

    def pages_for(self, tokens: int) -> int:
        """Pages that hold `tokens` tokens."""
        return -(-tokens // self.page_size)

    def missing(self, pages: list[int], tokens: int) -> int:
        """Pages to add to `pages` so they hold `tokens` tokens (0 if they already do)."""
        return max(0, -(-tokens // self.page_size) - len(pages))

    # ---- the prefix cache (no-ops without one) ------------------------------------------------
    def match(self, hashes: list[bytes]) -> list[int]:
        """Cached pages of the longest cached prefix named by `hashes` ([] without a cache);
        counts the lookup (prefix cache queries / hits)."""
        return [] if self.cache is None else self.cache.match(hashes)

    def free_after_sharing(self, pages: list[int]) -> int:
        """num_free once `pages` (a match) are shared: the ones nobody holds stop being free."""
        a = self.allocator
        return a.num_free - a.refcounts(pages).count(0)

    def share(self, pages: list[int]) -> None:
        """One more owner for each page (allocated, or cached and free)."""
        self.allocator.share(pages)

    def cache_full_pages(self, hashes: list[bytes], pages: list[int], start: int, end: int) -> None:
        """pages[start:end] are full and final (every token's K/V written): make them findable
        under hashes[start:end]."""
        if self.cache is not None and end > start:
            self.cache.insert(hashes, pages, start, end)

    def check_writable(self, pages: list[int], first: int, end: int, *, forks: dict[int, int] | None = None) -> None:
        """RuntimeError if a write of positions [first, end) would touch a page that another
        owner holds or that the prefix cache holds (its contents are shared: never rewritten).
        forks {page: n}: owners that took the page by `fork` before this, its first write (n > 1:
        the samples sharing this prefill), allowed besides the writer."""
        ps, a = self.page_size, self.allocator
        lo, hi = first // ps, -(-end // ps)
        cols = pages[lo:hi]
        if not forks and len(cols) == hi - lo and a.refcounts(cols).count(1) == len(cols) \
                and not a.any_cached(cols):
            return                                      # the common case: C-level passes only
        for j in range(lo, hi):
            p = pages[j]
            if a.refcount(p) != 1 + (forks.get(p, 0) if forks else 0) or a.is_cached(p):
                raise RuntimeError(f"kv: positions [{first}, {end}) would write page {p} (column {j}), "
                                   f"which is shared (owners {a.refcount(p)}, cached {a.is_cached(p)})")

    # ---- pages --------------------------------------------------------------------------------
    def allocate(self, n: int) -> list[int] | None:
        """n pages (count 1), evicting unheld cached pages if needed; None (nothing taken) when
        fewer than n are free."""
        return self.allocator.allocate(n)

    def grow(self, pages: list[int], tokens: int) -> list[int] | None:
        """Append pages to `pages` (in place) until they hold `tokens` tokens; returns the new
        pages ([] if none were needed), or None (nothing taken) when the pool is short."""
        need = self.missing(pages, tokens)
        if need == 0:
            return []
        new = self.allocator.allocate(need)
        if new is not None:
            pages.extend(new)
        return new

    def fork(self, pages: list[int], *, tokens: int, total: int) -> tuple[list[int], tuple[int, int] | None] | None:
        """Pages for a child of the sequence whose first `tokens` tokens are in `pages` (n > 1:
        samples of one prompt): the full pages among them are shared (one more owner each:
        their tokens are never written again), fresh pages make up `total`, and the first fresh
        one takes the parent's partial last page (copy-on-write: both will append to it).
        Returns (the child's `total` pages, (parent page, child page) to copy on the device, or
        None when `tokens` fills whole pages), or None (nothing taken) when the pool is short."""
        full, partial = divmod(tokens, self.page_size)
        if not 0 < tokens <= len(pages) * self.page_size or total < full + (partial > 0):
            raise ValueError(f"fork: {tokens} tokens in {len(pages)} pages of {self.page_size}, "
                             f"total {total} pages")
        new = self.allocator.allocate(total - full)
        if new is None:
            return None
        self.allocator.share(pages[:full])
        return pages[:full] + new, ((pages[full], new[0]) if partial else None)

    def release(self, pages: list[int]) -> None:
        """Drop this owner of every page in `pages` (the list is left as is). Freed from the last
        page to the first, so a prefix's tail is evicted before its head."""
        self.allocator.free(pages[::-1])


__all__ = ["KVCacheManager", "NULL_PAGE"]
