"""The speculation policy (speculative/policy.py): the round arithmetic, k up on high acceptance,
off on zero acceptance, recovery by probing, the batch choice, and a simulated stream that is
never slower than plain decode (i.i.d. acceptance drawn from a seeded generator)."""
from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from graphrt.engine import speculation
from graphrt.speculative.policy import (SpecPolicy, StepCosts, batch_rate, best_k, expected_tokens,
                                        fit_acceptance)

BENCH = Path(__file__).resolve().parents[2] / "docs" / "results" / "bench_spec_h200.json"


def _costs_8b() -> StepCosts:
    """The measured H200 costs of part 1 (Llama-3.1-8B shape; 1B shape as the draft)."""
    rows = json.loads(BENCH.read_text())["models"]
    return StepCosts.from_bench(rows, "llama-3.1-8b")


def test_round_arithmetic():
    assert expected_tokens(0.0, 4) == 1.0
    assert expected_tokens(1.0, 4) == 5.0
    assert expected_tokens(0.5, 2) == pytest.approx(1.75)
    for a in (0.0, 0.13, 0.5, 0.77, 0.99):
        for k in (1, 3, 7):
            assert fit_acceptance(expected_tokens(a, k), k) == pytest.approx(a, abs=1e-6)
    assert fit_acceptance(0.5, 3) == pytest.approx(0.0) and fit_acceptance(9.0, 3) == pytest.approx(1.0)


def test_costs_from_the_measured_bench():
    c = _costs_8b()
    assert c.ks(1) == (1, 2, 3, 4, 5, 6, 7)
    assert c.round_us(1, 4) == pytest.approx(c.verify_us[1][5])
    rows = json.loads(BENCH.read_text())["models"]
    d = StepCosts.from_bench(rows, "llama-3.1-8b", draft="llama-3.2-1b")
    assert d.round_us(4, 2) == pytest.approx(d.verify_us[4][3] + 2 * d.draft_us[4])


def _policy(costs=None, **kw):
    return SpecPolicy(costs or _costs_8b(), ks=(1, 2, 3, 4, 5, 6, 7), max_slots=16, **kw)


def test_high_acceptance_moves_k_up():
    pol = _policy()
    pol.admit(0)
    first = pol.choose([0], 1)
    assert first.k > 0 and not first.probe               # the prior speculates, to measure
    for _ in range(10):                                   # every proposal accepted at k = 1
        pol.observe(0, proposed=4, accepted=4, rounds=4, k=1)
    d = pol.choose([0], 1)
    assert d.k == 7 and d.slot_k == (7,) and d.slot_pref == (7,)
    assert d.tokens_per_us > 3 * d.plain_tokens_per_us
    assert pol.acceptance(0) > 0.9


def test_zero_acceptance_turns_speculation_off_then_probing_brings_it_back():
    pol = _policy(probe_every=4, probe_max=16)
    pol.admit(3)
    blocks_on = 0
    while pol.choose([3], 1).k > 0:
        blocks_on += 1
        assert blocks_on < 8, "still speculating after 8 blocks of zero acceptance"
        pol.observe(3, proposed=4 * 4, accepted=0, rounds=4, k=4)
    # off: plain blocks until the probe is due
    for i in range(4):
        d = pol.choose([3], 1)
        assert d.k == 0 and d.slot_k == (0,) and d.slot_pref == (0,) and not d.probe, i
        pol.observe_plain([3])
    d = pol.choose([3], 1)
    assert d.probe and d.k == 1                           # the cheapest k re-measures
    pol.observe(3, proposed=4, accepted=0, rounds=4, k=1)  # the probe finds nothing ...
    for _ in range(8):                                     # ... so the next one waits twice as long
        assert pol.choose([3], 1).k == 0
        pol.observe_plain([3])
    d = pol.choose([3], 1)
    assert d.probe
    for _ in range(2):                                     # the text turned repetitive: recovery
        pol.observe(3, proposed=4, accepted=4, rounds=4, k=d.k)
        d = pol.choose([3], 1)
    assert d.k > 1 and not d.probe


