"""`LLM` under Ctrl-C and shutdown (engine/llm.py, engine/stream.py, Engine.shutdown): a SIGINT that
lands inside an engine step, or a KeyboardInterrupt raised while generate waits, aborts the
caller's own requests (every page back) and the next generate gives the same tokens;
`engine.shutdown()` with a request in flight ends it with finish_reason "abort" and returns."""
from __future__ import annotations

import signal
import threading
import time

import pytest

from _checkpoints import write
from graphrt import LLM, SamplingParams
from graphrt.engine.stream import RequestStream

pytest.importorskip("transformers")
GREEDY = SamplingParams(max_tokens=10, temperature=0.0, ignore_eos=True)
PROMPTS = ["Hello world", [3, 4, 5, 6]]


@pytest.fixture(autouse=True)
def default_sigint():
    """Python's own SIGINT handler for each test: a process started as a shell's background job
    inherits SIGINT ignored, and Python then installs no handler (the tests would see no Ctrl-C)."""
    old = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, old)


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return write(tmp_path_factory, "interrupt", arch="llama", dtype="float32", seed=4)


@pytest.fixture
def llm(ckpt):                                        # one per test: a test that kills it harms no other
    return LLM(ckpt, device="cpu", backend="reference", max_batch=2, steps_per_graph=2, max_model_len=48)


@pytest.fixture
def want(llm):
    return [o.token_ids for o in llm.generate(PROMPTS, GREEDY, use_tqdm=False)]


def pages_full(llm) -> bool:
    a = llm.engine.scheduler.allocator
    return a.num_free == a.num_pages and not llm.engine.scheduler.has_work


def wait_until(cond, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.02)
    return True


def test_sigint_inside_an_engine_step_aborts_the_callers_requests(llm, want, monkeypatch):
    """A real SIGINT delivered while the engine's decode runs (the Ctrl-C users press): the engine
    must not die (it used to: EngineDeadError ... KeyboardInterrupt on the next call)."""
    assert threading.current_thread() is threading.main_thread()
    calls = {"n": 0}
    names = ["run"]                                    # the executor's block launch (graphrt/worker)
    assert names, "the engine's runtime has no decode entry to interrupt"
    for name in names:
        orig = getattr(llm.runtime, name)

        def interrupted(*a, _orig=orig, **k):
            calls["n"] += 1
            if calls["n"] == 2:   # a real SIGINT, its Python handler run before raise_signal returns
                signal.raise_signal(signal.SIGINT)    # (os.kill left that to the next eval-loop check)
            return _orig(*a, **k)
        monkeypatch.setattr(llm.runtime, name, interrupted)
    with pytest.raises(KeyboardInterrupt):
        llm.generate(PROMPTS, GREEDY, use_tqdm=False)
    assert calls["n"] >= 2
    assert llm.engine.error is None and pages_full(llm)      # the caller's requests aborted, pages back
    monkeypatch.undo()
    assert [o.token_ids for o in llm.generate(PROMPTS, GREEDY, use_tqdm=False)] == want
    assert pages_full(llm)


@pytest.mark.parametrize("engine_thread", [False, True])
def test_keyboard_interrupt_while_waiting_aborts_and_llm_keeps_working(llm, want, monkeypatch, engine_thread):
    """KeyboardInterrupt raised from the wait for the next delta (with and without the engine's
    thread) or from the progress bar: requests aborted, pages back, next generate unchanged."""
    if engine_thread:
        llm.engine.start()
    try:
        orig, seen = RequestStream._next, {"n": 0}

        def wait(self):
            seen["n"] += 1
            if seen["n"] == 3:
                raise KeyboardInterrupt
            return orig(self)
        monkeypatch.setattr(RequestStream, "_next", wait)
        long = SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True)
        tokens0 = llm.engine.stats()["tokens_generated"]
        with pytest.raises(KeyboardInterrupt):
            llm.generate(PROMPTS, long, use_tqdm=False)
        monkeypatch.undo()
        assert wait_until(lambda: pages_full(llm), 10.0), llm.engine.stats()
        assert llm.engine.error is None
        made = llm.engine.stats()["tokens_generated"] - tokens0
        assert made < len(PROMPTS) * long.max_tokens // 2, f"{made} tokens: the requests ran on, not aborted"

        from tqdm.auto import tqdm

        def update(self, n=1):
            raise KeyboardInterrupt
        monkeypatch.setattr(tqdm, "update", update)     # the progress callback
        with pytest.raises(KeyboardInterrupt):
            llm.generate(PROMPTS, long)
        monkeypatch.undo()
        assert wait_until(lambda: pages_full(llm), 10.0), llm.engine.stats()
        assert [o.token_ids for o in llm.generate(PROMPTS, GREEDY, use_tqdm=False)] == want
        assert pages_full(llm) and llm.engine.error is None
    finally:
        llm.engine.shutdown()


def test_shutdown_with_a_request_in_flight_ends_it_and_returns(llm, want):
    engine = llm.engine
    engine.start()
    stream = engine.add_request([5, 6, 7], SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True))
    it = iter(stream)
    first = next(it)
    assert first.finish_reason is None
    rest: list = []
    reader = threading.Thread(target=lambda: rest.extend(it), daemon=True)   # blocked on the stream
    reader.start()
    t0 = time.monotonic()
    engine.shutdown()
    took = time.monotonic() - t0
    reader.join(10)
    assert not reader.is_alive(), "the reader still waits: the request was left running"
    assert rest and rest[-1].finish_reason == "abort", rest[-1:]
    assert took < 10, took
    assert pages_full(llm) and engine.stats()["running"] == 0
    assert [o.token_ids for o in llm.generate(PROMPTS, GREEDY, use_tqdm=False)] == want   # still serves


@pytest.mark.parametrize("threaded", [False, True])
def test_llm_shutdown_ends_a_generate_running_on_another_thread(llm, threaded):
    if threaded:
        llm.engine.start()
    long = SamplingParams(max_tokens=40, temperature=0.0, ignore_eos=True)
    got, errors = [], []

    def job():
        try:
            got.extend(llm.generate(PROMPTS, long, use_tqdm=False))
        except BaseException as e:              # noqa: BLE001 (reported below)
            errors.append(e)
    worker = threading.Thread(target=job, daemon=True)
    worker.start()
    assert wait_until(lambda: llm.engine.scheduler.has_work, 30.0)
    time.sleep(0.2)                             # some tokens in
    llm.shutdown()
    worker.join(20)
    assert not worker.is_alive(), "generate still runs after LLM.shutdown()"
    assert not errors, repr(errors[:1])
    assert [o.finish_reason for o in got] == ["abort", "abort"] and all(len(o.token_ids) < 40 for o in got)
    assert pages_full(llm) and not llm.engine.threaded
    with pytest.raises(RuntimeError, match="closed"):
        llm.generate(PROMPTS, GREEDY, use_tqdm=False)
    llm.shutdown()                              # idempotent
