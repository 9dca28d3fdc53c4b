"""engine/engine.py + scheduler.py on CPU: stops inside K-step blocks, seeded sampling that does not
depend on the batch or K, cancellation and out-of-pages waiting (pages back to full), streaming,
the background thread, overlap on/off."""
from __future__ import annotations

import json
import shutil
import threading

import pytest

from _checkpoints import write
from graphrt import LLM, SamplingParams

pytest.importorskip("transformers")
GREEDY = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
CPU = dict(device="cpu", backend="reference", max_model_len=48)  # reference: the cheapest on CPU


@pytest.fixture(scope="module")
def path(tmp_path_factory):
    return write(tmp_path_factory, "eng", arch="llama", dtype="float32", seed=5)


@pytest.fixture(scope="module")
def llm(path):
    return LLM(path, max_batch=4, steps_per_graph=3, **CPU)


def _pages_back(llm):
    alloc = llm.engine.scheduler.allocator
    assert alloc.num_free == alloc.num_pages and not llm.engine._pending


def test_stop_token_ids_and_eos_inside_a_block(llm, path, tmp_path):
    full = llm.generate(["Hello world"], GREEDY)[0]
    ids = full.token_ids
    # token 0 comes from prefill, then blocks of K=3: a first occurrence not at a block's end,
    # so the tokens after it in its block are discarded
    first = next(i for i in range(1, len(ids)) if ids.index(ids[i]) == i and (i - 1) % 3 < 2)
    stop_id = ids[first]
    out = llm.generate(["Hello world"], SamplingParams(max_tokens=8, temperature=0, ignore_eos=True,
                                                       stop_token_ids=[stop_id]))[0]
    assert out.token_ids == ids[:first + 1] and out.finish_reason == "stop"
    # the same id as the model's end-of-sequence (generation_config.json), unless ignore_eos
    d = tmp_path / "eos"
    shutil.copytree(path, d)
    (d / "generation_config.json").write_text(json.dumps({"eos_token_id": [stop_id]}))
    eos_llm = LLM(d, max_batch=2, steps_per_graph=3, **CPU)
    out = eos_llm.generate(["Hello world"], SamplingParams(max_tokens=8, temperature=0))[0]
    assert out.token_ids == ids[:first + 1] and out.finish_reason == "stop"
    assert eos_llm.generate(["Hello world"], GREEDY)[0].token_ids == ids
    _pages_back(llm)


def test_stop_strings_cut_the_text_and_are_never_streamed(llm):
    full = llm.generate(["the graph"], GREEDY)[0]
    text = full.text
    assert len(text) > 6
    stop = text[4:6]
    cut = text.find(stop)
    stream = llm.engine.add_request("the graph", SamplingParams(max_tokens=8, temperature=0,
                                                                ignore_eos=True, stop=["@@never", stop]))
    deltas = list(stream)
    streamed = "".join(d.text for d in deltas)
    assert streamed == text[:cut] and deltas[-1].finish_reason == "stop"
    ids = [t for d in deltas for t in d.token_ids]
    assert ids == full.token_ids[:len(ids)] and len(ids) < len(full.token_ids)
    assert all(d.finish_reason is None for d in deltas[:-1])
    _pages_back(llm)


def test_seeded_sampling_same_tokens_whatever_the_batch_and_k(path, llm):
    params = SamplingParams(max_tokens=6, temperature=0.9, top_p=0.95, top_k=40, seed=1234, ignore_eos=True)
    together = llm.generate(["Hello world", "a b c", [7, 8, 9, 10, 11]],
                            [SamplingParams(max_tokens=6, temperature=1.0, seed=1, ignore_eos=True),
                             params, GREEDY])
    k1 = LLM(path, max_batch=2, steps_per_graph=1, **CPU)
    alone = k1.generate(["a b c"], params)[0]
    assert together[1].token_ids == alone.token_ids
    other = llm.generate(["a b c"], SamplingParams(max_tokens=6, temperature=0.9, top_p=0.95, top_k=40,
                                                   seed=99, ignore_eos=True))[0]
    assert other.token_ids != alone.token_ids       # the seed matters (6 draws)


