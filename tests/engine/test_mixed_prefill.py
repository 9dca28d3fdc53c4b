"""Prompt chunks carried by decode blocks (EngineConfig.mixed_prefill_tokens, model/mixed.py) on
CPU float32: while rows decode, a long prompt's chunks ride the blocks' first steps and the
request decodes in the block that carries its last piece (no prefill launch of its own); every
request's tokens equal the engine's without mixed chunks (greedy and seeded sampling), with the
prefix cache, aborts and preemption; pieces ride the blocks whatever the pacer's budget; bad
options name the field."""
from __future__ import annotations

import pytest

from _checkpoints import write
from _engine_steps import drive
from graphrt import LLM, SamplingParams
from graphrt.engine.config import EngineConfig

pytest.importorskip("transformers")
PS, C = 4, 8
CPU = dict(device="cpu", backend="reference", max_model_len=64, page_size=PS)
GREEDY = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
LONG = list(range(11, 35))                                   # 24 tokens: chunks (0, 8), (8, 16), last (16, 24)


def _long(base: int) -> list[int]:
    """A 24-token prompt of its own per test (the module's engines keep a prefix cache)."""
    return list(range(base, base + 24))
RUN = SamplingParams(max_tokens=20, temperature=0.0, ignore_eos=True)


@pytest.fixture(scope="module")
def path(tmp_path_factory):
    return write(tmp_path_factory, "mixed", shape="tiny", arch="llama")


@pytest.fixture(scope="module")
def mixed(path):
    return LLM(path, max_batch=4, steps_per_graph=3, mixed_prefill_tokens=C, max_num_batched_tokens=8, **CPU)


@pytest.fixture(scope="module")
def plain(path):
    return LLM(path, max_batch=4, steps_per_graph=3, max_num_batched_tokens=8, **CPU)


def _scenario(llm, early, late, *, abort_after=None, steps_before=1):
    """`early` (prompt, params) pairs start decoding, then `late` ones arrive; -> (outputs, engine)."""
    eng = llm.engine
    eng.scheduler.record = True
    eng.scheduler.launches.clear()
    first = [eng.add_request(p, sp) for p, sp in early]
    for _ in range(steps_before):
        eng.step()
    second = [eng.add_request(p, sp) for p, sp in late]
    if abort_after is not None:
        for _ in range(abort_after):
            eng.step()
        eng.abort(second[0].request_id)
    drive(eng, max_steps=400)
    return [s.result() for s in first + second], eng


def _all_back(eng):
    a = eng.scheduler.allocator
    assert not eng.scheduler.has_work and not eng._pending
    assert all(a.refcount(p) == 0 for p in range(1, a.num_pages + 1))


def _kinds(eng, rid):
    return [(e[0],) + tuple(e[2:]) for e in eng.scheduler.launches if e[0] in ("prefill", "mixed") and e[1] == rid]


def test_decode_blocks_carry_a_long_prompt_with_identical_tokens(mixed, plain):
    want, _ = _scenario(plain, [([5, 6, 7], RUN)], [(LONG, GREEDY)])
    before = mixed.engine.stats()
    got, eng = _scenario(mixed, [([5, 6, 7], RUN)], [(LONG, GREEDY)])
    assert [g.token_ids for g in got] == [w.token_ids for w in want]
    assert _kinds(eng, got[1].request_id) == [("mixed", 0, 8), ("mixed", 8, 16), ("mixed", 16, 24)]
    st = eng.stats()
    assert st["prefill_mixed_chunks"] - before["prefill_mixed_chunks"] == 3
    assert st["prefill_mixed_tokens"] - before["prefill_mixed_tokens"] == 23   # the last token decodes
    _all_back(eng)
    assert "prefill_mixed_chunks" not in plain.engine.stats()


def test_seeded_sampling_is_the_same_with_mixed_chunks(mixed, plain):
    hot = [SamplingParams(max_tokens=12, temperature=0.9, top_p=0.9, seed=s, ignore_eos=True) for s in (1, 2, 3)]
    long = _long(41)
    early, late = [([5, 6, 7], hot[0]), ([9, 8], hot[1])], [(long, hot[2]), (long[3:], GREEDY)]
    want, _ = _scenario(plain, early, late)
    got, eng = _scenario(mixed, early, late)
    assert [g.token_ids for g in got] == [w.token_ids for w in want]
    assert any(k[0] == "mixed" for k in _kinds(eng, got[2].request_id))
    _all_back(eng)


