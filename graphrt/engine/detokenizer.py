"""A request's output text: incremental detokenization, stop strings, what may be streamed."""
from __future__ import annotations


class TextState:
    """Appends tokens, keeps the text, finds stop strings (which are cut from the text), and holds
    back the text that could still become the start of a stop string.

    Incremental decode: text is decoded from `prefix` (a few tokens before the new ones, so
    merges across the boundary come out right) and the part that is complete (no trailing
    U+FFFD of a split multi-byte character) is appended.
    """

    def __init__(self, tokenizer, stop: tuple[str, ...]):
        self.tokenizer = tokenizer
        self.stop = stop
        self.ids: list[int] = []
        self.text = ""
        self.sent = 0                 # characters of text already streamed
        self._prefix = self._read = 0
        self._hold = max((len(s) for s in stop), default=1) - 1
        self.stopped = False          # a stop string was found (and cut)

    def _decode(self, ids) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def add(self, token: int) -> bool:
        """Append one token's text; True when a stop string appeared (text is cut before it)."""
        self.ids.append(token)
        before = self._decode(self.ids[self._prefix:self._read])
        after = self._decode(self.ids[self._prefix:])
        if len(after) <= len(before) or after.endswith("\ufffd"):
            return False
        start = max(0, len(self.text) - self._hold)
        self.text += after[len(before):]
        self._prefix, self._read = self._read, len(self.ids)
        hits = [i for i in (self.text.find(s, start) for s in self.stop) if i >= 0]
        if hits:
            self.text = self.text[:min(hits)]
            self.stopped = True
            return True
        return False

    def flush(self) -> None:
        """At the end (not after a stop string): append text still held for a split character."""
        rest = self._decode(self.ids[self._prefix:])[len(self._decode(self.ids[self._prefix:self._read])):]
        self.text += rest
        self._prefix = self._read = len(self.ids)

    def delta(self, final: bool) -> str:
        """Text not streamed yet; while not final, the last len(longest stop) - 1 chars wait."""
        end = len(self.text) if final else max(self.sent, len(self.text) - self._hold)
        out = self.text[self.sent:end]
        self.sent = end
        return out


__all__ = ["TextState"]
