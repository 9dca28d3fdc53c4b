"""Never slower than no speculation: choose k (0 = plain decode) per block from measured numbers.

    costs = StepCosts(decode_us={1: 4800.0}, verify_us={1: {2: 5146.0, 3: 5182.0, 5: 5285.0}})
    policy = SpecPolicy(costs, ks=(1, 2, 4), max_slots=8)
    policy.admit(slot)                                    # a new request (acceptance unmeasured)
    d = policy.choose([0, 1], bucket=2)                   # Decision: d.k == 0 -> plain decode graph
    policy.observe(slot, proposed=8, accepted=5, rounds=4, k=d.k)     # after a spec block
    policy.observe_plain([0, 1])                          # after a plain block

The arithmetic (i.i.d. model, per-token acceptance a): a round with k proposals emits
E(a, k) = (1 - a^(k+1)) / (1 - a) tokens (k + 1 at a = 1) and costs
round_us(bucket, k) = verify_us[bucket][k + 1] + k * draft_us[bucket] + propose_us;
a plain decode step emits one token per slot in decode_us[bucket]. For the batch of slots S in
a bucket, speculation with k yields sum_s E(a_s, k) / round_us tokens per µs against
|S| / decode_us: the policy runs the k that maximises it, and plain decode unless some k beats
plain by `margin` (hysteresis: once on, it stays on while it is at least as fast; a newly
admitted request ends it, since its rows must pass the turn-on test, switch included). Every slot
then proposes up to k (a capped slot would only emit fewer tokens at the same cost); a slot's
own choice (`Decision.slot_pref`) is the same rule for it alone at this bucket's costs, which is
the decision itself at batch size 1.

Measurement: after a spec block with k proposals a round, a slot's accepted count A over R rounds
gives tokens per round T = 1 + A / R; the effective acceptance a_block solves E(a, k) = T (rounds
without a proposal count as rejections, so the fit reproduces what the slot got at this k).
a is an exponential average over rounds (weight 1 - (1 - ema)^R per block), starting from the
engine-wide acceptance weighted as `prior_rounds` rounds. The engine-wide acceptance (what a new
request's choices and `start_k` read until it measures) is a running mean of every slot's a_block
weighted by rounds, over at most 1 / start_ema rounds (50), starting from `prior` weighted as
`prior_rounds` rounds: a noisy block of one slot moves it by rounds / 50, not to its own value.
While the batch runs plain decode nothing is measured:
after `probe_every` plain blocks of a slot the next choice is a probe (the smallest k, one block);
a probe that still says "off" doubles that slot's interval (up to `probe_max`), so probing costs
at most (round_us(k_min) / decode_us - 1) / probe_every of the plain speed.

Realized costs: the graph costs leave out what a block costs around its graph (the engine's
bookkeeping of a round's variable tokens, a draft model's catch-up after plain blocks). The
engine reports each block's wall time per unit (`observe_wall(bucket, k, us)`: µs per round at
k, per step for k = 0, from the loop's cadence); once a (bucket, k) has one, the choice uses the
larger of it (an exponential average, weight `wall_ema`) and the graph cost, so a k whose blocks
run slower than their graphs stops being chosen. A k not yet run at a bucket is priced at its
graph cost times the largest wall / graph ratio measured for a speculative k there: what the
engine adds around a round applies to every k, and a graph cost alone makes an untried k look
cheaper than the tried ones (the engine-loop simulation, tests/speculative/_spec_sim.py, fell to
0.95x of plain through choices of an untried k = 4 near break-even). Host Python only (a few
µs per block), one owner of the per-slot state; decisions are pure functions tested on CPU.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache
from typing import Mapping, NamedTuple, Sequence


def expected_tokens(a: float, k: int) -> float:
    """E[tokens per round] = 1 + a + ... + a^k for per-token acceptance a in [0, 1]."""
    return float(k + 1) if a >= 1.0 else (1.0 - a ** (k + 1)) / (1.0 - a)


@lru_cache(maxsize=4096)     # a pure function of (accepted / rounds, k): a block's counts repeat
def fit_acceptance(tokens_per_round: float, k: int) -> float:
    """The a in [0, 1] with expected_tokens(a, k) == tokens_per_round (clipped to [1, k + 1])."""
    if k < 1:
        raise ValueError(f"k: must be >= 1 to fit an acceptance rate, got {k}")
    t = min(max(tokens_per_round, 1.0), k + 1.0)
    lo, hi = 0.0, 1.0
    for _ in range(40):                                   # E is increasing in a
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if expected_tokens(mid, k) < t else (lo, mid)
    return 0.5 * (lo + hi)


def _positive(name: str, value) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ValueError(f"{name}: must be a number > 0, got {value!r}")
    return float(value)


@dataclass(frozen=True)
class StepCosts:
    """Measured device µs per bucket (batch size of the captured graph): decode_us[b] one plain
    decode step; verify_us[b][q] one target verify of q = k + 1 tokens per slot; draft_us[b] one
    draft-model step (method "draft"; empty for n-gram); propose_us the proposer's work a round;
    draft_prefill_us: a draft model's prefill per prompt token (0: none, or not measured), what a
    row whose draft prefill was skipped owes its first spec block (SpecPolicy.owe)."""

    decode_us: Mapping[int, float]
    verify_us: Mapping[int, Mapping[int, float]]
    draft_us: Mapping[int, float] = field(default_factory=dict)
    propose_us: float = 0.0
    draft_prefill_us: float = 0.0

    def __post_init__(self) -> None:
        if not self.decode_us:
            raise ValueError("decode_us: needs at least one bucket")
        for b, us in self.decode_us.items():
            _positive(f"decode_us[{b}]", us)
            if b not in self.verify_us or not self.verify_us[b]:
                raise ValueError(f"verify_us: bucket {b} has a decode cost but no verify costs")
            for q, v in self.verify_us[b].items():
                if isinstance(q, bool) or not isinstance(q, int) or q < 2:
                    raise ValueError(f"verify_us[{b}]: query lengths must be ints >= 2, got {q!r}")
                _positive(f"verify_us[{b}][{q}]", v)
        for b, us in self.draft_us.items():
            _positive(f"draft_us[{b}]", us)
        for name in ("propose_us", "draft_prefill_us"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 <= v < float("inf"):
                raise ValueError(f"{name}: must be a finite number >= 0, got {v!r}")

    def ks(self, bucket: int) -> tuple[int, ...]:
        """The k values with a measured verify cost at this bucket."""
        return tuple(sorted(q - 1 for q in self._verify(bucket)))

    def _verify(self, bucket: int) -> Mapping[int, float]:
        if bucket not in self.verify_us:
            raise ValueError(f"bucket: {bucket} has no measured costs (have {sorted(self.verify_us)})")
        return self.verify_us[bucket]

    def round_us(self, bucket: int, k: int) -> float:
        """One speculative round with k proposals a slot: verify(k + 1) + k draft steps + proposer."""
        verify = self._verify(bucket)
        if k + 1 not in verify:
            raise ValueError(f"k: {k} has no verify cost at bucket {bucket} (q = k + 1 in {sorted(verify)})")
        return verify[k + 1] + k * self.draft_us.get(bucket, 0.0) + self.propose_us

    def step_us(self, bucket: int) -> float:
        if bucket not in self.decode_us:
            raise ValueError(f"bucket: {bucket} has no measured decode cost (have {sorted(self.decode_us)})")
        return self.decode_us[bucket]

    @classmethod
    def from_bench(cls, rows: Sequence[Mapping], model: str, *, draft: str | None = None,
                   propose_us: float = 0.0) -> "StepCosts":
        """From tools/bench_spec.py part-1 rows ({"model", "batch", "decode_us", "verify_us":
        {q: µs}}): the target `model`'s costs; with `draft`, that model's decode step as draft_us."""
        mine = {r["batch"]: r for r in rows if r["model"] == model}
        if not mine:
            raise ValueError(f"model: no rows for {model!r} (have {sorted({r['model'] for r in rows})})")
        drafts = {r["batch"]: r["decode_us"] for r in rows if draft is not None and r["model"] == draft}
        if draft is not None and set(drafts) != set(mine):
            raise ValueError(f"draft: {draft!r} rows cover batches {sorted(drafts)}, need {sorted(mine)}")
        return cls(decode_us={b: r["decode_us"] for b, r in mine.items()},
                   verify_us={b: {int(q): v for q, v in r["verify_us"].items() if int(q) >= 2}
                              for b, r in mine.items()},
                   draft_us=drafts, propose_us=propose_us)


class RealizedCosts:
    """StepCosts with each (bucket, k) cost raised to its realized wall time where measured
    (wall[(bucket, k)]: µs per round at k >= 1, per step at k = 0); a speculative k without one
    at a bucket where other ks have one is raised by their largest wall / graph ratio. The same
    step_us / round_us / ks / decode_us interface as StepCosts."""

    def __init__(self, base: StepCosts, wall: Mapping[tuple[int, int], float]):
        self.base, self.wall = base, wall
        self.decode_us = base.decode_us

    def ks(self, bucket: int) -> tuple[int, ...]:
        return self.base.ks(bucket)

    def step_us(self, bucket: int) -> float:
        return max(self.base.step_us(bucket), self.wall.get((bucket, 0), 0.0))

    def round_us(self, bucket: int, k: int) -> float:
        base = self.base.round_us(bucket, k)
        wall = self.wall.get((bucket, k))
        if wall is None:                  # unmeasured: the bucket's measured spec ks' wall / graph ratio
            ratios = [us / self.base.round_us(b, kk) for (b, kk), us in self.wall.items() if b == bucket and kk]
            return base * max([1.0] + ratios)
        return max(base, wall)


class Decision(NamedTuple):
    """k: proposals a round for this block (0 = run the plain decode graph); slot_k: the cap on
    each slot's proposals (same order as the slots asked about): k for every slot, because in a
    graph of fixed shape a proposal costs nothing and a capped slot can only emit fewer tokens;
    slot_pref: each slot's own choice were it alone at these costs (what a request "wants", for
    stats); tokens_per_us: expected batch rate of the choice; plain_tokens_per_us: the rate of
    plain decode; probe: k > 0 only to re-measure."""
    k: int
    slot_k: tuple[int, ...]
    slot_pref: tuple[int, ...]
    tokens_per_us: float
    plain_tokens_per_us: float
    probe: bool


def batch_rate(accepts: Sequence[float], costs: StepCosts, bucket: int, k: int) -> float:
    """Expected tokens per µs of the batch: plain decode (k = 0) or speculation with k."""
    if k == 0:
        return len(accepts) / costs.step_us(bucket)
    return sum(expected_tokens(a, k) for a in accepts) / costs.round_us(bucket, k)


def best_k(accepts: Sequence[float], costs: StepCosts, bucket: int, ks: Sequence[int], *,
           margin: float = 0.0) -> tuple[int, float]:
    """The pure decision: (k, its rate) maximising batch_rate over {0} and ks; a k > 0 must beat
    plain decode by the factor 1 + margin; ties go to the smaller k."""
    plain = batch_rate(accepts, costs, bucket, 0)
    best, rate = 0, plain
    for k in sorted(ks):
        r = batch_rate(accepts, costs, bucket, k)
        if r > rate and r >= plain * (1.0 + margin):
            best, rate = k, r
    return best, rate


@dataclass
class _Slot:
    accept: float               # effective per-token acceptance (EMA)
    measured_rounds: int        # rounds observed so far
    plain_blocks: int = 0       # plain blocks since the last measurement
    interval: int = 0           # plain blocks before the next probe
    owed_us: float = 0.0        # its draft's prefill, skipped at admission: paid by its first spec block


class SpecPolicy:
    """Per-slot acceptance state and the per-block choice. costs: StepCosts; ks: the k values
    the runner can run (graphs captured); max_slots: slot ids are in [0, max_slots)."""

    def __init__(self, costs: StepCosts, *, ks: Sequence[int], max_slots: int, prior: float = 0.5,
                 prior_rounds: int = 2, ema: float = 0.1, margin: float = 0.02,
                 probe_every: int = 8, probe_max: int = 64, wall_ema: float = 0.25,
                 rounds: int = 4, steps: int = 4, probe_budget: float = 0.01, start_ema: float = 0.02,
                 prior_trusted: bool = True):
        if not isinstance(costs, StepCosts):
            raise TypeError(f"costs: expected a StepCosts, got {type(costs).__name__}")
        ks = tuple(sorted(set(ks)))
        if not ks or any(isinstance(k, bool) or not isinstance(k, int) or k < 1 for k in ks):
            raise ValueError(f"ks: expected ints >= 1, got {ks}")
        for name, v, lo, hi in (("prior", prior, 0.0, 1.0), ("ema", ema, 1e-6, 1.0),
                                ("margin", margin, 0.0, 10.0), ("wall_ema", wall_ema, 1e-6, 1.0),
                                ("probe_budget", probe_budget, 0.0, 1.0), ("start_ema", start_ema, 0.0, 1.0)):
            if not (isinstance(v, (int, float)) and lo <= v <= hi):
                raise ValueError(f"{name}: must be in [{lo}, {hi}], got {v!r}")
        for name, v in (("max_slots", max_slots), ("prior_rounds", prior_rounds),
                        ("probe_every", probe_every), ("probe_max", probe_max), ("rounds", rounds),
                        ("steps", steps)):
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name}: must be an int >= 1, got {v!r}")
        if not isinstance(prior_trusted, bool):
            raise ValueError(f"prior_trusted: expected a bool, got {prior_trusted!r}")
        if probe_max < probe_every:
            raise ValueError(f"probe_max: {probe_max} is below probe_every={probe_every}")
        self.graph_costs, self.ks, self.max_slots = costs, ks, max_slots
        self.wall_ema, self._wall = wall_ema, {}
        self.costs = RealizedCosts(costs, self._wall)     # what every choice reads
        self.prior, self.prior_rounds, self.ema, self.margin = prior, prior_rounds, ema, margin
        self.probe_every, self.probe_max = probe_every, probe_max
        self.rounds, self.steps, self.probe_budget, self.start_ema = rounds, steps, probe_budget, start_ema
        self._switch: dict[int, float] = {}   # bucket -> µs a plain -> spec switch costs (EMA)
        self._credit = 0.0                    # µs of probing the plain blocks so far have paid for
        self._start = prior                   # engine-wide acceptance: a new slot's choices until it measures
        self._start_w = float(prior_rounds)   # rounds behind it (a running mean over at most 1 / start_ema)
        self._slots: dict[int, _Slot] = {}
        self.prior_trusted = prior_trusted   # False: until a round is measured, rows start plain
        self._measured = 0                   # rounds observed engine-wide
        self._on = False                  # the last choice ran speculation (hysteresis)
        self._min_bucket = min(costs.decode_us)
        self._bucket_ks: dict[int, tuple[int, ...]] = {}   # bucket -> _ks (graph costs are frozen)
        self._tables: dict[int, tuple] = {}   # bucket -> (step_us, {k: round_us}) at self.costs;
        #                                       cleared by observe_wall (the realized costs moved)

    # ---- per-slot state -------------------------------------------------------------------------
    def _check(self, slot: int) -> None:
        if isinstance(slot, bool) or not isinstance(slot, int) or not 0 <= slot < self.max_slots:
            raise ValueError(f"slot: must be an int in [0, {self.max_slots}), got {slot!r}")

    def _state(self, slot: int) -> _Slot:
        self._check(slot)
        if slot not in self._slots:
            raise ValueError(f"slot: {slot} was not admitted")
        return self._slots[slot]

    def admit(self, slot: int) -> None:
        """A new request in `slot`: its acceptance starts at the engine-wide estimate (worth
        prior_rounds rounds); the hysteresis ends (the next spec block must pass the turn-on
        test: the new row's draft, if any, needs a catch-up or was prefilled for it)."""
        self._check(slot)
        self._slots[slot] = _Slot(self._start, 0, 0, self.probe_every)
        self._on = False                  # a new row: speculating again must pass the turn-on test

    def release(self, slot: int) -> None:
        self._check(slot)
        self._slots.pop(slot, None)

    def acceptance(self, slot: int) -> float:
        """The slot's current effective per-token acceptance estimate."""
        return self._state(slot).accept

    def observe(self, slot: int, *, proposed: int, accepted: int, rounds: int, k: int) -> None:
        """After a spec block in which the slot could propose k a round (its cap; 0 = it did not
        speculate, counted as a plain block): its proposals made, proposals accepted and rounds in
        which it emitted (host ints)."""
        s = self._state(slot)
        if k == 0:
            s.plain_blocks += 1
            return
        # called per slot and block: one fast test, the per-field check only to name what is wrong
        if not (type(proposed) is int and type(accepted) is int and type(rounds) is int
                and proposed >= 0 and accepted >= 0 and rounds >= 0):
            for name, v in (("proposed", proposed), ("accepted", accepted), ("rounds", rounds)):
                if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                    raise ValueError(f"{name}: must be an int >= 0, got {v!r}")
        if accepted > proposed or accepted > rounds * k:
            raise ValueError(f"accepted: {accepted} exceeds proposed={proposed} or rounds * k={rounds * k}")
        if k not in self.ks:
            raise ValueError(f"k: {k} is not one of the policy's ks {self.ks}")
        s.owed_us = 0.0                                   # the block's catch-up prefilled its draft
        if rounds == 0:
            return
        self._measured += rounds
        a_block = fit_acceptance(1.0 + accepted / rounds, k)
        self._start_w = min(self._start_w + rounds, 1.0 / self.start_ema) if self.start_ema else self._start_w + rounds
        self._start += rounds / self._start_w * (a_block - self._start)
        if s.measured_rounds == 0:                        # the prior counts as prior_rounds rounds
            w = rounds / (rounds + self.prior_rounds)
        else:
            w = 1.0 - (1.0 - self.ema) ** rounds
        s.accept += w * (a_block - s.accept)
        s.measured_rounds += rounds
        was_probe = s.plain_blocks >= s.interval
        s.plain_blocks = 0
        if self._alone(s.accept) == 0:
            s.interval = min(self.probe_max, 2 * s.interval) if was_probe else s.interval
        else:
            s.interval = self.probe_every

    def observe_plain(self, slots: Sequence[int]) -> None:
        """A plain decode block ran for these slots (nothing measured: counts toward a probe)."""
        for slot in slots:
            self._state(slot).plain_blocks += 1

    def owe(self, slot: int, us: float) -> None:
        """The slot's draft prefill was skipped at admission (start_k said plain) and would cost
        `us` µs: charged to the first probe or turn-on that includes the slot, on top of the
        measured switch (a catch-up), until a spec block of the slot pays it."""
        if isinstance(us, bool) or not isinstance(us, (int, float)) or not 0 <= us < float("inf"):
            raise ValueError(f"us: must be a finite number >= 0, got {us!r}")
        self._state(slot).owed_us += float(us)

    def observe_wall(self, bucket: int, k: int, us: float) -> None:
        """A block at `bucket` with k proposals a round (0: plain) took `us` µs of wall time per
        round (per step for k = 0), host work and a draft's catch-up included."""
        if isinstance(bucket, bool) or not isinstance(bucket, int) or bucket not in self.graph_costs.decode_us:
            raise ValueError(f"bucket: {bucket!r} has no measured costs (have {sorted(self.graph_costs.decode_us)})")
        if isinstance(k, bool) or not isinstance(k, int) or (k != 0 and k not in self.ks):
            raise ValueError(f"k: {k!r} is neither 0 nor one of the policy's ks {self.ks}")
        us = _positive("us", us)
        old = self._wall.get((bucket, k))
        self._wall[(bucket, k)] = us if old is None else old + self.wall_ema * (us - old)
        self._tables.clear()

    def observe_switch(self, bucket: int, us: float) -> None:
        """A plain -> spec switch at `bucket` cost `us` µs of wall beyond the spec block (a draft's
        catch-up after plain blocks: its stream drain and eager prefill); an exponential average
        (weight `wall_ema`), charged to every probe and to turning speculation back on."""
        if isinstance(bucket, bool) or not isinstance(bucket, int) or bucket not in self.graph_costs.decode_us:
            raise ValueError(f"bucket: {bucket!r} has no measured costs (have {sorted(self.graph_costs.decode_us)})")
        if isinstance(us, bool) or not isinstance(us, (int, float)) or not us >= 0 or us == float("inf"):
            raise ValueError(f"us: must be a finite number >= 0, got {us!r}")
        old = self._switch.get(bucket)
        self._switch[bucket] = float(us) if old is None else old + self.wall_ema * (us - old)

    def switch_us(self, bucket: int) -> float:
        """The averaged µs of a plain -> spec switch at `bucket` (0 before any was measured)."""
        return self._switch.get(bucket, 0.0)

    def start_k(self, bucket: int) -> int:
        """The k a new request would run alone at `bucket` (0: it starts on plain decode; the
        engine then need not prefill its draft), from the engine-wide acceptance. Starting on
        speculation costs the draft's prefill; once a switch has been measured (observe_switch:
        a catch-up, of the order of that prefill) the start must pay it back over the same horizon
        as turning speculation on in `choose` (probe_every blocks of `rounds` rounds), else 0: near
        break-even a draft prefill per request costs more than speculation gains."""
        if not (self.prior_trusted or self._measured):
            return 0                                     # nothing measured: plain until a probe pays
        ks = self._ks(bucket)
        k, rate = best_k([self._start], self.costs, bucket, ks, margin=self.margin)
        switch = self._switch.get(bucket)
        if k and switch:
            step, round_us = self._table(bucket, ks)
            if self.probe_every * self.rounds * round_us[k] * (1.0 - (1.0 / step) / rate) < switch:
                return 0
        return k

    def realized_us(self, bucket: int, k: int) -> float | None:
        """The averaged wall µs per round (k >= 1) or per step (k = 0), None before any block."""
        return self._wall.get((bucket, k))

    # ---- the choice -----------------------------------------------------------------------------
    def _alone(self, a: float, bucket: int | None = None) -> int:
        """best_k([a], self.costs, bucket, ks, margin)'s k (the same arithmetic, from the table)."""
        b = self._min_bucket if bucket is None else bucket
        ks = self._ks(b)
        step, round_us = self._table(b, ks)
        plain = 1 / step
        best, rate = 0, plain
        for k in ks:
            r = expected_tokens(a, k) / round_us[k]
            if r > rate and r >= plain * (1.0 + self.margin):
                best, rate = k, r
        return best

    def _ks(self, bucket: int) -> tuple[int, ...]:
        ks = self._bucket_ks.get(bucket)
        if ks is not None:
            return ks
        have = set(self.costs.ks(bucket))
        ks = tuple(k for k in self.ks if k in have)
        if not ks:
            raise ValueError(f"bucket: {bucket} has verify costs for k in {sorted(have)}, none of ks {self.ks}")
        self._bucket_ks[bucket] = ks
        return ks

    def _table(self, bucket: int, ks: tuple[int, ...]) -> tuple[float, dict]:
        """(step_us, {k: round_us}) at `bucket` from self.costs, kept until the next observe_wall."""
        t = self._tables.get(bucket)
        if t is None:
            t = self._tables[bucket] = (self.costs.step_us(bucket), {k: self.costs.round_us(bucket, k) for k in ks})
        return t

    def choose(self, slots: Sequence[int], bucket: int) -> Decision:
        """The k for the next block over `slots` (the active slots, run in a graph of `bucket`)."""
        if not slots:
            raise ValueError("slots: need at least one active slot")
        if isinstance(bucket, bool) or not isinstance(bucket, int) or bucket < len(slots):
            raise ValueError(f"bucket: must be an int >= len(slots)={len(slots)}, got {bucket!r}")
        states = [self._state(s) for s in slots]
        start = self._start if (self.prior_trusted or self._measured) else 0.0
        accepts = [s.accept if s.measured_rounds else start for s in states]
        switch = self._switch.get(bucket, 0.0) + sum(s.owed_us for s in states)
        ks = self._ks(bucket)
        # batch_rate / best_k's arithmetic, each slot's expected tokens and each cost computed once
        step, round_us = self._table(bucket, ks)
        tokens = {kk: [expected_tokens(a, kk) for a in accepts] for kk in ks}   # per slot
        plain = len(accepts) / step
        k, rate, margin = 0, plain, 0.0 if self._on else self.margin
        for kk in ks:
            r = sum(tokens[kk]) / round_us[kk]
            if r > rate and r >= plain * (1.0 + margin):
                k, rate = kk, r
        if k and not self._on and switch:                 # turning on pays its switch back
            gain = self.probe_every * self.rounds * round_us[k] * (1.0 - plain / rate)
            if gain < switch:
                k, rate = 0, plain
        pref = []                                         # each slot's best_k alone
        one, bar = 1 / step, (1 / step) * (1.0 + self.margin)
        for i in range(len(accepts)):
            best, top = 0, one
            for kk in ks:
                r = tokens[kk][i] / round_us[kk]
                if r > top and r >= bar:
                    best, top = kk, r
            pref.append(best)
        pref = tuple(pref)
        probe = False
        if k == 0:
            self._credit += self.probe_budget * self.steps * step
            if any(s.plain_blocks >= s.interval for s in states):
                r = sum(tokens[ks[0]]) / round_us[ks[0]]
                cost = switch + max(0.0, self.rounds * round_us[ks[0]]
                                                    * (1.0 - r / plain))
                if self._credit >= cost:                      # probing stays within its budget
                    self._credit -= cost
                    probe, k, rate = True, ks[0], r
        self._on = k > 0 and not probe
        return Decision(k, (k,) * len(slots), pref, rate, plain, probe)


__all__ = ["StepCosts", "RealizedCosts", "SpecPolicy", "Decision", "expected_tokens", "fit_acceptance",
           "batch_rate", "best_k"]