def test_chunks_start_after_the_cached_prefix(mixed, plain):
    long = _long(71)
    mixed.generate([long[:13]], GREEDY, use_tqdm=False)              # caches its first 3 pages
    want, _ = _scenario(plain, [([5, 6, 7], RUN)], [(long, GREEDY)])
    got, eng = _scenario(mixed, [([5, 6, 7], RUN)], [(long, GREEDY)])
    assert [g.token_ids for g in got] == [w.token_ids for w in want]
    assert got[1].num_cached_tokens == 12
    assert _kinds(eng, got[1].request_id) == [("mixed", 12, 20), ("mixed", 20, 24)]
    _all_back(eng)
    # all but the last token cached: the row joins the next block with no chunk at all
    before = eng.stats()["prefill_mixed_chunks"]
    want, _ = _scenario(plain, [([5, 6, 7], RUN)], [(long[:13], GREEDY)])
    got, eng = _scenario(mixed, [([5, 6, 7], RUN)], [(long[:13], GREEDY)])
    assert [g.token_ids for g in got] == [w.token_ids for w in want] and got[1].num_cached_tokens == 12
    assert _kinds(eng, got[1].request_id) == [("mixed", 12, 13)]
    assert eng.stats()["prefill_mixed_chunks"] == before
    _all_back(eng)


def test_pieces_ride_the_blocks_whatever_the_pacers_budget(path, plain):
    wide = LLM(path, max_batch=4, steps_per_graph=3, mixed_prefill_tokens=C, max_num_batched_tokens=12,
               max_prefill_stall=None, **CPU)
    long = _long(161)[:20]                                  # a budget of 12 > C: still pieces of C
    want, _ = _scenario(plain, [([5, 6, 7], RUN)], [(long, GREEDY)])
    got, eng = _scenario(wide, [([5, 6, 7], RUN)], [(long, GREEDY)])
    assert [g.token_ids for g in got] == [w.token_ids for w in want]
    assert _kinds(eng, got[1].request_id) == [("mixed", 0, 8), ("mixed", 8, 16), ("mixed", 16, 20)]
    _all_back(eng)


def test_an_abort_mid_prompt_leaves_the_others_exact(mixed, plain):
    want, _ = _scenario(plain, [([5, 6, 7], RUN)], [])
    long = _long(101)
    got, eng = _scenario(mixed, [([5, 6, 7], RUN)], [(long, GREEDY), (long[2:], GREEDY)], abort_after=2)
    assert got[0].token_ids == want[0].token_ids
    assert got[1].finish_reason == "abort"
    assert [k[0] for k in _kinds(eng, got[1].request_id)] == ["mixed", "mixed"]   # aborted after two pieces
    solo = plain.generate([long[2:]], GREEDY, use_tqdm=False)[0].outputs[0].token_ids
    assert got[2].token_ids == solo
    assert any(e[0] == "mixed" for e in eng.scheduler.launches)
    _all_back(eng)


def test_a_tight_pool_preempts_with_identical_tokens(path):
    kw = dict(max_batch=3, steps_per_graph=3, num_pages=11, max_num_batched_tokens=8, enable_prefix_caching=False)
    params = SamplingParams(max_tokens=14, temperature=0.0, ignore_eos=True)
    early, late = [([5, 6, 7], params)], [(LONG, params), (LONG[4:], params)]
    want, _ = _scenario(LLM(path, **kw, **CPU), early, late)
    got, eng = _scenario(LLM(path, mixed_prefill_tokens=C, **kw, **CPU), early, late)
    assert [g.token_ids for g in got] == [w.token_ids for w in want]
    assert eng.scheduler.num_preemptions > 0 and eng.stats()["prefill_mixed_chunks"] > 0
    _all_back(eng)


