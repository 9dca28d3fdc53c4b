"""EAGLE-3 speculation in the engine on CPU (float32): greedy output with a head is identical to
the engine without speculation (bs 1-4, stop ids, stop strings, EOS, max_tokens, aborts,
preemption), seeded sampling emits the tokens of plain sampled decoding, heads saved in both public
layouts load through LLM(speculative=...), bad heads and flags name the field.

Heads: `repeat` (tests/_eagle3_heads.py: built from the target's own norm and LM head, it
proposes the last token k times; the random target repeats tokens, so rounds accept several) and
random weights (greedy exactness holds for any head)."""
from __future__ import annotations

import json
import shutil
from types import SimpleNamespace

import pytest

from _checkpoints import write
from _eagle3_heads import repeat_head_counts, write_random_head
from graphrt import LLM, SamplingParams

pytest.importorskip("transformers")
CPU = dict(device="cpu", backend="reference", max_model_len=64)
K = 3


@pytest.fixture(scope="module")
def path(tmp_path_factory):
    return write(tmp_path_factory, "eagle-target", arch="llama", dtype="float32", seed=11)


@pytest.fixture(scope="module")
def heads(path, tmp_path_factory):
    d = tmp_path_factory.mktemp("eagle-heads")
    return SimpleNamespace(repeat=write_random_head(path, d / "repeat", repeat=True),
                           random=write_random_head(path, d / "random", seed=3))


def _eagle(path, head, **kw):
    return LLM(path, max_batch=4, steps_per_graph=3, spec_rounds=2,
               speculative={"method": "eagle3", "num_tokens": K, "model": str(head)}, **{**CPU, **kw})


@pytest.fixture(scope="module")
def plain(path):
    return LLM(path, max_batch=4, steps_per_graph=3, **CPU)


@pytest.fixture(scope="module")
def eagle(path, heads):
    return _eagle(path, heads.repeat)


PROMPTS = [[5, 9, 14, 5, 9, 14, 5, 9], [20, 21, 22, 23, 20, 21], [7, 7, 7, 7], [30, 31, 32]]
GREEDY = SamplingParams(max_tokens=10, temperature=0, ignore_eos=True)


@pytest.fixture(scope="module")
def full(plain):
    """Plain greedy decoding of PROMPTS, 10 tokens each (the reference most tests compare to)."""
    return plain.generate(PROMPTS, GREEDY, use_tqdm=False)


def _same(a, b):
    for x, y in zip(a, b):
        assert (x.token_ids, x.text, x.finish_reason) == (y.token_ids, y.text, y.finish_reason)


def test_greedy_equals_plain_with_stops_and_max_tokens(plain, eagle, full):
    params = [SamplingParams(max_tokens=10, temperature=0, ignore_eos=True, stop_token_ids=[full[0].token_ids[4]]),
              SamplingParams(max_tokens=10, temperature=0, ignore_eos=True, stop=[full[1].text[3:5] or "zz"]),
              SamplingParams(max_tokens=10, temperature=0, ignore_eos=True),
              SamplingParams(max_tokens=3, temperature=0, ignore_eos=True)]
    before = eagle.engine.stats()
    got = eagle.generate(PROMPTS, params, use_tqdm=False)
    _same(got[:2], plain.generate(PROMPTS[:2], params[:2], use_tqdm=False))
    _same(got[2:3], full[2:3])
    assert got[3].token_ids == full[3].token_ids[:3] and got[3].finish_reason == "length"   # max_tokens exact
    assert got[0].finish_reason == "stop" and len(got[0].token_ids) <= 5
    st = eagle.engine.stats()
    assert st["spec_accepted"] > before["spec_accepted"] and st["spec_plain_blocks"] == 0
    assert 1.0 < st["spec_tokens_per_round"] <= K + 1
    alloc = eagle.engine.scheduler.allocator
    assert alloc.num_free == alloc.num_pages


