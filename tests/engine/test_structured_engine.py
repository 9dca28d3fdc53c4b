"""Constrained decoding through the engine with the tiny random model on CPU: every constrained
output matches its constraint (choice, regex, JSON schema); unconstrained greedy and sampled
neighbours in the same (split one-step) blocks equal their outputs alone (K-step blocks); n > 1
and a cached prefix keep the constraint; a request whose constraint fails to compile fails alone
(ValueError naming the field)."""
from __future__ import annotations

import json
import re

import pytest

from _checkpoints import write
from graphrt import LLM, SamplingParams

jsonschema = pytest.importorskip("jsonschema")
CPU = dict(device="cpu", backend="reference", max_model_len=96)


@pytest.fixture(scope="module")
def llm(tmp_path_factory):
    path = write(tmp_path_factory, "so", arch="llama", dtype="float32", seed=11)
    return LLM(path, max_batch=8, steps_per_graph=3, **CPU)


def test_constrained_beside_free(llm):
    schema = {"type": "object", "properties": {"ok": {"type": "boolean"}, "n": {"type": "integer", "minimum": 0,
              "maximum": 99}}, "required": ["ok", "n"], "additionalProperties": False}
    free = SamplingParams(max_tokens=8, temperature=0)
    sampled = SamplingParams(max_tokens=10, temperature=0.9, seed=5)
    params = [SamplingParams(max_tokens=12, temperature=0, structured_outputs={"choice": ["yes", "no", "maybe"]}),
              SamplingParams(max_tokens=12, temperature=1.0, seed=4, structured_outputs={"regex": r"[a-c]{2}-\d"}),
              free,
              SamplingParams(max_tokens=24, temperature=0.7, seed=1, structured_outputs={"json": schema}),
              sampled]
    outs = llm.generate(["tell me"] * len(params), params, use_tqdm=False)
    assert outs[0].outputs[0].text in ("yes", "no", "maybe") and outs[0].outputs[0].finish_reason == "stop"
    assert re.fullmatch(r"[a-c]{2}-\d", outs[1].outputs[0].text) and outs[1].outputs[0].finish_reason == "stop"
    if outs[3].outputs[0].finish_reason == "stop":
        jsonschema.validate(json.loads(outs[3].outputs[0].text), schema)
    else:                                          # cut by max_tokens: a prefix of a valid object
        assert outs[3].outputs[0].text.startswith('{"ok": ')
    alone = llm.generate(["tell me"] * 2, [free, sampled], use_tqdm=False)   # K-step blocks, no masks
    assert outs[2].outputs[0].token_ids == alone[0].outputs[0].token_ids
    assert outs[4].outputs[0].token_ids == alone[1].outputs[0].token_ids


def test_n_samples_and_cached_prefix(llm):
    p = SamplingParams(max_tokens=10, temperature=1.0, seed=9, n=3, structured_outputs={"regex": r"(ab|cd){1,3}!"})
    prompt = "a shared prompt that fills more than one page of the cache, and then some"
    for _ in range(2):                             # the second run finds the prompt's pages cached
        out = llm.generate([prompt], [p], use_tqdm=False)[0]
        assert len(out.outputs) == 3
        for o in out.outputs:
            assert re.fullmatch(r"(ab|cd){1,3}!", o.text), o.text


def test_bad_grammar_fails_alone(llm):
    with pytest.raises(ValueError, match=r"^structured_outputs\.regex: "):
        llm.engine.add_request("x", SamplingParams(max_tokens=4, structured_outputs={"regex": "(["}))
    out = llm.generate(["x"], [SamplingParams(max_tokens=6, temperature=0, structured_outputs={"choice": ["a", "b"]})],
                       use_tqdm=False)[0]
    assert out.outputs[0].text in ("a", "b")


def test_with_ngram_speculation(llm, tmp_path_factory):
    """Under n-gram speculation a block with constrained rows runs one round: each constrained
    row's proposal is predicted on the host, cut at the first token its grammar refuses, and
    verified under its mask at every position, so greedy constrained output equals the output
    without speculation while repeated JSON keys are accepted as proposals; a free greedy
    neighbour keeps speculating and equals its output without speculation."""
    spec = LLM(llm.engine.tokenizer.name_or_path, max_batch=4, steps_per_graph=3,
               speculative={"method": "ngram", "num_tokens": 3}, **CPU)
    assert spec.engine.caps.spec_grammar
    rows = {"type": "array", "minItems": 3, "maxItems": 3, "items": {
        "type": "object", "properties": {"kind": {"enum": ["alpha", "beta"]}}, "required": ["kind"],
        "additionalProperties": False}}
    free = SamplingParams(max_tokens=8, temperature=0)
    con = [SamplingParams(max_tokens=10, temperature=0, structured_outputs={"regex": r"(to|be){2}"}),
           SamplingParams(max_tokens=60, temperature=0, structured_outputs={"json": rows})]
    prompts = ["to be or not to be", "to be or not", "a list:"]
    want = llm.generate(prompts, [free] + con, use_tqdm=False)                  # no speculation
    before = spec.engine.stats()["spec_accepted"]
    alone = spec.generate(prompts[2:], con[1:], use_tqdm=False)[0].outputs[0]    # one row: its own rounds
    assert spec.engine.stats()["spec_accepted"] > before                         # proposals accepted
    assert alone.finish_reason == "stop" and alone.token_ids == want[2].outputs[0].token_ids
    jsonschema.validate(json.loads(alone.text), rows)
    outs = spec.generate(prompts[:2], [free, con[0]], use_tqdm=False)            # beside a free row
    assert re.fullmatch(r"(to|be){2}", outs[1].outputs[0].text)
    for got, ref in zip(outs, want):
        assert got.outputs[0].token_ids == ref.outputs[0].token_ids


def test_a_prefill_applies_the_mask_only_where_it_draws_a_constrained_row(llm, monkeypatch):
    """The executor keeps which slots' mask flags are on (write_token_mask): a prefill whose rows
    are all free launches no mask kernel; one with a constrained row does, and its first token
    obeys the constraint."""
    from graphrt.model.token_mask import TokenMask
    ex = llm.engine.runtime
    calls = []
    real = TokenMask.apply
    monkeypatch.setattr(TokenMask, "apply",
                        lambda self, logits, sel, **kw: (calls.append(sel), real(self, logits, sel, **kw))[1])
    prefill = ex._prefill_slots
    seen = []
    monkeypatch.setattr(ex, "_prefill_slots", lambda *a, **kw: (seen.append(len(calls)), prefill(*a, **kw))[1])
    free = SamplingParams(max_tokens=1, temperature=0)
    llm.generate(["tell me"] * 2, [free, free], use_tqdm=False)
    assert seen and len(calls) == 0            # (earlier requests' slots may keep their flags: not drawn here)
    choice = SamplingParams(max_tokens=12, temperature=0, structured_outputs={"choice": ["yes", "no"]})
    out = llm.generate(["tell me"] * 2, [free, choice], use_tqdm=False)
    assert len(calls) >= 1 and out[1].outputs[0].text in ("yes", "no")
    calls.clear()
    llm.generate(["tell me"], [free], use_tqdm=False)
    # the slot the choice held keeps its flag until a prefill there clears it; a free row drawn
    # anywhere launches no mask either way
    assert len(calls) == 0
