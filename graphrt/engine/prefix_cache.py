"""The prefix cache: full KV pages found by their contents, so a shared prefix is prefilled once.

    cache = PrefixCache(allocator, page_size=16, seed="llama|float32|...")
    cache.extend(hashes, tokens, n)          # the hash chain of tokens' first n full pages
    pages = cache.match(hashes)              # the cached pages of the longest cached prefix
    cache.insert(hashes, pages, start, end)  # pages[start:end] are full: cache them

A page's key is a hash chain: key_j = H(key_{j-1}, tokens of page j), key_{-1} = H(seed), so a
key names the page's tokens and every token before them (the K/V of a token depends on all of
them). The seed names what else changes the contents (the model, its dtype, the KV format), so
two engines' keys never meet. H is BLAKE2b-128.

A cached page is refcounted by its owners as any page (allocator.py); when the last owner frees
it, the allocator parks it in its LRU queue instead of the free stack, and `match` can hand it
out again. The allocator reuses it only when no plain free page is left (least recently freed
first) and tells the cache (`on_evict`), which forgets its key. A cached page holds full,
final contents: it is never written again (KVCacheManager.check_writable).
Host only; owned by the engine loop (through the KV manager).
"""
from __future__ import annotations

import hashlib
from array import array


from graphrt.engine.allocator import PageAllocator


def _h(data: bytes) -> bytes:
    return hashlib.blake2b(data, digest_size=16).digest()


class PrefixCache:
    """Keys -> pages of `allocator`; page_size: tokens per page; seed: names the model and
    everything else that changes a page's K/V. Counters (tokens): queries, hits."""

    def __init__(self, allocator: PageAllocator, *, page_size: int, seed: str):
        if not isinstance(seed, str):
            raise ValueError(f"seed: expected a string naming the model, got {seed!r}")
        self.allocator, self.page_size = allocator, page_size
        self.root = _h(b"graphrt-prefix|" + seed.encode())
        self._page: dict[bytes, int] = {}      # key -> page
        self._key: dict[int, bytes] = {}       # page -> key
        self.queries = 0                       # prompt tokens looked up
        self.hits = 0                          # of those, found cached
        allocator.on_evict = self._evicted

    @property
    def num_cached(self) -> int:
        """Pages holding a cached prefix (held by requests or not)."""
        return len(self._key)

    def key_of(self, page: int) -> bytes | None:
        return self._key.get(page)

    def extend(self, hashes: list[bytes], tokens, n: int) -> list[bytes]:
        """Extend `hashes` (in place: the keys of tokens' first len(hashes) pages) to the keys of
        the first n full pages of `tokens` (a list of ints with at least n * page_size)."""
        ps = self.page_size
        if n * ps > len(tokens):
            raise ValueError(f"n: {n} pages of {ps} tokens, only {len(tokens)} tokens given")
        prev = hashes[-1] if hashes else self.root
        for j in range(len(hashes), n):
            prev = _h(prev + array("q", tokens[j * ps:(j + 1) * ps]).tobytes())   # int64, native order
            hashes.append(prev)
        return hashes

    def match(self, hashes: list[bytes], *, count: bool = True) -> list[int]:
        """The pages of the longest prefix of `hashes` that is cached (the caller shares them
        before anything else allocates). count: add to the queries / hits counters."""
        out, pages = [], self._page
        for key in hashes:
            p = pages.get(key)
            if p is None:
                break
            out.append(p)
        if count:
            self.queries += len(hashes) * self.page_size
            self.hits += len(out) * self.page_size
        return out

    def insert(self, hashes: list[bytes], pages: list[int], start: int, end: int) -> None:
        """pages[start:end] hold the full pages named hashes[start:end] (held by the caller):
        cache each one, unless another page already holds the same key (then it stays a
        plain page, freed as usual)."""
        for j in range(start, end):
            key, p = hashes[j], pages[j]
            if key in self._page or p in self._key:
                continue
            self.allocator.set_cached(p)
            self._page[key], self._key[p] = p, key

    def _evicted(self, page: int) -> None:
        key = self._key.pop(page)
        del self._page[key]


__all__ = ["PrefixCache"]