def test_a_repeated_prompt_reuses_its_cached_prefix_under_a_head(plain, eagle):
    """Prefix caching stays on under EAGLE-3: a prompt sent twice finds its full pages cached the
    second time (the head's prompt pass runs from the first uncached token), equal to plain.
    (tests/engine/test_speculative_prefix_cache.py: shared prefixes, chunks, eviction.)"""
    long = [(3 * j) % 50 + 5 for j in range(40)]
    want = plain.generate([long], GREEDY, use_tqdm=False)
    hits = eagle.engine.stats()["prefix_cache_hits"]
    got = [eagle.generate([long], GREEDY, use_tqdm=False)[0] for _ in range(2)]
    for g in got:
        _same([g], want)
    assert got[1].num_cached_tokens > 0 and eagle.engine.stats()["prefix_cache_hits"] > hits


def test_repeat_head_counts_are_the_engines(eagle, full):
    """The repeat head proposes exactly the last token (float32): with max_tokens the only stop
    (the device's own), the engine's acceptance counts are what repeat_head_counts derives from
    the output tokens (the GPU test's bound rests on it)."""
    before = eagle.engine.stats()
    got = eagle.generate(PROMPTS[1:3], SamplingParams(max_tokens=6, temperature=0, ignore_eos=True), use_tqdm=False)
    assert [g.token_ids for g in got] == [f.token_ids[:6] for f in full[1:3]]
    st = eagle.engine.stats()
    accepted, proposed, _ = repeat_head_counts([g.token_ids for g in got], K)
    assert accepted > 0
    assert (st["spec_accepted"] - before["spec_accepted"], st["spec_proposed"] - before["spec_proposed"]) == \
        (accepted, proposed)


@pytest.fixture(scope="module")
def graphed_eagle(path, heads):
    """The eagle LLM with the target's prefill graphs forced on (CPU: each piece's captured
    function runs eagerly through the graph runner), pieces of at most 32 tokens: every prompt
    takes the graphed head prompt pass (its stage in the piece graphs, the first-draft graph)."""
    import graphrt.model.runtime as rt

    class Graphed(rt.ModelRuntime):
        def __init__(self, *a, **kw):
            super().__init__(*a, **{**kw, "graphed_prefill": True})
    mp = pytest.MonkeyPatch()
    mp.setattr(rt, "ModelRuntime", Graphed)
    try:
        return _eagle(path, heads.repeat, prefill_graph_tokens=32)
    finally:
        mp.undo()


def test_graphed_head_prompt_pass_emits_the_eager_pass_tokens(eagle, graphed_eagle, full, monkeypatch):
    """Prompts of 1 to 40 tokens (40: pieces of 32 + 8), admissions of up to 4: the graphed head
    prompt pass gives the tokens of the eager one (and of plain decoding) and the same proposal
    and acceptance counts (the same first drafts, float32); a request with prompt log-probs
    (an eager target prefill) takes the eager head pass on the same engine, same tokens."""
    from graphrt.speculative.eagle3.prompt import Eagle3PromptGraphs
    assert graphed_eagle.runtime.spec.eagle.prompt is not None and eagle.runtime.spec.eagle.prompt is None
    calls, real = [], Eagle3PromptGraphs.first_draft
    monkeypatch.setattr(Eagle3PromptGraphs, "first_draft", lambda self, *a, **k: calls.append(len(a[1])) or
                        real(self, *a, **k))
    prompts = PROMPTS + [[9], list(range(5, 22)), [(7 * j) % 50 + 3 for j in range(40)]]
    counts = lambda llm: {k: llm.engine.stats()[k] for k in ("spec_proposed", "spec_accepted")}  # noqa: E731
    before = counts(graphed_eagle), counts(eagle)
    got = graphed_eagle.generate(prompts, GREEDY, use_tqdm=False)
    _same(got, eagle.generate(prompts, GREEDY, use_tqdm=False))
    _same(got[:4], full)
    assert sum(calls) == len(prompts)
    after = counts(graphed_eagle), counts(eagle)
    assert {k: after[0][k] - before[0][k] for k in after[0]} == {k: after[1][k] - before[1][k] for k in after[1]}
    lp = SamplingParams(max_tokens=10, temperature=0, ignore_eos=True, prompt_logprobs=1)
    got = graphed_eagle.generate(PROMPTS[:1], lp, use_tqdm=False)
    assert sum(calls) == len(prompts) and got[0].prompt_logprobs is not None
    _same(got, full[:1])


