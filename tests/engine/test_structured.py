"""engine/structured.py + model/token_mask.py without the model: JSON schemas of varied features
(nested objects, arrays with bounds, enums, patterns, optional fields, anyOf, bounded numbers),
regexes and choices compiled by Grammars, then generated token by token from random logits
through the device mask path (GrammarState.fill -> TokenMask.write -> TokenMask.apply -> the
argmax); every completed output is checked by an independent validator (jsonschema, re,
membership). Bad constraints: ValueError naming the field, one line."""
from __future__ import annotations

import json
import random
import re

import pytest
import torch

from _checkpoints import make_checkpoint_module
from _schemas import random_object as _object
from graphrt.checkpoint.tokenizer import load_tokenizer
from graphrt.engine.params import SamplingParams, StructuredOutputsParams
from graphrt.engine.structured import Grammars
from graphrt.engine.token_bytes import token_bytes
from graphrt.kernels.token_mask import reference_mask
from graphrt.model.token_mask import TokenMask

jsonschema = pytest.importorskip("jsonschema")
VOCAB = 400                                     # the logits width: past the tokenizer's 384 ids
EOS = 1


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    out = tmp_path_factory.mktemp("tok")
    make_checkpoint_module().build_tokenizer(out, vocab_size=384, seed=0)
    tok = load_tokenizer(out)
    table = token_bytes(tok, VOCAB)
    assert table is not None
    return Grammars(tok, table, vocab=VOCAB, eos_ids=[EOS]), table


def _generate(grammars, table, so, seed: int, max_steps: int = 160, kernel: bool = True):
    """Tokens drawn from random logits through the mask path -> (text, completed). kernel=False:
    the mask applied by the kernel's torch rule (the Triton interpreter costs ~15 ms a step)."""
    state = grammars.state(grammars.compile(so), so.kind)
    mask = TokenMask.allocate(2, VOCAB, "cpu")
    g = torch.Generator().manual_seed(seed)
    toks = []
    for _ in range(max_steps):
        bits = torch.empty((1, mask.words), dtype=torch.int32)
        state.fill(bits, 0)
        mask.write([1], bits, torch.ones(1, dtype=torch.int32))
        logits = torch.randn(2, VOCAB, generator=g)
        logits[:, EOS] -= 2.0                   # the end only sometimes when allowed: longer outputs
        if kernel:
            mask.apply(logits, torch.tensor([1, 0]))
        else:
            logits = reference_mask(logits, mask.bits[:, 0], mask.active[:, 0], torch.tensor([1, 0]))   # position 0
        tok = int(torch.argmax(logits[0]))
        assert logits[0, tok] > float("-inf")
        state.advance([tok])
        if tok == EOS:
            # surrogatepass: xgrammar's string rule admits UTF-8-encoded surrogates (ED A0..BF ..), one
            # code point each (docs/structured-output.md); read that way the lengths agree with it
            return b"".join(table[t] for t in toks).decode("utf-8", "surrogatepass"), True
        toks.append(tok)
    return b"".join(table[t] for t in toks).decode("utf-8", "replace"), False


def test_200_json_schemas_validate(setup):
    grammars, table = setup
    rng = random.Random(0)
    done = refused = 0
    for i in range(220):
        schema = _object(rng)
        try:
            grammars.compile(StructuredOutputsParams(json=schema))
        except ValueError as e:                 # an unsupported feature: one line, naming the field
            assert str(e).startswith("structured_outputs.json: ") and "\n" not in str(e)
            refused += 1
            continue
        text, complete = _generate(grammars, table, StructuredOutputsParams(json=schema), seed=i, kernel=i < 3)
        if complete:
            jsonschema.validate(json.loads(text), schema)
            done += 1
    assert refused <= 10 and done >= 200, (done, refused)


@pytest.mark.parametrize("pattern", [r"\d{3}-[a-z]{2,4}", r"(yes|no)!?", r"[A-Z][a-z]{1,6} \d{1,4}", r"0x[0-9a-f]{1,8}"])
def test_regex_outputs_match(setup, pattern):
    grammars, table = setup
    for seed in range(6):
        text, complete = _generate(grammars, table, StructuredOutputsParams(regex=pattern), seed, kernel=seed == 0)
        assert complete and re.fullmatch(pattern, text), text


