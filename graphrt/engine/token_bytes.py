"""Token id -> bytes for byte-level BPE tokenizers, so text grows without a tokenizer call per token.

Byte-level BPE (GPT-2, Llama 3, Qwen2/2.5/3) spells every byte as one printable character
(GPT-2's `bytes_to_unicode` map), and `decode(ids)` is the concatenation of each token's bytes
read as UTF-8 with U+FFFD for invalid sequences (special tokens skipped). `token_bytes` builds
that table once per tokenizer and then checks it against the tokenizer's own decode on seeded
random sequences and every added token; anything unexpected (another decoder, a clean-up step,
a mismatch) gives None and the caller decodes through the tokenizer instead.
"""
from __future__ import annotations

import random
import re


def _byte_chars() -> dict[str, int]:
    """GPT-2's byte -> printable character map, inverted (character -> byte)."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    chars, extra = {}, 0
    for b in range(256):
        if b in keep:
            chars[chr(b)] = b
        else:
            chars[chr(256 + extra)] = b
            extra += 1
    return chars


def token_bytes(tokenizer, vocab_size: int, *, checks: int = 64) -> list[bytes] | None:
    """[vocab_size] bytes per id (b"" for special tokens and ids the tokenizer lacks), or None
    when the tokenizer is not plain byte-level BPE or the table disagrees with its decode."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None or getattr(tokenizer, "clean_up_tokenization_spaces", False):
        return None
    if type(getattr(backend, "decoder", None)).__name__ != "ByteLevel":
        return None
    inv = _byte_chars()
    # a token spelled in byte characters only -> its bytes, by C-level string calls (a 128k
    # vocabulary in ~0.1 s; a Python loop over its characters took over a second)
    to_latin1 = str.maketrans({c: chr(b) for c, b in inv.items()})
    other_char = re.compile("[^" + "".join(re.escape(c) for c in inv) + "]")
    table = [b""] * vocab_size
    try:
        added = backend.get_added_tokens_decoder()        # id -> AddedToken
        for tok, i in backend.get_vocab(with_added_tokens=True).items():
            if not 0 <= i < vocab_size or (i in added and added[i].special):
                continue
            table[i] = tok.encode() if other_char.search(tok) else tok.translate(to_latin1).encode("latin-1")
    except (AttributeError, KeyError, TypeError):
        return None
    rng = random.Random(0)
    n = min(vocab_size, backend.get_vocab_size(with_added_tokens=True))
    seqs = [[rng.randrange(n) for _ in range(16)] for _ in range(checks)] + [[i] for i in added if i < vocab_size]
    for ids in seqs:
        want = backend.decode(ids, skip_special_tokens=True)
        if b"".join(table[i] for i in ids).decode("utf-8", "replace") != want:
            return None
    return table


__all__ = ["token_bytes"]