def test_batch_choice_weighs_every_slot():
    c = _costs_8b()
    # bs 4: one copying request pays for the verify of four (4.9 tokens / 1.087 step costs) ...
    assert best_k([0.9, 0.0, 0.0, 0.0], c, 4, c.ks(4))[0] > 0
    # ... a weak one does not
    assert best_k([0.2, 0.0, 0.0, 0.0], c, 4, c.ks(4))[0] == 0
    pol = _policy()
    for s, (acc, rounds) in enumerate([(16, 4), (0, 4), (0, 4), (0, 4)]):
        pol.admit(s)
        for _ in range(12):
            pol.observe(s, proposed=16, accepted=acc, rounds=rounds, k=4)
    d = pol.choose([0, 1, 2, 3], 4)
    assert d.k > 0 and d.slot_k == (d.k,) * 4
    assert d.slot_pref[0] > 0 and d.slot_pref[1:] == (0, 0, 0)
    assert d.tokens_per_us == pytest.approx(batch_rate([pol.acceptance(s) for s in range(4)], c, 4, d.k))
    assert d.tokens_per_us > d.plain_tokens_per_us


def test_margin_and_hysteresis():
    c = StepCosts(decode_us={1: 100.0}, verify_us={1: {2: 110.0}})
    # k = 1 at a = 0.105 is 0.5% faster than plain: below the 2% margin to switch on
    assert best_k([0.1055], c, 1, (1,), margin=0.02)[0] == 0
    assert best_k([0.1055], c, 1, (1,), margin=0.0)[0] == 1
    assert best_k([0.2], c, 1, (1,), margin=0.02)[0] == 1


def _simulate(pol, costs, a_true, blocks=300, rounds=4, steps=4, seed=0):
    """One request, i.i.d. per-token acceptance a_true: tokens per µs the policy achieves."""
    rng = random.Random(seed)
    pol.admit(0)
    tokens = us = 0.0
    for _ in range(blocks):
        d = pol.choose([0], 1)
        if d.k == 0:
            tokens, us = tokens + steps, us + steps * costs.step_us(1)
            pol.observe_plain([0])
            continue
        acc = 0
        for _ in range(rounds):
            j = 0
            while j < d.k and rng.random() < a_true:
                j += 1
            acc += j
        tokens, us = tokens + rounds + acc, us + rounds * costs.round_us(1, d.k)
        pol.observe(0, proposed=rounds * d.k, accepted=acc, rounds=rounds, k=d.k)
    pol.release(0)
    return tokens / us


@pytest.mark.parametrize("a_true", [0.0, 0.05, 0.3, 0.6, 0.9])
def test_simulated_stream_is_never_slower_than_plain_and_near_the_best_fixed_k(a_true):
    c = _costs_8b()
    plain = 1.0 / c.step_us(1)
    got = _simulate(_policy(), c, a_true)
    best_fixed = max(expected_tokens(a_true, k) / c.round_us(1, k) for k in c.ks(1))
    assert got >= 0.97 * plain, (got / plain)
    assert got >= 0.9 * max(plain, best_fixed), (got / max(plain, best_fixed))


