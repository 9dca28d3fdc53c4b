"""engine/scheduler.py: KV pages grow per block; an exhausted pool preempts the newest request
(recompute), which later finishes with the same tokens as an unconstrained run."""
from __future__ import annotations

import pytest

from _checkpoints import write
from _engine_steps import drive
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

    def pages(eng):
        nonlocal peak
        used = eng.stats()["pages_used"]
        peak = max(peak, used)
        assert used <= 6
    drive(eng, max_steps=200, on_step=pages)        # 4 x 30 tokens at K = 3, preemptions and all
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
    drive(eng, max_steps=40)
    out = stream.result()
    assert len(out.token_ids) == 40
    assert eng.stats()["pages_used"] == 0


def test_a_preempted_request_resumes_at_its_accepted_position(path, monkeypatch):
    """At every (re)activation, a request's prefill ran over prompt + its accepted tokens and
    its row starts at seq_len = that + 1 (the drawn token) with draw index len(accepted) + 1;
    after a preemption nothing launched but not accepted is kept."""
    from graphrt.worker.changes import Activate
    prompts = [[3 + i, 40, 41 + i, 7, 9, 11, 13 + i, 2] for i in range(4)]
    params = SamplingParams(max_tokens=30, temperature=0.0, ignore_eos=True)
    llm = LLM(path, max_batch=4, steps_per_graph=3, num_pages=6, **CPU)
    eng, sched = llm.engine, llm.engine.scheduler
    prefilled, at_preempt, resumed = [], {}, []
    real_prefill, real_preempt, real_activate = eng.runtime.runtime.prefill, sched.preempt, sched.activate

    def prefill(prompts_, table, *, starts=None, **kw):  # the end position of each prompt
        prefilled.append([int(p.numel()) + (starts[i] if starts else 0) for i, p in enumerate(prompts_)])
        return real_prefill(prompts_, table, starts=starts, **kw)

    def preempt(req):
        real_preempt(req)
        assert req.launched == len(req.token_ids) and req.slot == -1 and req.pages == []
        at_preempt[req.request_id] = list(req.token_ids)

    def activate(req):
        real_activate(req)
        if req.launched >= req.params.max_tokens:          # nothing left to decode: no row
            return
        accepted = len(req.token_ids)
        assert prefilled[-1].count(len(req.prompt) + accepted) >= 1, (prefilled[-1], accepted)
        assert req.launched == accepted + 1, (req.request_id, req.launched, accepted)
        row = sched.changes[-1]                            # the row the next launch carries
        assert isinstance(row, Activate) and row.slot == req.slot
        assert row.seq_len == len(req.prompt) + accepted + 1, (req.request_id, row.seq_len)
        assert row.step == accepted + 1
        if req.preemptions:
            assert req.token_ids == at_preempt[req.request_id]    # resumed where it was preempted
            resumed.append((req.request_id, accepted))
    monkeypatch.setattr(eng.runtime.runtime, "prefill", prefill)
    monkeypatch.setattr(sched, "preempt", preempt)
    monkeypatch.setattr(sched, "activate", activate)
    streams = [eng.add_request(p, params) for p in prompts]
    drive(eng, max_steps=200)
    assert resumed and all(n > 0 for _, n in resumed), resumed   # resumed mid-output, not from scratch
    assert all(len(s.result().token_ids) == 30 for s in streams)