def test_a_request_preempted_between_its_pieces_is_prefilled_again(path):
    """A block's page growth preempts the request whose pieces the blocks were carrying (the
    newest): it is prefilled again later from position 0, every token as without mixed chunks."""
    kw = dict(max_batch=3, steps_per_graph=3, num_pages=14, max_num_batched_tokens=8, enable_prefix_caching=False)
    early = [([5, 6, 7], SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True))]
    late = [(list(range(11, 51)), SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True))]
    want, _ = _scenario(LLM(path, **kw, **CPU), early, late)
    llm = LLM(path, mixed_prefill_tokens=C, **kw, **CPU)
    preempted = []
    preempt = llm.engine.scheduler.preempt

    def spy(req):
        preempted.append((req.request_id, req.prefilling))
        preempt(req)
    llm.engine.scheduler.preempt = spy
    got, eng = _scenario(llm, early, late)
    assert [g.token_ids for g in got] == [w.token_ids for w in want]
    late_id = got[1].request_id
    pieces = _kinds(eng, late_id)
    assert (late_id, True) in preempted                       # mid-prompt
    assert pieces[0] == ("mixed", 0, 8) and ("prefill", 0, 40) in pieces   # carried, then again whole
    _all_back(eng)


def test_rows_with_logits_processing_keep_separate_chunks(mixed, plain):
    pen = SamplingParams(max_tokens=12, temperature=0.0, repetition_penalty=1.3, ignore_eos=True)
    long = _long(131)
    want, _ = _scenario(plain, [([5, 6, 7], pen)], [(long, GREEDY)])
    got, eng = _scenario(mixed, [([5, 6, 7], pen)], [(long, GREEDY)])
    assert [g.token_ids for g in got] == [w.token_ids for w in want]
    kinds = [k[0] for k in _kinds(eng, got[1].request_id)]
    assert len(kinds) >= 2 and set(kinds) == {"prefill"}       # chunks, but a processed graph carries none
    _all_back(eng)


def test_bad_options_name_the_field(path):
    for bad in (-1, 4096, True, "8", 2.0):
        with pytest.raises(ValueError, match="mixed_prefill_tokens"):
            EngineConfig(mixed_prefill_tokens=bad)
    with pytest.raises(ValueError, match="mixed_prefill_tokens.*speculative"):
        EngineConfig(mixed_prefill_tokens=8, speculative={"method": "ngram", "num_tokens": 2})
    with pytest.raises(ValueError, match="mixed_prefill_tokens.*max_num_batched_tokens"):
        EngineConfig(mixed_prefill_tokens=8, max_num_batched_tokens=None)
    with pytest.raises(ValueError, match="mixed_prefill_tokens.*max_num_batched_tokens=64"):
        EngineConfig(mixed_prefill_tokens=128, max_num_batched_tokens=64)
    assert EngineConfig().mixed_prefill_tokens == 0
    from graphrt.serve.flags import add_model_flags, engine_overrides
    import argparse
    p = argparse.ArgumentParser()
    add_model_flags(p)
    args = p.parse_args(["--mixed-prefill-tokens", "64"])
    assert engine_overrides(args, {})["mixed_prefill_tokens"] == 64


def test_a_refused_piece_fails_its_request_only(mixed, plain):
    want, _ = _scenario(plain, [([5, 6, 7], RUN)], [])
    ex = mixed.engine.runtime
    real = ex.stage_chunk

    def refuse(slot, tokens, start, **kw):
        raise ValueError("tokens: refused for the test")
    ex.stage_chunk = refuse
    eng = mixed.engine
    try:
        run = eng.add_request([5, 6, 7], RUN)
        eng.step()
        late = eng.add_request(_long(191), GREEDY)
        drive(eng, max_steps=400)
    finally:
        ex.stage_chunk = real
    assert run.result().token_ids == want[0].token_ids
    with pytest.raises(ValueError, match="refused for the test"):
        late.result()
    _all_back(eng)


def test_a_cache_pinned_before_the_field_matches_it_off(tmp_path):
    from graphrt.cache.load import CacheMismatchError
    from graphrt.serve.cache_pin import ENGINE_FIELDS, check_built_for
    engine = {k: None for k in ENGINE_FIELDS} | {"mixed_prefill_tokens": 0}
    want = {"model": {"config_sha256": "x"}, "engine": engine}
    old = {"built_for": {"model": {"config_sha256": "x"},
                         "engine": {k: v for k, v in engine.items() if k != "mixed_prefill_tokens"}}}
    check_built_for(tmp_path, old, want)                      # built before the field: it was 0
    with pytest.raises(CacheMismatchError, match="mixed_prefill_tokens"):
        check_built_for(tmp_path, old, want | {"engine": engine | {"mixed_prefill_tokens": 128}})