def test_bad_input_names_the_field():
    with pytest.raises(ValueError, match="decode_us"):
        StepCosts(decode_us={1: 0.0}, verify_us={1: {2: 1.0}})
    with pytest.raises(ValueError, match="verify_us"):
        StepCosts(decode_us={1: 1.0}, verify_us={})
    with pytest.raises(ValueError, match=r"verify_us\[1\]"):
        StepCosts(decode_us={1: 1.0}, verify_us={1: {1: 1.0}})
    c = StepCosts(decode_us={1: 1.0}, verify_us={1: {2: 1.1}})
    with pytest.raises(ValueError, match="ks"):
        SpecPolicy(c, ks=(), max_slots=2)
    with pytest.raises(ValueError, match="prior"):
        SpecPolicy(c, ks=(1,), max_slots=2, prior=1.5)
    with pytest.raises(TypeError, match="costs"):
        SpecPolicy({"decode_us": {}}, ks=(1,), max_slots=2)
    pol = SpecPolicy(c, ks=(1,), max_slots=2)
    with pytest.raises(ValueError, match="slot"):
        pol.admit(2)
    with pytest.raises(ValueError, match="not admitted"):
        pol.choose([0], 1)
    pol.admit(0)
    with pytest.raises(ValueError, match="accepted"):
        pol.observe(0, proposed=2, accepted=3, rounds=4, k=1)
    with pytest.raises(ValueError, match="k"):
        pol.observe(0, proposed=2, accepted=1, rounds=4, k=3)
    with pytest.raises(ValueError, match="bucket"):
        pol.choose([0], 2)
    with pytest.raises(ValueError, match="rounds"):
        pol.observe(0, proposed=2, accepted=1, rounds=-1, k=1)


def test_a_slot_that_did_not_speculate_counts_toward_its_probe():
    pol = _policy(probe_every=2, probe_budget=1.0)       # a budget that pays for any probe
    pol.admit(0)
    for _ in range(6):
        pol.observe(0, proposed=16, accepted=0, rounds=4, k=4)
    assert pol.choose([0], 1).k == 0
    pol.observe(0, proposed=0, accepted=0, rounds=4, k=0)     # capped off in a spec block
    pol.observe_plain([0])
    d = pol.choose([0], 1)
    assert d.probe and d.k == 1


def test_k_steps_down_then_off_as_acceptance_falls_and_back_up():
    """Over the captured ks (1, 2, 4): high acceptance runs 4, middling 2, low 1, near zero plain
    decode; a slot's measured rounds move it along that ladder both ways."""
    c = StepCosts(decode_us={1: 100.0}, verify_us={1: {2: 105.0, 3: 115.0, 5: 160.0}})
    ks = (1, 2, 4)
    assert [best_k([a], c, 1, ks, margin=0.02)[0] for a in (0.9, 0.6, 0.1, 0.02)] == [4, 2, 1, 0]
    pol = SpecPolicy(c, ks=ks, max_slots=1, prior=0.9, prior_rounds=20, ema=0.1)
    pol.admit(0)
    assert pol.choose([0], 1).k == 4
    seen = []
    k = 4
    for _ in range(12):                                   # nothing accepted: down, then off
        pol.observe(0, proposed=4 * k, accepted=0, rounds=4, k=k)
        k = pol.choose([0], 1).k
        seen.append(k)
        if k == 0:
            break
    assert seen[0] == 2 and 1 in seen and seen[-1] == 0, seen
    for _ in range(8):                                    # everything accepted (probes at k = 1)
        pol.observe(0, proposed=4, accepted=4, rounds=4, k=1)
    assert pol.choose([0], 1).k == 4


def test_realized_wall_costs_turn_a_k_off_whose_blocks_run_slower_than_their_graphs():
    """A draft round whose graph looks cheap but whose blocks take longer on the wall (host work,
    catch-up): once the engine reports it, the choice is plain; a realized cost below the graph
    cost never lowers it; bad reports are refused naming the field."""
    c = StepCosts(decode_us={1: 470.0}, verify_us={1: {2: 500.0}}, draft_us={1: 120.0})
    pol = SpecPolicy(c, ks=(1,), max_slots=2, prior=0.47, prior_rounds=1000)
    pol.admit(0)
    assert pol.choose([0], 1).k == 1                      # 1.47 / 620 beats 1 / 470 by graph costs
    pol.observe_wall(1, 0, 300.0)                         # below the graph's 470: no effect
    assert pol.costs.step_us(1) == 470.0
    pol.observe_wall(1, 1, 1600.0)                        # what the k = 1 blocks really took per round
    assert pol.realized_us(1, 1) == 1600.0 and pol.costs.round_us(1, 1) == 1600.0
    assert pol.graph_costs.round_us(1, 1) == pytest.approx(620.0)
    assert pol.choose([0], 1).k == 0
    pol.observe_wall(1, 1, 400.0)                         # an exponential average (weight 0.25)
    assert pol.realized_us(1, 1) == pytest.approx(1600.0 + 0.25 * (400.0 - 1600.0))
    for bad, field in (((2, 1, 10.0), "bucket"), ((1, 3, 10.0), "k"), ((1, 1, -1.0), "us"),
                       ((1, 0, float("nan")), "us")):
        with pytest.raises(ValueError, match=field):
            pol.observe_wall(*bad)


