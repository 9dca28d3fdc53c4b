"""The prefix cache: full KV pages found by their contents, so a shared prefix is prefilled once.

    cache = PrefixCache(allocator, page_size=16, seed="llama|float32|...")
    cache.extend(hashes, tokens, n)          # the hash chain of tokens' first n full pages
    pages = cache.match(hashes)              # the cached pages of the longest cached prefix
    cache.insert(hashes, pages, start, end)  # pages[start:end] are full: cache them

A page's key is a hash chain: key_j = H(key_{j-1} + tokens of page j as int64 bytes), key_{-1} =
H(seed), so a key names the page's tokens and every token before them (the K/V of a token depends
on all of them). The seed names what else changes the contents (the model, its dtype, the KV
format), so two engines' keys never meet. H is BLAKE2b-128.

Cost: a key is one BLAKE2b call (~1 us of Python per page), so the cache remembers the input of
every cached page's key: `extend` looks each input up before hashing it, and a prompt whose
prefix is cached pays one dict lookup per cached page instead (an exact memo of H: the keys are
the same). The inputs `extend` hashed wait in a bounded map (`_recent`, key -> input, the
oldest dropped) until `insert` caches their pages. The tokens become bytes in one call (the engine keeps a long
prompt as an int64 array: no per-token Python); `match` is one C-level pass over the keys.

A cached page is refcounted by its owners as any page (allocator.py); when the last owner frees
it, the allocator parks it in its LRU queue instead of the free stack, and `match` can hand it
out again. The allocator reuses it only when no plain free page is left (least recently freed
first) and tells the cache (`on_evict`), which forgets its key and input. A cached page holds
full, final contents: it is never written again (KVCacheManager.check_writable).
Host only; owned by the engine loop (through the KV manager).
"""
from __future__ import annotations

import hashlib
from array import array

import numpy as np

from graphrt.engine.allocator import PageAllocator

_B2 = hashlib.blake2b


def _h(data: bytes) -> bytes:
    return _B2(data, digest_size=16).digest()


def int64_bytes(tokens, start: int, end: int) -> bytes:
    """tokens[start:end] as native-order int64 bytes (8 per token). tokens: an int64 numpy
    array (its bytes: no per-token work), or a list of ints or anything whose slices are."""
    part = tokens[start:end]
    if isinstance(part, np.ndarray):
        return part.astype(np.int64, copy=False).tobytes()
    return array("q", part).tobytes()                  # C-level; cheaper than numpy on a few pages


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
        self._memo: dict[bytes, bytes] = {}    # H's input (previous key + page bytes) -> key, cached pages
        self._input: dict[int, bytes] = {}     # cached page -> its key's input (in _memo)
        self._recent: dict[bytes, bytes] = {}  # key -> input, hashed by extend, not cached yet
        self._recent_cap = 2 * allocator.num_pages   # past it, the older half is dropped
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
        the first n full pages of `tokens` (ints with at least n * page_size: a list, an int64
        numpy array, or a sequence whose slices are lists)."""
        ps = self.page_size
        if n * ps > len(tokens):
            raise ValueError(f"n: {n} pages of {ps} tokens, only {len(tokens)} tokens given")
        k = len(hashes)
        if n <= k:
            return hashes
        buf, w = int64_bytes(tokens, k * ps, n * ps), 8 * ps
        prev, get, add = (hashes[-1] if hashes else self.root), self._memo.get, hashes.append
        recent = self._recent
        for a in range(0, len(buf), w):                # one lookup per page; H only on a miss
            inp = prev + buf[a:a + w]
            prev = get(inp)
            if prev is None:
                prev = _B2(inp, digest_size=16).digest()
                recent[prev] = inp
            add(prev)
        if len(recent) > self._recent_cap:           # amortized O(1) per key
            self._recent = dict(list(recent.items())[len(recent) // 2:])
        return hashes

    def match(self, hashes: list[bytes], *, count: bool = True) -> list[int]:
        """The pages of the longest prefix of `hashes` that is cached (the caller shares them
        before anything else allocates). count: add to the queries / hits counters."""
        out = list(map(self._page.get, hashes))
        if None in out:
            del out[out.index(None):]
        if count:
            self.queries += len(hashes) * self.page_size
            self.hits += len(out) * self.page_size
        return out

    def insert(self, hashes: list[bytes], pages: list[int], start: int, end: int) -> None:
        """pages[start:end] hold the full pages named hashes[start:end] (held by the caller):
        cache each one, unless another page already holds the same key (then it stays a
        plain page, freed as usual)."""
        page_of, key_of, recent, memo = self._page, self._key, self._recent, self._memo
        new = [j for j in range(start, end) if hashes[j] not in page_of and pages[j] not in key_of]
        if not new:
            return
        self.allocator.set_cached([pages[j] for j in new])
        for j in new:
            key, p = hashes[j], pages[j]
            page_of[key], key_of[p] = p, key
            inp = recent.pop(key, None)               # None: its input was dropped (or never hashed here)
            if inp is not None:
                memo[inp], self._input[p] = key, inp

    def _evicted(self, pages: list[int]) -> None:
        """The allocator reuses these cached pages: forget their keys and inputs."""
        page_of, key_of, inputs, memo = self._page, self._key, self._input, self._memo
        for p in pages:
            del page_of[key_of.pop(p)]
            inp = inputs.pop(p, None)
            if inp is not None:
                del memo[inp]


__all__ = ["PrefixCache", "int64_bytes"]