def test_cancel_frees_pages_and_waiting_requests_finish_later(path):
    # pages for one request at a time: its prefill + first block (prompt 20 + K 3 = 23 tokens) take
    # 2 pages of 16, and a second request is admitted only with a block's growth left for the first
    small = LLM(path, max_batch=2, steps_per_graph=3, num_pages=3, **CPU)
    params = SamplingParams(max_tokens=10, temperature=0, ignore_eos=True)
    prompt = list(range(5, 25))
    alone = small.generate([prompt], params)[0]
    eng = small.engine
    a = eng.add_request(prompt, params)
    b = eng.add_request(prompt, params)
    eng.step()
    assert [r.request_id for r in eng.scheduler.waiting] == [b.request_id]   # b waits for pages
    st = eng.stats()
    assert (st["running"], st["waiting"], st["pages_used"], st["pages_free"]) == (1, 1, 2, 1)
    first = next(iter(a))
    assert first.finish_reason is None
    eng.abort(a.request_id)
    rest = list(a)
    assert rest[-1].finish_reason == "abort"
    out = b.result()                                 # b gets a's pages and finishes correctly
    assert out.token_ids == alone.token_ids and out.finish_reason == "length"
    st = eng.stats()                                 # pages are back before the final delta arrives
    assert (st["running"], st["pages_free"]) == (0, 3)
    assert st["tokens_generated"] == len(alone.token_ids) * 2 + len(first.token_ids) + sum(
        len(d.token_ids) for d in rest)
    eng.abort(b.request_id)                          # aborting a finished request: a no-op
    eng.step()
    _pages_back(small)


@pytest.mark.parametrize("overlap", [False, True])
def test_background_thread_and_overlap_give_the_same_tokens(path, llm, overlap):
    want = llm.generate(["Hello world", "the graph token"], GREEDY)
    other = LLM(path, max_batch=4, steps_per_graph=2, overlap=overlap, **CPU)
    other.engine.start()
    try:
        results = {}

        def reader(i, prompt):
            results[i] = other.engine.add_request(prompt, GREEDY).result()
        threads = [threading.Thread(target=reader, args=(i, p))
                   for i, p in enumerate(["Hello world", "the graph token"])]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
        assert [results[i].token_ids for i in range(2)] == [w.token_ids for w in want]
    finally:
        other.engine.shutdown()
    _pages_back(other)


def test_async_iteration_with_the_engine_thread(llm):
    import asyncio
    want = llm.generate(["Hello world"], GREEDY)[0]
    llm.engine.start()
    try:
        async def collect():
            return [d async for d in llm.engine.add_request("Hello world", GREEDY)]
        deltas = asyncio.run(collect())
    finally:
        llm.engine.shutdown()
    assert [t for d in deltas for t in d.token_ids] == want.token_ids
    assert "".join(d.text for d in deltas) == want.text and deltas[-1].finish_reason == "length"


@pytest.fixture(scope="module")
def greedy12(llm):
    """12 greedy tokens of each prompt of test_max_tokens_is_exact_for_every_k (K = 3)."""
    out = llm.generate(K_PROMPTS, SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True))
    return [o.token_ids for o in out]


K_PROMPTS = [[5, 6, 7], [9, 1, 4, 4], [2, 3]]


@pytest.mark.parametrize("k", [1, 2, 3, 4, 5])
def test_max_tokens_is_exact_for_every_k(path, greedy12, k):
    """A K-step block that runs past max_tokens is cut: exactly max_tokens tokens whatever K
    (7 and 11 are multiples of no K in 2..5; 1 is less than every K > 1), the same greedy tokens
    as a longer run's prefix, and every page back."""
    from _engine_steps import drive
    llm = LLM(path, max_batch=3, steps_per_graph=k, **CPU)
    caps = [7, 11, 1]
    eng = llm.engine
    streams = [eng.add_request(p, SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True))
               for p, n in zip(K_PROMPTS, caps)]
    drive(eng, max_steps=2 + 11)                     # a prefill step, then at least one token a step
    outs = [s.result() for s in streams]
    assert [len(o.token_ids) for o in outs] == caps and all(o.finish_reason == "length" for o in outs)
    assert [o.token_ids for o in outs] == [w[:n] for w, n in zip(greedy12, caps)]
    _pages_back(llm)


def test_block_timing_on_cpu_records_nothing_and_changes_nothing(llm):
    """Engine.time_blocks times blocks with CUDA events: on a CPU engine it records nothing (the
    totals stay 0) and the tokens are the same (the GPU test checks the times)."""
    params = SamplingParams(max_tokens=9, temperature=0, ignore_eos=True)
    prompts = [[5, 6, 7], list(range(3, 40))]
    plain = [o.token_ids for o in llm.generate(prompts, params)]
    llm.engine.time_blocks = True
    try:
        timed = [o.token_ids for o in llm.generate(prompts, params)]
        assert llm.engine.stats()["block_device_s"] == {"prefill": 0.0, "decode": 0.0, "spec": 0.0}
    finally:
        llm.engine.time_blocks = False
    assert timed == plain and "block_device_s" not in llm.engine.stats()
    for bad in (1, "yes", None):
        with pytest.raises(ValueError, match="time_blocks"):
            llm.engine.time_blocks = bad
    assert llm.engine.time_blocks is False