class _Seen:
    def __init__(self, steady=None):
        self.calls, self.switches, self.steady = [], [], steady

    def observe_wall(self, bucket, k, us):
        self.calls.append((bucket, k, us))

    def realized_us(self, bucket, k):
        return self.steady

    def observe_switch(self, bucket, us):
        self.switches.append((bucket, us))


def _ticks(*ms):
    it = iter(ms)
    return lambda: next(it) / 1e3


def test_block_clock_under_overlap_charges_only_steady_intervals_to_the_block_waited_for():
    """engine/speculation.BlockClock, depth 1: the interval from launch N to N + 1 is block
    N - 1's; it is charged only when blocks N - 2, N - 1 and N share (bucket, k): a plain block
    after spec blocks is not charged the spec tail (what inflated the H200's 1:0 wall to 615 µs
    a step against ~490), nor a plain block the catch-up of the switch launched after it."""
    pol = _Seen()
    clock = speculation.BlockClock(now=_ticks(0, 4, 8, 12, 14, 16, 18, 20, 22, 30), depth=1)
    for k in (2, 2, 2, 0, 0, 0, 0, 0, 1, 1):                  # spec, then plain, then a switch
        clock.launched(pol, 4, k, 4)
    assert [(b, k, round(us)) for b, k, us in pol.calls] == [(4, 2, 1000), (4, 0, 500), (4, 0, 500),
                                                             (4, 0, 500)]   # not 22 -> 30: the switch
    clock.interrupted()                                        # a prefill: the blocks before it too
    pol.calls.clear()
    clock2 = speculation.BlockClock(now=_ticks(0, 1, 2, 3), depth=1)
    for k in (0, 0, 0, 0):
        clock2.launched(pol, 4, k, 4)
    assert [(k, us) for _, k, us in pol.calls] == [(0, 250.0)]   # from the 4th launch on
    with pytest.raises(ValueError, match="depth"):
        speculation.BlockClock(depth=2)


def test_block_clock_reports_a_switch_cost_and_totals_only_charged_intervals():
    """The interval that launched a plain -> spec switch, less the steady wall of the plain block
    it waited for, is told to observe_switch (the draft's catch-up); wall_s / graph_s total
    the charged intervals at wall and graph cost; depth 0 charges each block its own interval."""
    pol = _Seen(steady=500.0)
    clock = speculation.BlockClock(now=_ticks(0, 2, 4, 6, 13), depth=1)
    for k in (0, 0, 0, 1, 1):                                  # the switch launched at 6 ms: 6 -> 13
        clock.launched(pol, 1, k, 4)
    assert pol.switches == [(1, pytest.approx(7000.0 - 4 * 500.0))]
    costs = StepCosts(decode_us={4: 100.0}, verify_us={4: {3: 150.0}}, draft_us={4: 20.0})
    real = SpecPolicy(costs, ks=(2,), max_slots=4)
    c0 = speculation.BlockClock(now=_ticks(0, 2, 3, 10, 11), depth=0)
    for k in (2, 2, 0, 0, 0):
        c0.launched(real, 4, k, 4)
    assert real.realized_us(4, 2) == pytest.approx(250.0) and real.realized_us(4, 0) == pytest.approx(250.0)
    assert c0.wall_s == pytest.approx(0.002)                   # 2 -> 3 (k = 2) and 10 -> 11 (plain)
    assert c0.graph_s == pytest.approx((4 * costs.round_us(4, 2) + 4 * 100.0) / 1e6)
    assert speculation.spec_stats({"proposed": 0, "accepted": 0, "rounds": 0, "emitted": 0, "blocks": 0,
                                   "plain_blocks": 0}, c0)["spec_block_wall_s"] == c0.wall_s


