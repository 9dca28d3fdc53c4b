"""Prompts of 64 tokens or more (the engine keeps them as one int64 array, Engine._prompt_ids /
Request.context_ids, read by the prefix cache's keys and the prefill) through the CPU engine:
a shared 70-token prefix, a tight pool (preemption by recompute), small prefill chunks, reversed
order, and n = 3 seeded samples sharing a prefill. Greedy and seeded tokens equal an engine
without the prefix cache, and every page comes back."""
import random

import pytest

from _checkpoints import write
from _engine_steps import drive
from graphrt import LLM, SamplingParams
from graphrt.engine.engine import Engine

pytest.importorskip("transformers")
CPU = dict(device="cpu", backend="reference", max_model_len=160, page_size=4)


def _run(eng, prompts, params):
    streams = [eng.add_request(p, params) for p in prompts]
    drive(eng, max_steps=3000)
    return [s.result() for s in streams]


def _engine(llm, **kw):
    e = llm.engine
    return Engine(llm.runtime, llm.tokenizer, eos_token_ids=tuple(e.scheduler.eos),
                  max_model_len=e.max_model_len, **kw)


def _all_back(eng):
    a = eng.scheduler.allocator
    assert a.num_free == a.num_pages and not eng.scheduler.has_work
    assert all(a.refcount(p) == 0 for p in range(1, a.num_pages + 1))


def test_long_prompts_with_the_prefix_cache_equal_without(tmp_path_factory):
    path = write(tmp_path_factory, "long", arch="llama", dtype="float32", seed=11)
    rng = random.Random(0)
    shared = [rng.randrange(3, 60) for _ in range(70)]
    prompts = [shared + [rng.randrange(3, 60) for _ in range(rng.randint(0, 9))] for _ in range(5)]
    prompts += [shared[:64], shared[:66]]
    greedy = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
    llm = LLM(path, max_batch=3, steps_per_graph=3, num_pages=30, enable_prefix_caching=False, **CPU)
    want = _run(llm.engine, prompts, greedy)
    for kw in ({}, {"max_num_batched_tokens": 8}):
        eng = _engine(llm, **kw)
        got, back = _run(eng, prompts, greedy), _run(eng, prompts[::-1], greedy)
        assert [g.token_ids for g in got] == [w.token_ids for w in want]
        assert [g.token_ids for g in back] == [w.token_ids for w in want[::-1]]
        assert eng.stats()["prefix_cache_hits"] > 0
        assert eng.scheduler.num_preemptions > 0              # the tight pool preempts
        _all_back(eng)
    seeded = SamplingParams(max_tokens=8, temperature=0.8, n=3, seed=5, ignore_eos=True)
    off = _run(_engine(llm, enable_prefix_caching=False), prompts[:2], seeded)
    eng = _engine(llm)
    on = _run(eng, prompts[:2], seeded)
    assert [[o.token_ids for o in r.outputs] for r in on] == [[o.token_ids for o in r.outputs] for r in off]
    _all_back(eng)
