"""A speculation policy with its block k forced from a script (a test hook shared by the CPU and
GPU speculation tests)."""
from __future__ import annotations

from graphrt.speculative.policy import Decision, SpecPolicy, StepCosts


class ScriptedPolicy(SpecPolicy):
    """The real policy (injected costs; its choice and its per-slot measurements run as usual)
    with the block's k forced from a script: the test hook that makes every switch happen."""

    def __init__(self, script, ks, max_slots, buckets):
        costs = StepCosts(decode_us={b: 100.0 for b in buckets},
                          verify_us={b: {k + 1: 110.0 + 5 * k for k in ks} for b in buckets})
        super().__init__(costs, ks=ks, max_slots=max_slots)
        self.script, self.i, self.ran = script, 0, []

    def choose(self, slots, bucket):
        real = super().choose(slots, bucket)
        k = self.script[self.i % len(self.script)]
        self.i += 1
        self.ran.append(k)
        return Decision(k, (k,) * len(slots), real.slot_pref, real.tokens_per_us, real.plain_tokens_per_us, False)