def test_wall_ema_out_of_range_is_refused():
    c = StepCosts(decode_us={1: 470.0}, verify_us={1: {2: 500.0}})
    for bad in (0.0, 1.5, "x"):
        with pytest.raises(ValueError, match="wall_ema"):
            SpecPolicy(c, ks=(1,), max_slots=2, wall_ema=bad)


def test_probes_stay_within_their_budget_and_pay_for_the_switch():
    """A probe is due every probe_every plain blocks but runs only once the plain blocks have
    paid for it (probe_budget x their µs >= the switch's catch-up + the probe block's loss);
    turning back on must pay the switch back over probe_every blocks; a new slot's choices use
    the engine-wide acceptance until it measures (start_k: 0 = it starts on plain decode)."""
    c = StepCosts(decode_us={1: 490.0}, verify_us={1: {2: 728.0}})
    pol = SpecPolicy(c, ks=(1,), max_slots=2, probe_every=2, probe_budget=0.1, rounds=4, steps=4)
    pol.admit(0)
    pol.observe(0, proposed=4, accepted=0, rounds=4, k=1)
    pol.observe_switch(1, 2000.0)
    assert pol.switch_us(1) == 2000.0 and pol.start_k(1) == 0
    ks = []
    for _ in range(40):
        d = pol.choose([0], 1)
        ks.append(d.k)
        pol.observe_plain([0]) if d.k == 0 else pol.observe(0, proposed=4, accepted=0, rounds=4, k=1)
    # each probe costs 2000 + 4 x 728 x (1 - 490 / 728) µs; 196 µs of credit a plain block
    assert 0 < sum(ks) <= 3 and ks[:10] == [0] * 10, ks
    pol.admit(1)
    assert pol.choose([1], 1).k == 0                          # the engine-wide acceptance is low
    with pytest.raises(ValueError, match="us"):
        pol.observe_switch(1, -1.0)
    with pytest.raises(ValueError, match="probe_budget"):
        SpecPolicy(c, ks=(1,), max_slots=1, probe_budget=2.0)


def test_a_new_request_starts_on_speculation_only_if_it_pays_the_draft_prefill_back():
    """start_k near break-even: speculation's predicted gain over probe_every blocks of `rounds`
    rounds must exceed the measured switch (a draft prefill / catch-up), else the request starts
    on plain decode (its draft is not prefilled); far from break-even it starts speculating."""
    c = StepCosts(decode_us={1: 470.0}, verify_us={1: {2: 630.0, 3: 750.0}})
    pol = SpecPolicy(c, ks=(1, 2), max_slots=1, prior=0.6, margin=0.02, probe_every=8, rounds=4)
    k, rate = best_k([0.6], c, 1, (1, 2), margin=0.02)
    assert k > 0 and pol.start_k(1) == k                       # no switch measured: the rate alone
    gain = 8 * 4 * c.round_us(1, k) * (1 - (1 / 470.0) / rate)  # µs saved over the horizon
    pol.observe_switch(1, gain * 1.5)
    assert pol.start_k(1) == 0                                 # a 4.5 ms prefill for a 3 ms gain: plain
    pol2 = SpecPolicy(c, ks=(1, 2), max_slots=1, prior=0.95, probe_every=8, rounds=4)
    pol2.observe_switch(1, gain * 1.5)
    assert pol2.start_k(1) > 0                                 # high acceptance pays it back


