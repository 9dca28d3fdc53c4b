"""`LLM` from several threads (engine/llm.py, engine.step's lock): generate / chat called
concurrently, with or without the engine's own thread, give each caller the tokens it gets alone
(greedy and seeded sampling), and the pages come back."""
from __future__ import annotations

import threading

import pytest

from _checkpoints import write
from graphrt import LLM, SamplingParams

pytest.importorskip("transformers")
JOBS = [(["Hello world", [3, 4, 5]], SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)),
        (["the graph"], SamplingParams(max_tokens=7, temperature=0.9, top_k=20, seed=5, ignore_eos=True)),
        ([[9, 10, 11, 12]], SamplingParams(max_tokens=9, temperature=1.0, top_p=0.8, seed=6, ignore_eos=True)),
        (["abc", "xyz uvw"], SamplingParams(max_tokens=5, temperature=0.0, ignore_eos=True))]
CHAT = [{"role": "user", "content": "Hi there"}]


@pytest.fixture(scope="module")
def llm(tmp_path_factory):
    path = write(tmp_path_factory, "threads", arch="qwen2", dtype="float32", seed=9)
    return LLM(path, device="cpu", backend="reference", max_batch=3, steps_per_graph=2, max_model_len=48)


@pytest.mark.parametrize("engine_thread", [False, True])
def test_generate_and_chat_from_threads_match_alone(llm, engine_thread):
    alone = [[o.token_ids for o in llm.generate(p, sp)] for p, sp in JOBS]
    chat_alone = llm.chat(CHAT, SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)).token_ids
    if engine_thread:
        llm.engine.start()
    try:
        got, errors = {}, []

        def job(i, rounds=2):
            try:
                for r in range(rounds):
                    if i == len(JOBS):
                        got[(i, r)] = llm.chat(CHAT, SamplingParams(max_tokens=6, temperature=0.0,
                                                                    ignore_eos=True)).token_ids
                    else:
                        got[(i, r)] = [o.token_ids for o in llm.generate(*JOBS[i])]
            except BaseException as e:                # noqa: BLE001
                errors.append(e)
        threads = [threading.Thread(target=job, args=(i,)) for i in range(len(JOBS) + 1)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(300)
        assert not errors, repr(errors[0])
        for (i, r), ids in got.items():
            assert ids == (chat_alone if i == len(JOBS) else alone[i]), (i, r)
        assert len(got) == 2 * (len(JOBS) + 1)
    finally:
        llm.engine.shutdown()
    alloc = llm.engine.scheduler.allocator
    assert alloc.num_free == alloc.num_pages and not llm.engine.scheduler.has_work