def test_choice_outputs(setup):
    grammars, table = setup
    choices = ["alpha", "beta", "gamma delta", "{\"x\": 1}", "é"]
    got = {_generate(grammars, table, StructuredOutputsParams(choice=choices), seed, kernel=False)[0]
           for seed in range(12)}
    assert got <= set(choices) and len(got) >= 2


def test_grammar_and_json_object(setup):
    grammars, table = setup
    for seed in range(5):
        text, complete = _generate(grammars, table, StructuredOutputsParams(grammar='root ::= "a" [0-9]+ "b"'), seed,
                                   kernel=False)
        assert complete and re.fullmatch(r"a[0-9]+b", text)
        text, complete = _generate(grammars, table, StructuredOutputsParams(json_object=True), seed, max_steps=400,
                                   kernel=False)
        if complete:
            assert isinstance(json.loads(text), dict)


def test_eos_only_when_complete(setup):
    grammars, _ = setup
    state = grammars.state(grammars.compile(StructuredOutputsParams(regex="ab")))
    bits = torch.empty((1, (VOCAB + 31) // 32), dtype=torch.int32)
    state.fill(bits, 0)
    assert not (int(bits[0, EOS // 32]) >> (EOS % 32)) & 1     # nothing drawn yet: no end
    state.matcher.accept_string("ab")
    state.fill(bits, 0)
    allowed = [t for t in range(VOCAB) if (int(bits[0, t // 32]) >> (t % 32)) & 1]
    assert allowed == [EOS]
    for t in range(384, VOCAB):                  # padding ids past the tokenizer: never allowed
        assert not (int(bits[0, t // 32]) >> (t % 32)) & 1


def test_masks_along_proposals(setup):
    """GrammarState.fill_along: the rows equal the masks filled token by token (before each
    accepted proposal, then after the last), the count stops at the first proposal the grammar
    refuses, and the matcher ends where it began; allows(t, j) reads row j of the last call's
    masks (a grammar round's verified position j: FreeRun's agreement), nothing past them."""
    grammars, table = setup
    state = grammars.state(grammars.compile(StructuredOutputsParams(regex="(ab|cd)+x")))
    ids = {t.decode(): i for i, t in enumerate(table) if t in (b"a", b"b", b"c", b"d", b"x")}
    w = (VOCAB + 31) // 32
    a, b, c, x = ids["a"], ids["b"], ids["c"], ids["x"]
    for drafts, kept in (([a, b, c], 3), ([a, b, x, a], 3), ([a, c], 1), ([b], 0), ([], 0)):
        out = torch.full((len(drafts) + 1, w), 7, dtype=torch.int32)
        assert state.fill_along(drafts, out) == kept
        ref = grammars.state(grammars.compile(StructuredOutputsParams(regex="(ab|cd)+x")))
        want = torch.empty((1, w), dtype=torch.int32)
        for i in range(kept + 1):
            ref.fill(want, 0)
            assert torch.equal(out[i], want[0]), (drafts, i)
            assert [state.allows(t, i) for t in range(VOCAB)] == \
                [(int(want[0, t >> 5]) >> (t & 31)) & 1 == 1 for t in range(VOCAB)], (drafts, i)
            if i < kept:
                ref.advance([drafts[i]])
        assert (out[kept + 1:] == 7).all()                          # rows past the kept: untouched
        assert not any(state.allows(t, kept + 1) for t in range(VOCAB))   # no mask past them
        again = torch.empty((1, w), dtype=torch.int32)
        state.fill(again, 0)                                        # rolled back: the first mask again
        assert torch.equal(again[0], out[0]) and state.accepted == 0


def test_bad_constraints(setup):
    grammars, _ = setup
    for so, field in ((StructuredOutputsParams(json={"type": "object", "properties": {"a": {"type": "nope"}}}), "json"),
                      (StructuredOutputsParams(regex="(unclosed"), "regex"),
                      (StructuredOutputsParams(grammar="root ::= undefined_rule"), "grammar")):
        with pytest.raises(ValueError, match=rf"^structured_outputs\.{field}: ") as e:
            grammars.compile(so)
        assert "\n" not in str(e.value)
    with pytest.raises(ValueError, match="exactly one"):
        StructuredOutputsParams(regex="a", choice=["b"])
    with pytest.raises(ValueError, match="exactly one"):
        StructuredOutputsParams()
    with pytest.raises(ValueError, match=r"structured_outputs\.json: not valid JSON"):
        StructuredOutputsParams(json="{bad")
    with pytest.raises(ValueError, match=r"structured_outputs\.choice"):
        StructuredOutputsParams(choice=[])
    with pytest.raises(ValueError, match=r"structured_outputs\.regex: .* at most"):
        StructuredOutputsParams(regex="a" * 70000)
    with pytest.raises(ValueError, match="unknown field"):
        SamplingParams(structured_outputs={"jsn": {}})
    with pytest.raises(ValueError, match="ignore_eos"):
        SamplingParams(structured_outputs={"regex": "a"}, ignore_eos=True)
    with pytest.raises(ValueError, match="min_tokens"):
        SamplingParams(structured_outputs={"regex": "a"}, min_tokens=1)


def test_compile_timeout_fails_alone(setup):
    grammars, table = setup
    slow = Grammars.__new__(Grammars)
    slow.__dict__.update(grammars.__dict__)
    slow.timeout_s = 0.0                        # nothing compiles in 0 s: that request fails alone
    slow._cache = type(grammars._cache)()
    with pytest.raises(ValueError, match=r"structured_outputs\.regex: the grammar did not compile within 0 s"):
        slow.compile(StructuredOutputsParams(regex="[a-z]{1,40}@[a-z]{1,40}\\.(com|org|net)"))
    text, complete = _generate(grammars, table, StructuredOutputsParams(regex="q[0-9]"), 0, kernel=False)   # others go on
    assert complete and re.fullmatch("q[0-9]", text)



def test_a_compile_that_never_started_is_cancelled_when_late(setup):
    """A grammar queued behind slow ones past its time is cancelled, not compiled later for nobody
    (a client sending many slow grammars built an unbounded backlog); the deadline counts from
    the submission, so a caller that already waited (the server's event loop) waits no more."""
    import threading
    import time
    from concurrent.futures import ThreadPoolExecutor
    grammars, _ = setup
    one = Grammars.__new__(Grammars)
    one.__dict__.update(grammars.__dict__)
    one._cache, one._pool, one.timeout_s = type(grammars._cache)(), ThreadPoolExecutor(1), 0.3
    release, ran = threading.Event(), []

    def compile_(so):
        ran.append(so.regex)
        release.wait(30)
        return grammars._compile(so)
    one._compile = compile_
    first, queued = StructuredOutputsParams(regex="a+"), StructuredOutputsParams(regex="b+")
    running = one.submit(first)
    waiting = one.submit(queued)
    time.sleep(0.4)                             # both past their deadline: compile waits no more
    t0 = time.monotonic()
    for so in (first, queued):
        with pytest.raises(ValueError, match=r"^structured_outputs\.regex: the grammar did not compile within 0\.3 s"):
            one.compile(so)
    assert time.monotonic() - t0 < 0.2
    assert waiting.cancelled() and not running.cancelled()
    release.set()
    assert running.result(10) is not None and ran == ["a+"]
    assert one.submit(first) is running and one.submit(queued) is not waiting   # the late one starts afresh
    one._pool.shutdown()

def test_runtime_without_processing_refuses():
    from types import SimpleNamespace
    from graphrt.engine.sampling_extras import check_request
    with pytest.raises(ValueError, match="^structured_outputs: needs logits processing"):
        caps = SimpleNamespace(processing=False, speculative=None)   # Capabilities' fields read
        check_request(caps, SamplingParams(structured_outputs={"regex": "a"}), None, (1,), VOCAB)