def test_an_untrusted_prior_starts_plain_and_a_skipped_draft_prefill_is_charged_to_the_first_probe():
    """prior_trusted=False: before any round is measured engine-wide, rows start on plain decode
    (start_k 0, choose k 0 though the prior alone would speculate); a probe runs only once the
    plain blocks' credit covers the prefill the rows' drafts skipped (owe) on top of its loss;
    a spec block of the slot pays what it owed; once measured, the engine-wide acceptance rules."""
    c = StepCosts(decode_us={1: 470.0}, verify_us={1: {2: 520.0}})
    trusting = SpecPolicy(c, ks=(1,), max_slots=1, prior=0.5)
    trusting.admit(0)
    assert trusting.start_k(1) == 1 and trusting.choose([0], 1).k == 1
    pol = SpecPolicy(c, ks=(1,), max_slots=1, prior=0.5, prior_trusted=False, probe_every=2,
                     probe_budget=0.1, rounds=4, steps=4)
    pol.admit(0)
    assert pol.start_k(1) == 0
    pol.owe(0, 3000.0)
    ks = []
    for _ in range(12):
        d = pol.choose([0], 1)
        ks.append(d.k)
        assert d.k == 0 or d.probe
        pol.observe_plain([0]) if d.k == 0 else None
        if d.k:
            break
    # credit 0.1 x 4 x 470 = 188 µs a plain block: the 3000 µs owed plus the probe's loss
    # (4 x 520 x (1 - 470 / 520) = 200 µs) take 17 blocks, not the 2 of probe_every
    assert ks == [0] * 12, ks
    pol2 = SpecPolicy(c, ks=(1,), max_slots=1, prior=0.5, prior_trusted=False, probe_every=2,
                      probe_budget=0.1, rounds=4, steps=4)
    pol2.admit(0)
    first = next(i for i in range(12) if (pol2.choose([0], 1).k or pol2.observe_plain([0])))
    assert 2 <= first <= 3                                   # nothing owed: the loss alone
    pol.observe(0, proposed=4, accepted=4, rounds=4, k=1)    # the slot speculated: its debt paid
    assert pol._state(0).owed_us == 0.0 and pol.start_k(1) == 1 and pol.choose([0], 1).k == 1
    with pytest.raises(ValueError, match="us"):
        pol.owe(0, -1.0)
    with pytest.raises(ValueError, match="prior_trusted"):
        SpecPolicy(c, ks=(1,), max_slots=1, prior_trusted=1)
    for bad in (-1.0, float("inf"), True, "5"):
        with pytest.raises(ValueError, match="draft_prefill_us"):
            StepCosts(decode_us={1: 470.0}, verify_us={1: {2: 520.0}}, draft_prefill_us=bad)


def test_the_engine_loop_simulation_is_never_below_097x_plain_on_the_measured_tables():
    """The policy in a CPU simulation of the engine loop (tests/speculative/_spec_sim.py: the real
    SpecPolicy and BlockClock, host and device costs, draft prefills and catch-ups, seeded
    Bernoulli acceptance) over the measured cost tables: the engine_gaps H200 table and the
    trained-family H100 run (docs/results/spec_trained_h100.json), at batch 1 and 4, acceptance
    0.1 to 0.9 and the break-even band between (where the policy toggles): every workload at
    least 0.97x of plain decode (tokens/s, prefills included), and speculation still pays where
    acceptance is high. Deterministic (seeded). Before the policy priced untried ks at the
    measured wall / graph ratio and kept a running mean as the engine-wide acceptance, the
    worst was 0.954x (trained table, bs 4, a = 0.5)."""
    import _spec_sim as sim
    root = Path(__file__).resolve().parents[2]
    tables = (sim.Costs(), sim.trained_costs(root / "docs" / "results" / "spec_trained_h100.json"))
    accs = [0.1, 0.3, 0.5, 0.55, 0.6, 0.65, 0.7, 0.8, 0.9]
    rows = [r for c in tables for r in sim.table(accs, (1, 4), seeds=3, waves=6, tokens=128, costs=c)]
    worst = min((r["x_plain"], r["bs"], r["a"]) for r in rows)
    assert worst[0] >= 0.97, worst
    assert all(r["x_plain"] > 1.15 for r in rows if r["a"] == 0.9), [(r["bs"], r["x_plain"]) for r in rows]


