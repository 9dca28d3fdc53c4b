"""Test helper: drive an engine a bounded number of steps (a stuck request fails the test with
a message naming what is left, not by the suite's timeout)."""
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
