"""Prefix caching and chunked prefill under speculation with a proposer that keeps K/V of its own
(a draft model, an EAGLE-3 head), CPU float32: greedy output equals the engine without the cache
and without speculation exactly (a shared prefix, chunks between speculative blocks, a tiny pool
that evicts and preempts, an abort mid-prefill); a page shared by two requests is never written,
in the target's cache or the proposer's; every page comes back. The proposer's K/V in a cached
page is its writer's: with the target as its own draft model, a request that finds its prefix
cached proposes and accepts exactly as one that prefills it (the draft's K/V there is right)."""
from __future__ import annotations

import inspect

import pytest
import torch

from _checkpoints import write
from _eagle3_heads import write_random_head
from _engine_steps import assert_all_back, drive, engine_over, run_requests
from graphrt import LLM, SamplingParams
from graphrt.engine.engine import Engine
from graphrt.speculative.draft import DraftProposer
from graphrt.speculative.eagle3.phase import Eagle3Phase

pytest.importorskip("transformers")
PS = 4
CPU = dict(device="cpu", backend="reference", max_model_len=64, page_size=PS)
GREEDY = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
SHARED = [11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21]            # 2 full pages + 3
PROMPTS = [SHARED + [30 + i, 40 + i, 50 + i] for i in range(3)]   # 14 tokens: 3 full pages + 2
LONG = SHARED + SHARED + [5, 6, 7]                                # 25 tokens: chunks of 8
METHODS = ["draft", "eagle3"]


@pytest.fixture(scope="module")
def path(tmp_path_factory):
    return write(tmp_path_factory, "specprefix", arch="llama", dtype="float32", seed=11)


@pytest.fixture(scope="module")
def head(path, tmp_path_factory):
    return write_random_head(path, tmp_path_factory.mktemp("specprefix-head") / "repeat", repeat=True)


@pytest.fixture(scope="module")
def random_head(path, tmp_path_factory):
    """A head with random weights: unlike the repeat head (o_proj zero), its proposals depend on
    its attention over the K/V of every earlier position."""
    return write_random_head(path, tmp_path_factory.mktemp("specprefix-rhead") / "random", seed=3)


def _speculative(method, path, head):
    model = path if method == "draft" else head       # the target as its own draft: accepts nearly all
    return {"method": method, "num_tokens": 3, "model": str(model)}


@pytest.fixture(scope="module", params=METHODS)
def llm(request, path, head):
    return LLM(path, max_batch=4, steps_per_graph=3, spec_rounds=2,
               speculative=_speculative(request.param, path, head), **CPU)


@pytest.fixture(scope="module")
def reference(path):
    """Greedy tokens without speculation or the prefix cache: PROMPTS, then LONG."""
    plain = LLM(path, max_batch=4, steps_per_graph=3, enable_prefix_caching=False, **CPU)
    return [o.token_ids for o in plain.generate(PROMPTS + [LONG], GREEDY, use_tqdm=False)]


def _engine(llm, **kw) -> Engine:
    return engine_over(llm, **kw)


def _run(eng, prompts, params=GREEDY, *, on_step=None):
    return run_requests(eng, prompts, params, on_step=on_step)


_all_back = assert_all_back


def _caches(llm):
    """Layer 0's K of the target's cache and of the proposer's."""
    ex = llm.runtime
    spec = ex.spec
    proposer = spec.draft.kv_caches[0] if spec.draft is not None else spec.eagle.kv_cache
    return ex.runtime.kv_caches[0].k, proposer.k


def _counts(eng):
    st = eng.stats()
    return st["spec_proposed"], st["spec_accepted"]


def test_a_shared_prefix_hits_and_stays_exact(llm, reference):
    eng = _engine(llm)
    assert eng.scheduler.kv.cache is not None                    # on by default under speculation
    first = _run(eng, PROMPTS[:1])[0]
    assert first.token_ids == reference[0] and first.num_cached_tokens == 0
    shared = {}                                                  # page -> (target K, proposer K) when shared

    def snapshot(e):
        a = e.scheduler.allocator
        for p in range(1, a.num_pages + 1):
            if a.refcount(p) >= 2 and p not in shared:
                shared[p] = tuple(c[p].clone() for c in _caches(llm))
    outs = _run(eng, PROMPTS, on_step=snapshot)
    assert [o.token_ids for o in outs] == reference[:3]
    assert [o.num_cached_tokens for o in outs] == [12, 8, 8]
    assert len(shared) >= 2
    for p, (k, kp) in shared.items():                            # never written while shared
        assert torch.equal(_caches(llm)[0][p], k) and torch.equal(_caches(llm)[1][p], kp)
    st = eng.stats()
    assert st["prefix_cache_hits"] == 12 + 8 + 8 and st["spec_accepted"] > 0
    _all_back(eng)