def test_the_piece_choice_is_a_pure_function_of_the_scheduler_state():
    from types import SimpleNamespace as NS

    from graphrt.engine.scheduler import Scheduler
    s = Scheduler(max_batch=4, page_size=4, max_pages_per_seq=16, num_pages=32, steps_per_graph=2,
                  eos_token_ids=(), max_num_batched_tokens=8)
    plain, processed = NS(processed=False, prompt_logprobs=None), NS(processed=True, prompt_logprobs=None)

    def req(n, computed=0, params=plain, shares=None):
        return NS(prompt=list(range(n)), token_ids=[], computed=computed, params=params, shares=shares,
                  processed=params.processed)                         # Request.processed
    row = req(3)
    budget = {"v": 8}
    s.prefill_budget = lambda: budget["v"]
    assert s.mixed_piece(8, [row]) is None                            # nothing prefilling
    r = req(30, computed=2)
    s.prefilling = [r]
    assert s.mixed_piece(8, []) is None                               # no row decodes
    assert s.mixed_piece(8, [req(3, params=processed)]) is None       # a processed row's graph
    assert s.mixed_piece(8, [row]) == (r, 2, 8)                       # to the page boundary
    r.computed = 8
    assert s.mixed_piece(8, [row]) == (r, 8, 16)
    budget["v"] = 16
    assert s.mixed_piece(8, [row]) == (r, 8, 16)                      # a larger budget: still C
    r.computed = 21
    assert s.mixed_piece(8, [row]) == (r, 21, 30)                     # the last piece: 9 <= C + 1
    r.computed = 29
    assert s.mixed_piece(8, [row]) == (r, 29, 30)                     # only the last token: joins
    for other in (req(30, params=processed), req(30, params=NS(processed=False, prompt_logprobs=2)),
                  req(30, shares=r)):
        s.prefilling = [other]
        assert s.mixed_piece(8, [row]) is None                        # processed, prompt log-probs, a fork
    s.prefilling = [r, req(5, shares=r)]
    assert s.mixed_piece(8, [row]) is None                            # a sample shares its pages


def test_a_joined_row_carries_no_processing_state_of_its_slots_last_request(mixed, plain):
    """A request that starts decoding inside a block gets its slot's processing row written as a
    prefill writes it: a later processed block (another row's penalty) must not apply the slot's
    previous request's repetition penalty and prompt mask to it."""
    long = _long(221)
    solo = plain.generate([long], GREEDY, use_tqdm=False)[0].outputs[0].token_ids
    stale = SamplingParams(max_tokens=2, temperature=0.0, repetition_penalty=10.0, ignore_eos=True)
    pen = SamplingParams(max_tokens=12, temperature=0.0, presence_penalty=1.0, ignore_eos=True)
    early = [([5, 6, 7], RUN), (solo + [3], stale)]         # its prompt: the tokens `long` will draw
    late = [(long, GREEDY), ([9, 10, 11], pen)]              # `long` takes the freed slot, then decodes
    want, _ = _scenario(plain, early, late, steps_before=3)  # beside a processed row
    got, eng = _scenario(mixed, early, late, steps_before=3)
    assert [g.token_ids for g in got] == [w.token_ids for w in want]
    assert got[2].token_ids == solo
    assert any(k[0] == "mixed" for k in _kinds(eng, got[2].request_id))
    _all_back(eng)


def test_tensor_parallel_refuses_mixed_chunks_before_any_rank_starts(path):
    with pytest.raises(ValueError, match="mixed_prefill_tokens: not with tensor_parallel > 1"):
        LLM(path, tensor_parallel=2, mixed_prefill_tokens=C, max_num_batched_tokens=8, **CPU)


def test_a_runtime_refuses_mixed_chunks_under_tensor_parallelism(mixed):
    from types import SimpleNamespace
    from graphrt.model.runtime import ModelRuntime
    mrt = mixed.runtime.runtime
    ranked = SimpleNamespace(spec=mrt.model.spec, local_spec=mrt.model.spec, tp=object())
    with pytest.raises(ValueError, match="mixed_prefill_tokens: not under tensor parallelism"):
        ModelRuntime(ranked, mrt.config, "cpu", mixed_prefill_tokens=C)