def test_eos_inside_a_round_at_bs_1(full, path, heads, tmp_path):
    p = SamplingParams(max_tokens=10, temperature=0)
    d = tmp_path / "eos"
    shutil.copytree(path, d)
    (d / "generation_config.json").write_text(json.dumps({"eos_token_id": [full[2].token_ids[4]]}))
    want = LLM(d, max_batch=4, steps_per_graph=3, **CPU).generate(PROMPTS[2:3], p, use_tqdm=False)
    assert want[0].finish_reason == "stop"
    _same(_eagle(d, heads.repeat).generate(PROMPTS[2:3], p, use_tqdm=False), want)


def test_preemption_and_aborts(plain, path, heads):
    p = SamplingParams(max_tokens=14, temperature=0, ignore_eos=True)
    want = plain.generate(PROMPTS, p, use_tqdm=False)
    tight = _eagle(path, heads.repeat, num_pages=5)   # 4 pages usable, 2 a request at most
    _same(tight.generate(PROMPTS, p, use_tqdm=False), want)
    eng = tight.engine
    assert eng.scheduler.num_preemptions > 0
    streams = [eng.add_request(x, p) for x in PROMPTS[:3]]
    seen = 0
    for d in streams[1]:                              # drive the engine until request 1 has tokens
        seen += len(d.token_ids)
        if seen >= 2:
            break
    eng.abort(streams[0].request_id)
    eng.abort(streams[1].request_id)
    _same([streams[2].result()], want[2:3])
    assert streams[0].result().finish_reason == "abort"
    alloc = eng.scheduler.allocator
    assert alloc.num_free == alloc.num_pages


def test_seeded_sampling_emits_the_tokens_of_plain_sampling(plain, eagle):
    params = [SamplingParams(max_tokens=6, temperature=0.8, seed=7, ignore_eos=True),
              SamplingParams(max_tokens=6, temperature=1.0, top_k=5, top_p=0.9, seed=3, ignore_eos=True)]
    _same(eagle.generate(PROMPTS[1:3], params, use_tqdm=False), plain.generate(PROMPTS[1:3], params, use_tqdm=False))


def test_a_random_head_in_the_speculators_layout_loads_and_stays_exact(plain, path, heads, tmp_path):
    from graphrt.speculative.eagle3 import convert_head
    llm = _eagle(path, convert_head(heads.random, tmp_path / "spec", "speculators"))
    assert llm.engine.spec.method == "eagle3"
    p = SamplingParams(max_tokens=4, temperature=0, ignore_eos=True)
    _same(llm.generate(PROMPTS[:1], p, use_tqdm=False), plain.generate(PROMPTS[:1], p, use_tqdm=False))


def test_bad_heads_name_the_field(path, heads, tmp_path):
    with pytest.raises(ValueError, match="speculative.model: cannot load the EAGLE-3 head"):
        _eagle(path, str(heads.repeat) + "-missing")
    bad = write_random_head(path, tmp_path / "ids", layer_ids=(0, 1, 3))       # the target has 2 layers
    with pytest.raises(ValueError, match="speculative.model.*eagle_aux_hidden_state_layer_ids"):
        _eagle(path, bad)
    with pytest.raises(ValueError, match="speculative.draft_model: method 'eagle3' needs"):
        LLM(path, speculative={"method": "eagle3", "num_tokens": 2}, **CPU)


def test_serve_flags():
    from graphrt.serve.cli import speculative_from_flags
    args = SimpleNamespace(speculative_method="eagle3", draft_model="/heads/h", num_speculative_tokens=3)
    spec = speculative_from_flags(args)
    assert (spec.method, spec.draft_model, spec.num_tokens) == ("eagle3", "/heads/h", 3)
    with pytest.raises(ValueError, match="--draft-model: method 'eagle3' needs"):
        speculative_from_flags(SimpleNamespace(speculative_method="eagle3", draft_model=None,
                                               num_speculative_tokens=None))
