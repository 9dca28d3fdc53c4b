"""Test helpers: drive an engine a bounded number of steps (a stuck request fails the test with
a message naming what is left, not by the suite's timeout); a second engine over an LLM's
executor; run requests to their end; every page back."""
from __future__ import annotations


def drive(eng, *, max_steps: int, on_step=None) -> int:
    """eng.step() until no work remains; returns the steps taken. AssertionError after
    `max_steps` steps with work left (waiting / running request ids and their token counts).
    on_step(eng) runs after every step."""
    for i in range(max_steps):
        more = eng.step()
        if on_step is not None:
            on_step(eng)
        if not more:
            return i + 1
    sched = eng.scheduler
    running = [(r.request_id, len(r.token_ids), r.params.max_tokens) for r in sched.slots if r is not None]
    waiting = [(r.request_id, len(r.token_ids)) for r in sched.waiting]
    raise AssertionError(f"engine still has work after {max_steps} steps: running (id, tokens, max_tokens) "
                         f"{running}, waiting {waiting}")


def prefill_sync_sites(eng) -> list[str]:
    """The admitted requests' prefill (Engine._prefill over the scheduler's work) under CUDA's
    sync-debug mode: one string per synchronising call, its graphrt frames innermost first.
    Requests must already be added; the caller drives the engine afterwards."""
    import traceback
    import warnings

    import torch
    eng._drain_inbox()
    eng.scheduler.admit()
    work = eng.scheduler.prefill_work()
    assert work
    torch.cuda.synchronize()
    sites = []
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.showwarning = lambda msg, *a, **k: "called a synchronizing" in str(msg) and sites.append(" <- ".join(
            f"{f.filename.rsplit('/', 2)[-1]}:{f.lineno}" for f in traceback.extract_stack()[::-1]
            if "/graphrt/" in f.filename)[:300])
        torch.cuda.set_sync_debug_mode("warn")
        try:
            assert eng._prefill(work)
        finally:
            torch.cuda.set_sync_debug_mode("default")
    return sites


def engine_over(llm, **kw):
    """A second Engine over the LLM's executor (its weights, pools and proposer; one engine runs
    at a time), with the LLM's stop ids and max_model_len; kw: Engine's options."""
    from graphrt.engine.engine import Engine
    e = llm.engine
    return Engine(llm.runtime, llm.tokenizer, eos_token_ids=tuple(e.scheduler.eos), max_model_len=e.max_model_len,
                  **kw)


def run_requests(eng, prompts, params, *, on_step=None, max_steps: int = 400) -> list:
    """Add each prompt with `params`, drive the engine until done -> their RequestOutputs."""
    streams = [eng.add_request(p, params) for p in prompts]
    drive(eng, max_steps=max_steps, on_step=on_step)
    return [s.result() for s in streams]


def assert_all_back(eng) -> None:
    """No work left and every page of the pool free, none referenced."""
    a = eng.scheduler.allocator
    assert a.num_free == a.num_pages and not eng.scheduler.has_work and not eng._pending
    assert all(a.refcount(p) == 0 for p in range(1, a.num_pages + 1))
