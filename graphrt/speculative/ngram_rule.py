"""The n-gram lookup rule on the host (speculative/ngram.py states it; its kernels run it on the device).

    ngram_propose_reference(tokens, k, min_n, max_n)   # the rule as stated: the tests' truth
    idx = NgramIndex(min_n, max_n); idx.extend(tokens); idx.propose(k)   # incremental: the engine's

Plain Python, no Triton: the engine imports NgramIndex to predict a slot's device proposal.
"""
from __future__ import annotations


def ngram_propose_reference(tokens: list[int], k: int, min_n: int, max_n: int) -> list[int]:
    """The proposal for one token list, by the rule as stated (longest n first, latest match)."""
    size = len(tokens)
    for n in range(max_n, min_n - 1, -1):
        if n > size:
            continue
        suffix = tokens[size - n:]
        for e in range(size - 2, n - 2, -1):           # occurrence t[e-n+1 .. e], e <= L - 2
            if tokens[e - n + 1: e + 1] == suffix:
                return tokens[e + 1: e + 1 + k]
    return []


class NgramIndex:
    """The same rule on the host, incremental, for one token list that only grows (a request's
    prompt + accepted tokens): `extend` indexes each n-gram (min_n <= n <= max_n) by its latest
    end, one token behind (an occurrence must end before the last token); `propose(k)` looks the
    suffixes up, longest first. O(max_n) per token and per proposal, where the reference scans
    the whole list. The engine predicts a slot's device proposal with it (the slot's token
    history is the same list) to check it against the request's grammar before the round."""

    def __init__(self, min_n: int, max_n: int):
        if not 1 <= min_n <= max_n:
            raise ValueError(f"min_n, max_n: need 1 <= min_n <= max_n, got {min_n}, {max_n}")
        self.min_n, self.max_n = min_n, max_n
        self.tokens: list[int] = []
        self._last: dict[tuple, int] = {}              # n-gram -> its latest end e (<= len - 2)

    def __len__(self) -> int:
        return len(self.tokens)

    def extend(self, new) -> None:
        t, last = self.tokens, self._last
        for tok in new:
            t.append(tok)
            e = len(t) - 2                             # n-grams ending at e: now before the last token
            for n in range(self.min_n, min(self.max_n, e + 1) + 1):
                last[tuple(t[e - n + 1:e + 1])] = e

    def propose(self, k: int) -> list[int]:
        """ngram_propose_reference(self.tokens, k, min_n, max_n)."""
        t, size = self.tokens, len(self.tokens)
        for n in range(min(self.max_n, size), self.min_n - 1, -1):
            e = self._last.get(tuple(t[size - n:]))
            if e is not None:
                return t[e + 1:e + 1 + k]
        return []


__all__ = ["ngram_propose_reference", "NgramIndex"]
