"""engine/detokenizer.py against the per-token rule (two full decodes per token, written here
independently): the same text, the same stop-string cut, O(1) decode calls per block."""
from __future__ import annotations

import random

import pytest

from _checkpoints import make_checkpoint_module
from graphrt.engine.detokenizer import TextState
from graphrt.engine.token_bytes import token_bytes

pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def tok(tmp_path_factory):
    return make_checkpoint_module().build_tokenizer(tmp_path_factory.mktemp("tok"), vocab_size=400, seed=3)


def reference(tok, ids, stop):
    """Per token: text = decode(ids[:i + 1]) (complete characters only); the first token whose
    text contains a stop string ends it. Returns (tokens consumed or None, text)."""
    text = ""
    for i in range(len(ids)):
        full = tok.decode(ids[:i + 1], skip_special_tokens=True)
        if full.endswith("\ufffd"):
            continue
        text = full
        hits = [j for j in (text.find(s) for s in stop) if j >= 0]
        if hits:
            return i + 1, text[:min(hits)]
    return None, tok.decode(ids, skip_special_tokens=True)


@pytest.mark.parametrize("bytes_path", [False, True])
def test_blocks_give_the_per_token_text_and_stop_cut(tok, bytes_path):
    table = token_bytes(tok, len(tok) + 5) if bytes_path else None   # model vocab > tokenizer's
    assert (table is not None) == bytes_path
    rng = random.Random(0)
    chars = list("abcdefgh ijk.,!\n") + ["é", "ß", "中", "文", "🙂", "→"]   # 1- to 4-byte characters
    for trial in range(60):
        ids = tok("".join(rng.choice(chars) for _ in range(rng.randint(1, 60)))).input_ids
        full = tok.decode(ids, skip_special_tokens=True)
        stop = ()
        if trial % 2 and len(full) > 4:
            a = rng.randrange(len(full) - 2)
            stop = (full[a:a + rng.randint(1, 3)], "@@none")
        want_n, want_text = reference(tok, ids, stop)
        st = TextState(tok, stop, table=table)
        got_n, pos = None, 0
        while pos < len(ids) and got_n is None:
            k = rng.randint(1, 9)
            n = st.add_tokens(ids[pos:pos + k])
            got_n = None if n is None else pos + n
            pos += k
        if got_n is None:
            st.flush()
        assert (got_n, st.text) == (want_n, want_text), (trial, ids, stop)
        assert st.stopped == (want_n is not None)


def test_one_decode_call_per_block_without_stop_hits(tok):
    calls = []
    st = TextState(tok, ("@@never",), decode=lambda ids: calls.append(len(ids)) or tok.decode(ids))
    rng = random.Random(1)
    ids = tok(" ".join(rng.choice(["graph", "token", "a", "decode", "kv."]) for _ in range(600))).input_ids
    assert len(ids) >= 800
    for b in range(100):                             # 100 blocks of K = 8
        assert st.add_tokens(ids[8 * b:8 * b + 8]) is None
    assert len(calls) <= 100 * (1 + 8 / (32 - 4 - 8)) + 1   # one per block, one per window move
    assert len(calls) / 800 < 0.2                     # calls per token (the per-token rule: 2)
    assert max(calls) <= 32 + 8                     # the window stays short


def test_delta_holds_back_a_possible_stop_prefix(tok):
    st = TextState(tok, ("xyz",))
    ids = tok("abc xy").input_ids
    assert st.add_tokens(ids) is None
    assert st.delta(False) == st.text[:-2] and st.delta(True) == st.text[-2:]


def test_byte_table_matches_decode_and_refuses_other_decoders(tok):
    table = token_bytes(tok, len(tok))
    rng = random.Random(5)
    for _ in range(50):                             # random ids, invalid UTF-8 included
        ids = [rng.randrange(len(tok)) for _ in range(rng.randint(1, 30))]
        assert b"".join(table[i] for i in ids).decode("utf-8", "replace") == tok.decode(ids, skip_special_tokens=True)
    assert table[tok.eos_token_id] == b""           # special tokens are skipped

    class Plain:                                    # no byte-level backend: the decode path
        def decode(self, ids, skip_special_tokens=True):
            return "".join(chr(97 + i % 26) for i in ids)
    assert token_bytes(Plain(), 10) is None
    st = TextState(Plain(), ("cd",))
    assert st.add_tokens([0, 1, 2, 3, 4]) == 4 and st.text == "ab"