def test_an_untried_k_is_priced_at_the_measured_wall_to_graph_ratio():
    """RealizedCosts: once one speculative k has a realized wall at a bucket, every k without one
    there costs its graph time times the largest measured wall / graph ratio (never less than
    its graph time); a measured k keeps max(graph, wall); plain steps and other buckets are
    untouched. So an untried k cannot win on a graph time the engine never delivers."""
    c = StepCosts(decode_us={1: 100.0, 4: 110.0}, verify_us={1: {2: 120.0, 3: 130.0, 5: 150.0},
                                                             4: {2: 125.0, 3: 135.0, 5: 160.0}})
    pol = SpecPolicy(c, ks=(1, 2, 4), max_slots=4, prior=0.6)
    assert pol.costs.round_us(1, 4) == 150.0                 # nothing measured: the graph time
    pol.observe_wall(1, 1, 144.0)                            # k = 1 runs 1.2x its graph
    pol.observe_wall(1, 0, 90.0)                             # a plain step below its graph: no effect
    assert pol.costs.round_us(1, 1) == 144.0
    assert pol.costs.round_us(1, 4) == pytest.approx(150.0 * 1.2)
    assert pol.costs.round_us(1, 2) == pytest.approx(130.0 * 1.2)
    assert pol.costs.step_us(1) == 100.0 and pol.costs.round_us(4, 4) == 160.0
    pol.observe_wall(1, 2, 117.0)                            # k = 2 below its graph: the ratio stays 1.2
    assert pol.costs.round_us(1, 2) == 130.0 and pol.costs.round_us(1, 4) == pytest.approx(180.0)
    # a = 0.6 alone: k = 4 at its graph time would beat k = 2 (2.31 / 150 > 1.96 / 130); priced at
    # the measured ratio it does not
    pol.admit(0)
    assert pol.choose([0], 1).k != 4


def test_the_engine_wide_acceptance_is_a_running_mean_and_new_requests_start_from_it():
    """The engine-wide acceptance (a new request's starting estimate, start_k's input) is the
    rounds-weighted mean of every slot's measured acceptance over at most 1 / start_ema rounds:
    one slot's noisy 4-round block moves it by a small step, not to its own value; a request
    admitted later starts there, and its admission ends the hysteresis (the turn-on margin
    applies again)."""
    c = StepCosts(decode_us={1: 100.0}, verify_us={1: {2: 110.0}})
    pol = SpecPolicy(c, ks=(1,), max_slots=4, prior=0.5, prior_rounds=2, start_ema=0.02)
    pol.admit(0)
    for _ in range(30):                                      # a = 0.25 over 120 rounds
        pol.observe(0, proposed=4, accepted=1, rounds=4, k=1)
    assert pol._start == pytest.approx(0.25, abs=0.01)
    pol.admit(1)
    assert pol.acceptance(1) == pytest.approx(pol._start)
    before = pol._start
    pol.observe(1, proposed=4, accepted=4, rounds=4, k=1)   # one lucky block of slot 1
    assert pol._start - before == pytest.approx(4 / 50 * (1.0 - before))   # a window of 50 rounds
    with pytest.raises(ValueError, match="start_ema"):
        SpecPolicy(c, ks=(1,), max_slots=1, start_ema=1.5)
    # hysteresis: k = 1 at a = 0.105 is 0.5 % faster than plain (below the 2 % margin to turn on)
    c2 = StepCosts(decode_us={2: 100.0}, verify_us={2: {2: 110.0}})
    hys = SpecPolicy(c2, ks=(1,), max_slots=2, prior=0.3, margin=0.02)
    hys.admit(0)
    assert hys.choose([0], 2).k == 1                         # a = 0.3: on
    hys._slots[0].accept, hys._slots[0].measured_rounds = 0.1055, 8   # just above break-even:
    assert hys.choose([0], 2).k == 1                         # stays on ...
    hys.admit(1)                                             # ... until a new request joins
    hys._slots[1].accept, hys._slots[1].measured_rounds = 0.1055, 8
    assert hys.choose([0, 1], 2).k == 0