def test_a_cached_prefix_proposes_as_a_prefilled_one(llm, reference):
    """The same request twice on one engine: the second finds 12 of its 14 prompt tokens cached
    (the proposer's K/V there: the first's) and proposes and accepts exactly what an engine
    without the cache does for it."""
    cold = _engine(llm, enable_prefix_caching=False)
    want = _run(cold, PROMPTS[2:3])[0]
    want_counts = _counts(cold)
    eng = _engine(llm)
    _run(eng, PROMPTS[2:3])
    before = _counts(eng)
    got = _run(eng, PROMPTS[2:3])[0]
    assert got.token_ids == want.token_ids == reference[2] and got.num_cached_tokens == 12
    after = _counts(eng)
    assert (after[0] - before[0], after[1] - before[1]) == want_counts
    _all_back(eng)


def test_chunks_run_between_speculative_blocks(llm, reference):
    eng = _engine(llm, max_num_batched_tokens=8, enable_prefix_caching=False, max_prefill_stall=None)
    sched = eng.scheduler
    sched.record = True
    params = SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True)   # decoding through the chunks
    running = [eng.add_request(p, params) for p in PROMPTS[:2]]
    eng.step()                                                   # prefilled whole: nothing decodes yet
    late = eng.add_request(LONG, GREEDY)
    drive(eng, max_steps=400)
    assert late.result().token_ids == reference[3]
    assert [s.result().token_ids[:8] for s in running] == reference[:2]
    mine = [e[2:] for e in sched.launches if e[0] == "prefill" and e[1] == late.request_id]
    assert mine == [(0, 8), (8, 16), (16, 24), (24, 25)]
    log = [e[0] for e in sched.launches if e[0] != "prefill" or e[1] == late.request_id]
    chunks = [i for i, kind in enumerate(log) if kind == "prefill"]
    assert all(log[i + 1] != "prefill" for i in chunks[:-1])     # a speculative block after each chunk
    assert eng.stats()["spec_accepted"] > 0
    _all_back(eng)


def test_chunks_after_a_cached_prefix_survive_aborts(llm, reference):
    eng = _engine(llm, max_num_batched_tokens=4, max_prefill_stall=None)
    sched = eng.scheduler
    sched.record = True
    params = SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True)
    run = eng.add_request(PROMPTS[0], params)
    eng.step()
    late = [eng.add_request(p, GREEDY) for p in PROMPTS[1:]]
    eng.step()
    eng.abort(late[1].request_id)                                # mid-prefill, chunked behind late[0]
    drive(eng, max_steps=400)
    got = late[0].result()
    assert run.result().token_ids[:8] == reference[0] and got.token_ids == reference[1]
    assert late[1].result().finish_reason == "abort"
    starts = [e[2] for e in sched.launches if e[0] == "prefill" and e[1] == late[0].request_id]
    assert starts[0] == 8 and got.num_cached_tokens == 8
    _all_back(eng)


def test_tiny_pool_evicts_and_preempts_with_identical_tokens(path, head, reference):
    params = SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True)
    want = LLM(path, max_batch=4, steps_per_graph=3, enable_prefix_caching=False, **CPU).generate(
        PROMPTS + [LONG], params, use_tqdm=False)
    assert [w.token_ids[:8] for w in want] == reference
    for method in METHODS:
        tight = LLM(path, max_batch=3, steps_per_graph=3, spec_rounds=2, num_pages=12,
                    speculative=_speculative(method, path, head), **CPU)
        got = _run(tight.engine, PROMPTS + [LONG], params)
        assert [g.token_ids for g in got] == [w.token_ids for w in want], method
        st = tight.engine.stats()
        assert tight.engine.scheduler.num_preemptions > 0 and st["prefix_cache_hits"] > 0, (method, st)
        _all_back(tight.engine)


