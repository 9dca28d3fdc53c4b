"""engine/scheduler.py: KV pages grow per block; an exhausted pool preempts the newest request
(recompute), which later finishes with the same tokens as an unconstrained run."""
from __future__ import annotations

import pytest

from _checkpoints import write
from graphrt import LLM, SamplingParams

pytest.importorskip("transformers")
CPU = dict(device="cpu", backend="reference", max_model_len=48)


@pytest.fixture(scope="module")
def path(tmp_path_factory):
    return write(tmp_path_factory, "preempt", arch="llama", dtype="float32", seed=7)


def test_exhausted_pool_preempts_and_every_request_gets_the_unconstrained_tokens(path):
    prompts = [[3 + i, 40, 41 + i, 7, 9, 11, 13 + i, 2] for i in range(4)]
    params = [SamplingParams(max_tokens=30, temperature=0.0, ignore_eos=True)] * 3 + [
        SamplingParams(max_tokens=30, temperature=0.9, top_p=0.9, seed=42, ignore_eos=True)]
    free = LLM(path, max_batch=4, steps_per_graph=3, **CPU)
    want = free.generate(prompts, params)
    assert free.engine.scheduler.num_preemptions == 0
    # 8 + 30 + 3 tokens: 3 pages of 16 each at most, 12 for all four; the pool has 6
    tight = LLM(path, max_batch=4, steps_per_graph=3, num_pages=6, **CPU)
    eng = tight.engine
    streams = [eng.add_request(p, sp) for p, sp in zip(prompts, params)]
    peak = 0
    while eng.step():
        used = eng.stats()["pages_used"]
        peak = max(peak, used)
        assert used <= 6
    got = [s.result() for s in streams]
    assert eng.scheduler.num_preemptions > 0
    assert [g.token_ids for g in got] == [w.token_ids for w in want]
    assert [g.text for g in got] == [w.text for w in want]
    assert all(g.finish_reason == "length" for g in got)
    alloc = eng.scheduler.allocator
    assert alloc.num_free == alloc.num_pages == 6 and peak == 6


def test_pages_grow_with_the_request_instead_of_a_worst_case_reservation(path):
    llm = LLM(path, max_batch=2, steps_per_graph=2, **CPU)
    eng = llm.engine
    stream = eng.add_request([1, 2, 3], SamplingParams(max_tokens=40, temperature=0, ignore_eos=True))
    eng.step()                                       # prefill + the first block: 3 + 2 tokens
    assert eng.stats()["pages_used"] == 1            # not pages for 3 + 40 + K tokens
    out = stream.result()
    assert len(out.token_ids) == 40
    assert eng.stats()["pages_used"] == 0
