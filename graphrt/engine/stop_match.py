"""Stop strings found in streamed text in time independent of how many there are.

A request's stop strings are compiled once (when the request is added, on the caller's thread)
into an Aho-Corasick automaton over characters: a trie of the strings, each node with a failure
link (the longest proper suffix of the node's string that is also a trie node) and the length of
the longest stop string that ends at it (its own, or its failure node's). The engine's thread then
feeds each new character once: cost O(1) amortized per character, whatever the number or length
of the strings (SamplingParams bounds both, MAX_STOP_STRINGS / MAX_STOP_CHARS).

    m = StopMatcher(("</s>", "\\n\\n"))
    state, cut = m.scan(m.START, "abc</s>x", base=0)    # cut = 3: where the earliest-starting
                                                        # stop string completed here begins
"""
from __future__ import annotations

from collections import deque


class StopMatcher:
    """Immutable after construction; one per request (its state is an int the caller keeps).

    stops: non-empty strings. `scan(state, text, base)` feeds `text` (the characters that follow
    position `base` of the whole output) from `state`; returns (new state, cut) where cut is the
    smallest start position (in the whole output) of a stop string that ends inside `text`, or
    -1. Every stop string that ends inside `text` is seen, so the cut is the one a search of the
    output for each string would give (the earliest start among those completed)."""

    START = 0

    def __init__(self, stops: tuple[str, ...]):
        goto: list[dict[str, int]] = [{}]
        longest: list[int] = [0]               # node -> length of the longest stop string ending here
        for s in stops:
            node = 0
            for ch in s:
                nxt = goto[node].get(ch)
                if nxt is None:
                    nxt = len(goto)
                    goto[node][ch] = nxt
                    goto.append({})
                    longest.append(0)
                node = nxt
            longest[node] = max(longest[node], len(s))
        fail = [0] * len(goto)
        order = deque(goto[0].values())        # breadth first: a node's failure link is shallower
        while order:
            node = order.popleft()
            longest[node] = max(longest[node], longest[fail[node]])
            for ch, child in goto[node].items():
                f = fail[node]
                while f and ch not in goto[f]:
                    f = fail[f]
                fail[child] = goto[f].get(ch, 0)
                order.append(child)
        self._goto, self._fail, self._longest = goto, fail, longest

    def scan(self, state: int, text: str, base: int) -> tuple[int, int]:
        goto, fail, longest = self._goto, self._fail, self._longest
        cut = -1
        for i, ch in enumerate(text, base + 1):   # i: end position (exclusive) after ch
            while state and ch not in goto[state]:
                state = fail[state]
            state = goto[state].get(ch, 0)
            n = longest[state]
            if n and (cut < 0 or i - n < cut):
                cut = i - n
        return state, cut


__all__ = ["StopMatcher"]
