"""Engine failure policy (engine/engine.py, docs/engine.md) on CPU: an exception raised by one
request's work fails that request only (its stream raises, slot and pages freed, the others finish
with the tokens they get alone); an unattributable one (a decode block, a CUDA error) fails every
request with EngineDeadError, sets `error` / `dead`, and every later call raises."""
from __future__ import annotations

import threading

import pytest

from _checkpoints import write
from _engine_steps import drive
from graphrt import LLM, SamplingParams
from graphrt.engine.engine import EngineDeadError

pytest.importorskip("transformers")
GREEDY = SamplingParams(max_tokens=7, temperature=0.0, ignore_eos=True)
PROMPTS = [[5, 6, 7], [9, 10, 11, 12, 13], [20, 21]]
BAD = [77, 3, 4]


@pytest.fixture(scope="module")
def path(tmp_path_factory):
    return write(tmp_path_factory, "fail", arch="llama", dtype="float32", seed=7)


@pytest.fixture(scope="module")
def reference(path):
    llm = LLM(path, device="cpu", backend="reference", max_batch=1, steps_per_graph=3, max_model_len=48)
    return [llm.generate([p], GREEDY)[0].token_ids for p in PROMPTS]   # each alone


def _llm(path):
    return LLM(path, device="cpu", backend="reference", max_batch=4, steps_per_graph=3, max_model_len=48)


def _clean(engine):
    alloc = engine.scheduler.allocator
    assert alloc.num_free == alloc.num_pages
    assert not engine.scheduler.has_work and not engine._requests
    assert all(s is None for s in engine.scheduler.slots)


def _run(engine, threaded):
    """Three good streams + the bad one, read concurrently; -> (good token ids, bad error)."""
    streams = [engine.add_request(p, GREEDY) for p in PROMPTS[:1]]
    bad = engine.add_request(BAD, GREEDY, request_id="bad")
    streams += [engine.add_request(p, GREEDY) for p in PROMPTS[1:]]
    outs, errors = [None] * len(streams), []

    def read(i, s):
        outs[i] = s.result().token_ids

    def read_bad():
        try:
            bad.result()
        except Exception as e:                        # noqa: BLE001 (the test inspects it)
            errors.append(e)
    threads = [threading.Thread(target=read, args=(i, s)) for i, s in enumerate(streams)]
    threads.append(threading.Thread(target=read_bad))
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not any(t.is_alive() for t in threads)
    return outs, errors


@pytest.mark.parametrize("threaded", [False, True])
@pytest.mark.parametrize("where", ["prefill", "tokens"])
def test_one_failing_request_leaves_the_others(path, reference, monkeypatch, where, threaded):
    llm = _llm(path)
    eng = llm.engine
    if where == "prefill":                            # raises while batched with the good prompts
        orig = llm.runtime.runtime.prefill            # the ModelRuntime's (every target prefill)

        def prefill(prompts, table, *, starts=None, **kw):
            if any(int(p[0]) == BAD[0] for p in prompts):
                raise RuntimeError("injected prefill fault")
            return orig(prompts, table, starts=starts, **kw)
        monkeypatch.setattr(llm.runtime.runtime, "prefill", prefill)
    else:                                             # raises mid-stream, after 2 tokens
        orig = eng.scheduler.accept

        def accept(req, toks):
            if req.request_id == "bad" and len(req.token_ids) >= 2:
                raise RuntimeError("injected stop-check fault")
            return orig(req, toks)
        monkeypatch.setattr(eng.scheduler, "accept", accept)
    if threaded:
        eng.start()
    try:
        outs, errors = _run(eng, threaded)
        assert outs == reference
        assert len(errors) == 1 and "injected" in str(errors[0])
        assert eng.error is None and not eng.dead.is_set()
        if threaded:
            assert eng.threaded                       # the loop goes on
        # and the engine still serves
        assert eng.add_request(PROMPTS[0], GREEDY).result().token_ids == reference[0]
        if threaded:
            eng.shutdown()
        drive(eng, max_steps=50)
        _clean(eng)
    finally:
        eng.shutdown()


@pytest.mark.parametrize("threaded", [False, True])
def test_unattributable_failure_fails_everyone_and_stays_dead(path, monkeypatch, caplog, threaded):
    llm = _llm(path)
    eng = llm.engine

    def decode(*a, **k):
        raise RuntimeError("CUDA error: an illegal memory access was encountered (injected)")
    monkeypatch.setattr(llm.runtime, "run", decode)   # the engine's path (blocks)
    if threaded:
        eng.start()
    errors = []

    def call(p):
        try:
            llm.generate([p], GREEDY)
        except Exception as e:                        # noqa: BLE001
            errors.append(e)
    threads = [threading.Thread(target=call, args=(p,)) for p in PROMPTS]
    with caplog.at_level("ERROR", logger="graphrt.engine"):
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
    assert len(errors) == 3                                         # every caller raises:
    dead = [e for e in errors if isinstance(e, EngineDeadError)]
    assert len(dead) == (3 if threaded else 2)                      # the stepping caller gets the cause
    assert all(e is eng.error or e.__cause__ is eng.error for e in errors)
    assert all("illegal memory access" in str(e) for e in errors)
    assert eng.dead.is_set() and isinstance(eng.error, RuntimeError)
    assert any(r.exc_info for r in caplog.records if "unrecoverable" in r.getMessage())  # traceback logged
    assert not eng.threaded
    with pytest.raises(EngineDeadError):
        eng.add_request(PROMPTS[0], GREEDY)
    with pytest.raises(EngineDeadError):
        eng.step()
    _clean(eng)
