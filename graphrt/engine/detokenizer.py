"""A request's output text: incremental detokenization, stop strings, what may be streamed.

With a byte table (token_bytes.py: byte-level BPE tokenizers) no tokenizer call at all: each
token's bytes go through an incremental UTF-8 decoder, and text waits while a character is
split across tokens (as the window rule below does). Otherwise one tokenizer call per block of
tokens (not two per token): the text is decoded over a window
ids[prefix:] that starts a few tokens back (so merges across the boundary come out right);
the text of ids[prefix:read] is kept from the previous call, so the new text is the tail of
one decode. The window's start moves forward every WINDOW tokens (one more call then). A
window whose text ends in U+FFFD (a multi-byte character split across tokens) waits for the
next tokens. When a stop string shows up in a block, or the block ends inside a character (so
a token in it may have completed text the block did not show), the block is replayed token by
token from the state before it: the cut is the one the per-token rule gives.
"""
from __future__ import annotations

import codecs

from graphrt.engine.stop_match import StopMatcher

WINDOW = 32        # tokens in the decode window before its start moves up
KEEP = 4           # tokens kept before the read offset when it does


def make_decoder(tokenizer):
    """ids -> text as tokenizer.decode(ids, skip_special_tokens=True) gives it: the Rust backend
    directly for fast tokenizers without post-decode clean-up (5x less per call), else decode."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None and not getattr(tokenizer, "clean_up_tokenization_spaces", False):
        return lambda ids: backend.decode(ids, skip_special_tokens=True)
    return lambda ids: tokenizer.decode(ids, skip_special_tokens=True)


class TextState:
    """Appends tokens, keeps the text, finds stop strings (which are cut from the text), and holds
    back the text that could still become the start of a stop string."""

    def __init__(self, tokenizer, stop: tuple[str, ...], *, decode=None, table: list[bytes] | None = None):
        self._decode = decode or make_decoder(tokenizer)
        self._table = table           # token id -> bytes (token_bytes.py), or None
        self._utf8 = codecs.getincrementaldecoder("utf-8")("replace") if table is not None else None
        self._held = ""               # byte path: complete text waiting for a split character
        self.stop = stop
        self.ids: list[int] = []
        self.text = ""
        self.sent = 0                 # characters of text already streamed
        self._prefix = self._read = 0
        self._prefix_text = ""        # decode(ids[_prefix:_read])
        self._hold = max((len(s) for s in stop), default=1) - 1
        self._match = StopMatcher(stop) if stop else None   # built here, on the caller's thread
        self._match_state = StopMatcher.START
        self.stopped = False          # a stop string was found (and cut)
        self.stop_string: str | None = None   # the one found (CompletionOutput.stop_reason)
        self._stop_set = frozenset(stop)

    def _add_bytes(self, tokens: list[int]) -> None:
        """Byte path: the text of `tokens`, released when no character is left split."""
        table = self._table
        self._held += self._utf8.decode(b"".join(map(table.__getitem__, tokens)))
        if not self._utf8.getstate()[0] and self._held:
            self.text += self._held
            self._held = ""

    def _step(self) -> None:
        """Append the complete text of ids[_read:] (one decode call)."""
        if len(self.ids) - self._prefix > WINDOW and self._read - KEEP > self._prefix:
            self._prefix = self._read - KEEP
            self._prefix_text = self._decode(self.ids[self._prefix:self._read])
        full = self._decode(self.ids[self._prefix:])
        if len(full) <= len(self._prefix_text) or full.endswith("\ufffd"):
            return
        self.text += full[len(self._prefix_text):]
        self._read, self._prefix_text = len(self.ids), full

    def _scan(self, since: int) -> int:
        """Feed text[since:] to the stop matcher -> the cut (start of the earliest stop string
        completed in it) or -1."""
        self._match_state, cut = self._match.scan(self._match_state, self.text[since:], since)
        return cut

    def _cut(self, cut: int) -> None:
        """A stop string starts at text[cut]: remember it (the shortest there: it completed
        first; found by slicing, not by walking the stop list) and cut the text before it."""
        text, longest = self.text, self._hold + 1
        self.stop_string = next((text[cut:end] for end in range(cut + 1, min(len(text), cut + longest) + 1)
                                 if text[cut:end] in self._stop_set), None)
        self.text, self.stopped = text[:cut], True

    def add_tokens(self, tokens: list[int]) -> int | None:
        """Append tokens' text. None if no stop string appeared; else the number of tokens up to
        and including the one whose text completed the first stop string (the text is cut
        before the stop string, later tokens are not added)."""
        if not tokens:
            return None
        if self._table is not None:
            if not self.stop:                         # the hot path: _add_bytes, inlined
                utf8 = self._utf8
                self._held += utf8.decode(b"".join(map(self._table.__getitem__, tokens)))
                if self._held and not utf8.getstate()[0]:
                    self.text += self._held
                    self._held = ""
                return None
            # the whole block at once: if it ends on a character boundary, its text is the per-token
            # walk's and one scan sees every stop string completed in it; a stop string found (or a
            # character left split) replays the block per token from the state before it (exact cut)
            saved = (self.text, self._held, self._utf8.getstate(), self._match_state)
            since = len(self.text)
            self._add_bytes(tokens)
            if not self._utf8.getstate()[0] and self._scan(since) < 0:
                return None
            self.text, self._held, state, self._match_state = saved
            self._utf8.setstate(state)
            for i in range(len(tokens)):              # per token: ~0.3 us each, exact cut
                since = len(self.text)
                self._add_bytes(tokens[i:i + 1])
                cut = self._scan(since)
                if cut >= 0:
                    self._cut(cut)
                    return i + 1
            return None
        if not self.stop:
            self.ids.extend(tokens)
            self._step()
            return None
        saved = (len(self.ids), self.text, self._prefix, self._read, self._prefix_text, self._match_state)
        self.ids.extend(tokens)
        self._step()
        if self._read == len(self.ids) and self._scan(len(saved[1])) < 0:
            return None               # no stop string, and no token's text left pending
        n_ids, self.text, self._prefix, self._read, self._prefix_text, self._match_state = saved
        del self.ids[n_ids:]          # replay per token from the state before the block
        for i, tok in enumerate(tokens):
            since = len(self.text)
            self.ids.append(tok)
            self._step()
            cut = self._scan(since)
            if cut >= 0:
                self._cut(cut)
                return i + 1
        return None                   # (only if a moved window changed the text: none found)

    def add(self, token: int) -> bool:
        """Append one token's text; True when a stop string appeared (text is cut before it)."""
        return self.add_tokens([token]) is not None

    def flush(self) -> None:
        """At the end (not after a stop string): append text still held for a split character."""
        if self._table is not None:
            self.text += self._held + self._utf8.decode(b"", final=True)
            self._held = ""
            return
        self.text += self._decode(self.ids[self._prefix:])[len(self._prefix_text):]
        self._prefix = self._read = len(self.ids)
        self._prefix_text = ""

    def delta(self, final: bool) -> str:
        """Text not streamed yet; while not final, the last len(longest stop) - 1 chars wait."""
        end = len(self.text) if final else max(self.sent, len(self.text) - self._hold)
        out = self.text[self.sent:end]
        self.sent = end
        return out


__all__ = ["TextState", "make_decoder"]
