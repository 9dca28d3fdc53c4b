"""kill -9 a tensor-parallel worker mid-generation (CPU, gloo), engine on its own thread (as
`graphrt serve` runs it): the stream in flight raises EngineDeadError caused by RankError within
the timeout, the engine is marked dead (/health 503, serve exits: serve/supervise.py), its pages
are back, and later requests are refused at once."""
from __future__ import annotations

import os
import signal
import time

import pytest

import _checkpoints
from graphrt.engine.engine import EngineDeadError
from graphrt.parallel.launch import RankError

pytest.importorskip("transformers")


def test_killed_worker_kills_the_engine_loudly(tmp_path_factory):
    from graphrt.engine import LLM, SamplingParams
    ckpt = _checkpoints.write(tmp_path_factory, "tpdeath", shape="tiny-gqa", dtype="float32", seed=3)
    llm = LLM(ckpt, device="cpu", tensor_parallel=2, tp_timeout_s=20, max_batch=2, steps_per_graph=2,
              max_model_len=64)
    eng = llm.engine
    eng.start()
    try:
        stream = eng.add_request("Hello", SamplingParams(max_tokens=60, temperature=0.0, ignore_eos=True))
        it = iter(stream)
        assert next(it).token_ids                    # generating
        os.kill(llm._workers.procs[0].pid, signal.SIGKILL)
        t0 = time.monotonic()
        with pytest.raises(EngineDeadError) as e:
            for _ in it:
                pass
        assert time.monotonic() - t0 < 30
        assert isinstance(e.value.__cause__, RankError) and "rank 1 died" in str(e.value)
        assert eng.dead.wait(5) and isinstance(eng.error, RankError) and not eng.threaded
        with pytest.raises(EngineDeadError):
            eng.add_request("Hi", SamplingParams(max_tokens=2))
        alloc = eng.scheduler.allocator
        assert alloc.num_free == alloc.num_pages
    finally:
        eng.shutdown()
        llm.shutdown()
