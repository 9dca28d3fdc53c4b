"""engine/stop_match.py against str.find (the reference), the stop-string bounds of SamplingParams,
and the detokenizer not looking at the stop list per token (its cost does not grow with it)."""
from __future__ import annotations

import random

import pytest

from graphrt import SamplingParams
from graphrt.engine.params import MAX_STOP_CHARS, MAX_STOP_STRINGS
from graphrt.engine.stop_match import StopMatcher


def test_matcher_gives_the_earliest_start_among_completed_stop_strings():
    rng = random.Random(0)
    for _ in range(4000):
        stops = tuple({"".join(rng.choice("abc") for _ in range(rng.randint(1, 5)))
                       for _ in range(rng.randint(1, 8))})
        text = "".join(rng.choice("abcd") for _ in range(rng.randint(0, 40)))
        m, state, pos, got = StopMatcher(stops), StopMatcher.START, 0, (-1, len(text))
        while pos < len(text):
            k = rng.randint(1, 6)
            state, cut = m.scan(state, text[pos:pos + k], pos)
            pos += k
            if cut >= 0:
                got = (cut, min(pos, len(text)))
                break
        end = got[1]                                   # text fed so far
        found = [i for i in (text[:end].find(s) for s in stops) if i >= 0]
        assert got[0] == (min(found) if found else -1), (stops, text, got)


def test_stop_bounds_name_the_field():
    SamplingParams(stop=["x"] * MAX_STOP_STRINGS)
    with pytest.raises(ValueError, match=rf"^stop: at most {MAX_STOP_STRINGS} stop strings, got 300000"):
        SamplingParams(stop=["s"] * 300000)
    with pytest.raises(ValueError, match=rf"^stop: at most {MAX_STOP_CHARS} characters"):
        SamplingParams(stop=["y" * (MAX_STOP_CHARS // 2 + 1)] * 2)
    with pytest.raises(ValueError, match="^stop: "):
        SamplingParams(stop=["ok", ""])


class _CountingStops(tuple):
    """A stop tuple that counts how often it is iterated."""
    iterations = 0

    def __iter__(self):
        type(self).iterations += 1
        return super().__iter__()


@pytest.mark.parametrize("bytes_path", [False, True])
def test_detokenizer_does_not_walk_the_stop_list_per_token(tmp_path_factory, bytes_path):
    pytest.importorskip("transformers")
    from _checkpoints import make_checkpoint_module
    from graphrt.engine.detokenizer import TextState
    from graphrt.engine.token_bytes import token_bytes
    tok = make_checkpoint_module().build_tokenizer(tmp_path_factory.mktemp("tok"), vocab_size=400, seed=3)
    table = token_bytes(tok, len(tok)) if bytes_path else None
    stops = _CountingStops(f"@@{i}#" for i in range(MAX_STOP_STRINGS - 1)) + _CountingStops(("graph",))
    stops = _CountingStops(stops)
    st = TextState(tok, stops, table=table)
    _CountingStops.iterations = 0
    ids = tok("the big graph token").input_ids
    n = next(i + 1 for i in range(len(ids)) if st.add_tokens(ids[i:i + 1]) is not None)
    assert st.stopped and st.text == "the big " and n <= len(ids)
    assert _CountingStops.iterations == 0        # matched by the automaton built once, at the start