def test_a_cached_prefix_gives_the_head_the_first_proposals_of_a_prefilled_one(path, random_head, monkeypatch):
    """A random head's first proposals after a prompt read its K/V at every prompt position: the
    same prompt prefilled whole (cache off), then twice with the cache (the second run finds 12
    of its 14 tokens cached and runs the head's pass from position 12 over the first run's K/V):
    the same first proposals every time, and the same tokens."""
    llm = LLM(path, max_batch=4, steps_per_graph=3, spec_rounds=2,
              speculative={"method": "eagle3", "num_tokens": 3, "model": str(random_head)}, **CPU)
    firsts, real = [], Eagle3Phase.prefill

    def spy(self, hidden, prompts, first, table, slots, error, *, starts=None):
        real(self, hidden, prompts, first, table, slots, error, starts=starts)
        firsts.append((list(starts or [0] * len(slots)), self.proposals[slots].clone()))
    monkeypatch.setattr(Eagle3Phase, "prefill", spy)
    outs = [_run(_engine(llm, enable_prefix_caching=False), PROMPTS[1:2])[0]]
    eng = _engine(llm)
    outs += [_run(eng, PROMPTS[1:2])[0] for _ in range(2)]
    assert [f[0] for f in firsts] == [[0], [0], [12]] and [o.num_cached_tokens for o in outs] == [0, 0, 12]
    assert all(torch.equal(f[1], firsts[0][1]) for f in firsts)
    assert outs[0].token_ids == outs[1].token_ids == outs[2].token_ids
    _all_back(eng)


def test_the_draft_prefills_each_position_once_and_not_at_all_when_it_waits(path, monkeypatch):
    """With a draft model an admission prefills the draft once over the target's new positions
    (a chunk's too; a cached prefix's not), and not at all where the engine lets it wait
    (`draft=False`: a later speculative block catches it up from the prompt's start)."""
    llm = LLM(path, max_batch=4, steps_per_graph=3, spec_rounds=2,
              speculative={"method": "draft", "num_tokens": 3, "model": str(path)}, **CPU)
    calls, real = [], DraftProposer.prefill

    def spy(self, prompts, block_table, *, starts=None):
        callers.append(inspect.stack()[1].function)
        calls.append([(0 if not starts else int(starts[i]), int(p.numel())) for i, p in enumerate(prompts)])
        return real(self, prompts, block_table, starts=starts)
    callers = []
    monkeypatch.setattr(DraftProposer, "prefill", spy)
    eng = _engine(llm, max_num_batched_tokens=8, max_prefill_stall=None)
    _run(eng, PROMPTS[:1])
    assert calls == [[(0, 14)]]                                  # no decode rows: one whole prefill
    calls.clear()
    _run(eng, PROMPTS[1:2])                                      # 8 of 14 cached
    assert calls == [[(8, 6)]]
    calls.clear()
    run = eng.add_request(PROMPTS[2], SamplingParams(max_tokens=30, temperature=0.0, ignore_eos=True))
    eng.step()
    late = eng.add_request(LONG, GREEDY)                         # chunks of 8 while a row decodes
    drive(eng, max_steps=400)
    assert calls == [[(8, 6)], [(8, 8)], [(16, 8)], [(24, 1)]]   # its 8 cached, 2 chunks, its last piece
    assert run.result().token_ids and late.result().token_ids
    _all_back(eng)
    want = _run(_engine(llm, enable_prefix_caching=False), PROMPTS[:1])[0].token_ids
    calls.clear()
    callers.clear()
    monkeypatch.setattr(Engine, "_draft_choice", lambda self, slots, fork: {"draft": False})
    lazy = _engine(llm)
    for _ in range(2):                                           # the second time 12 tokens are cached
        assert _run(lazy, PROMPTS[:1])[0].token_ids == want
    assert callers == ["sync_draft"] * 2 and calls == [[(0, 14)], [(12, 2)]]   # caught up from each start
    _all_back(lazy)


def test_chunk_prefill_refuses_after_tokens_that_do_not_match_the_pieces(llm):
    """A Prefill launch's `after` (the token following each chunk) must name one token per
    prompt piece: a ValueError naming it, before anything is written."""
    from graphrt.worker.launch import Prefill
    table = torch.zeros((1, llm.runtime.caps.config.max_pages_per_seq), dtype=torch.int32)
    with pytest.raises(ValueError, match="after: 2 tokens for 1 prompts"):
        llm.runtime.prefill(Prefill([torch.tensor([5, 6, 7])], table, starts=[0], after=[1, 2]))
