"""The speculation policy switching k mid-request (CPU, float32): greedy output stays identical to
the engine without speculation while blocks run at k = kmax, smaller captured k, and plain decode
(k = 0) in any order, for n-gram and draft; the draft's K/V is caught up after plain blocks
(checked against the target's K/V with the target as its own draft); at max_model_len the
lookahead stays inside each slot's pages and max_tokens / stops stay exact."""
from __future__ import annotations

import pytest
import torch

from _checkpoints import write
from graphrt import LLM, SamplingParams
from _spec_policy import ScriptedPolicy

pytest.importorskip("transformers")
CPU = dict(device="cpu", backend="reference", max_model_len=64)
SCRIPT = (3, 0, 1, 0, 0, 2, 3, 1, 0, 2)        # k per block: kmax, off, down, up...


@pytest.fixture(scope="module")
def path(tmp_path_factory):
    return write(tmp_path_factory, "switch", arch="llama", dtype="float32", seed=11)


@pytest.fixture(scope="module")
def plain(path):
    return LLM(path, max_batch=8, steps_per_graph=3, **CPU)


def _prompts(n):
    base = [[5, 9, 14, 5, 9, 14, 5, 9], [20, 21, 22, 23, 20, 21], [7, 7, 7, 7], [30, 31, 32, 33, 34, 35, 36],
            [40, 41, 40, 41, 40], [50, 60, 70], [80, 81, 82, 80, 81, 82, 80], [90, 91]]
    return base[:n]


def _same(a, b):
    for x, y in zip(a, b):
        assert (x.token_ids, x.text, x.finish_reason) == (y.token_ids, y.text, y.finish_reason)


def _spec(path, method, **kw):
    spec = {"method": method, "num_tokens": 3} | ({"model": str(path)} if method == "draft" else {})
    llm = LLM(path, max_batch=8, steps_per_graph=3, spec_rounds=2, speculative=spec, **(CPU | kw))
    ex = llm.engine.runtime
    assert ex.caps.spec_ks == (1, 2, 3)                      # several k captured per bucket
    llm.engine.policy = ScriptedPolicy(SCRIPT, ex.caps.spec_ks, ex.caps.config.max_batch, ex.caps.config.buckets)
    return llm


def test_ngram_switching_k_down_off_and_up_keeps_greedy_output(path, plain):
    llm = _spec(path, "ngram")
    prompts = _prompts(4)
    full = plain.generate(prompts[:1], SamplingParams(max_tokens=16, temperature=0, ignore_eos=True),
                          use_tqdm=False)[0]
    params = [SamplingParams(max_tokens=12 + 3 * i, temperature=0, ignore_eos=True) for i in range(4)]
    params[0] = SamplingParams(max_tokens=16, temperature=0, ignore_eos=True, stop_token_ids=[full.token_ids[9]])
    want = plain.generate(prompts, params, use_tqdm=False)
    _same(llm.generate(prompts, params, use_tqdm=False), want)
    assert set(llm.engine.policy.ran) == {0, 1, 2, 3}
    st = llm.engine.stats()
    assert st["spec_blocks"] > 0 and st["spec_plain_blocks"] > 0
    assert int(llm.engine.runtime.runtime.buffers.device_error) == 0


def _draft_kv_checker(llm, bad: list):
    """Wrap the runner's run: at each speculative block's start, every live slot's draft K/V at
    positions < seq_len - 2 (what the draft's first step attends to) must equal the target's
    (the draft is the target's checkpoint, so the same tokens give the same K/V)."""
    ex = llm.engine.runtime
    runner, mrt = ex.spec, ex.runtime
    run = runner.run
    ps = mrt.config.page_size

    def checked(n, **kw):
        st = runner.slots
        for s in range(n):
            m = int(st.seq_lens[s]) - 2
            if m <= 0:
                continue
            pos = torch.arange(m)
            pages = st.block_table[s, pos // ps].long()
            for tc, dc in zip(mrt.kv_caches, runner.draft.kv_caches):
                t, d = tc.k[pages, pos % ps], dc.k[pages, pos % ps]
                if not torch.allclose(t, d, atol=1e-4, rtol=1e-4):
                    bad.append((s, m))
                    break
        return run(n, **kw)

    runner.run = checked


def test_draft_switching_catches_up_the_draft_kv(path, plain, monkeypatch):
    prompts = _prompts(2)
    params = [SamplingParams(max_tokens=26 + 2 * i, temperature=0, ignore_eos=True) for i in range(2)]
    want = plain.generate(prompts, params, use_tqdm=False)
    llm, bad = _spec(path, "draft"), []
    _draft_kv_checker(llm, bad)
    runner, catch_ups = llm.engine.runtime.spec, []
    sync = runner.sync_draft

    def recorded(slots, since=None):                     # the catch-ups' (start, tokens) per slot
        prefill = runner.draft.prefill
        runner.draft.prefill = lambda ps, table, starts=None: (
            catch_ups.append([(0 if starts is None else a, len(p)) for a, p in zip(starts or [0] * len(ps), ps)]),
            prefill(ps, table, starts=starts))
        try:
            sync(slots, since=since)
        finally:
            runner.draft.prefill = prefill
    monkeypatch.setattr(runner, "sync_draft", recorded)
    _same(llm.generate(prompts, params, use_tqdm=False), want)
    assert set(llm.engine.policy.ran) == {0, 1, 2, 3} and not bad, llm.engine.policy.ran
    # incremental: each catch-up writes from where the draft stopped (a few plain-block tokens)
    assert catch_ups and all(a > 0 and n <= 3 * llm.engine.runtime.caps.steps_per_graph + 2 for c in catch_ups for a, n in c), catch_ups
    assert llm.engine.stats()["spec_acceptance_rate"] > 0.9     # the draft is the target, in sync
    # the check has teeth: without the catch-up the draft misses the plain blocks' K/V
    stale, bad2 = _spec(path, "draft"), []
    monkeypatch.setattr(stale.engine.runtime.spec, "sync_draft", lambda slots, since=None: None)
    _draft_kv_checker(stale, bad2)
    _same(stale.generate(prompts, params, use_tqdm=False), want)   # still exact (acceptance is)
    assert bad2


@pytest.mark.parametrize("method", ["ngram", "draft"])
def test_lookahead_at_max_model_len_stays_in_the_slots_pages(path, plain, method):
    """Prompt + max_tokens == max_model_len (36) with k = 3 proposals, R = 2 rounds: the rows end
    exactly at max_tokens, and no K/V is written outside the pages the scheduler gave the row
    (pages never handed out keep a canary value; the append kernels flag no bad page)."""
    prompts = [_prompts(4)[3], _prompts(1)[0]]
    params = [SamplingParams(max_tokens=36 - len(p), temperature=0, ignore_eos=True) for p in prompts]
    full = plain.generate(prompts[1:], params[1:], use_tqdm=False)[0]
    params[1] = SamplingParams(max_tokens=36 - len(prompts[1]), temperature=0, ignore_eos=True,
                               stop_token_ids=[full.token_ids[-2]])        # a stop near the end
    want = plain.generate(prompts, params, use_tqdm=False)
    llm = _spec(path, method, num_pages=24, max_model_len=36)
    ex, sched = llm.engine.runtime, llm.engine.scheduler
    caches = list(ex.runtime.kv_caches) + (list(ex.spec.draft.kv_caches) if ex.spec.draft else [])
    for c in caches:
        c.k.fill_(1234.5)
        c.v.fill_(1234.5)
    handed = set()
    alloc = sched.allocator.allocate

    def allocate(n):
        got = alloc(n)
        handed.update(got or [])
        return got

    sched.allocator.allocate = allocate
    got = llm.generate(prompts, params, use_tqdm=False)
    _same(got, want)
    assert len(got[0].token_ids) == params[0].max_tokens and got[1].finish_reason == "stop"
    assert int(ex.runtime.buffers.device_error) == 0
    untouched = [p for p in range(ex.caps.num_pages) if p not in handed and p != 0]
    assert untouched
    for c in caches:
        assert bool((c.k[untouched] == 1234.5).all()) and bool((c.v[untouched] == 1234.5).all())


class _StartsPlain(ScriptedPolicy):
    """The scripted policy whose engine-wide acceptance says a new request starts on plain decode
    (SpecPolicy.start_k == 0): the engine leaves the draft's prompt prefill out."""

    def start_k(self, bucket):
        return 0


def test_draft_prefill_waits_for_the_first_speculative_block(path, plain, monkeypatch):
    """start_k == 0: no draft prefill at admission; the first speculative block catches the draft
    up over the whole context (prompt + plain-block tokens, from position 0), its K/V then equal
    the target's, greedy output identical; a request that never speculates never runs the draft."""
    prompts = _prompts(3)
    params = [SamplingParams(max_tokens=20 + 2 * i, temperature=0, ignore_eos=True) for i in range(3)]
    want = plain.generate(prompts, params, use_tqdm=False)
    llm, bad = _spec(path, "draft"), []
    ex = llm.engine.runtime
    llm.engine.policy = _StartsPlain((0, 0, 3, 1, 0, 2), ex.caps.spec_ks, ex.caps.config.max_batch, ex.caps.config.buckets)
    _draft_kv_checker(llm, bad)
    runner, calls = ex.spec, []
    prefill = runner.draft.prefill
    monkeypatch.setattr(runner.draft, "prefill", lambda ps, table, starts=None: (
        calls.append([(0 if starts is None else a, len(p)) for a, p in zip(starts or [0] * len(ps), ps)]),
        prefill(ps, table, starts=starts))[1])
    _same(llm.generate(prompts, params, use_tqdm=False), want)
    assert not bad and set(llm.engine.policy.ran) == {0, 1, 2, 3}
    # the first draft prefill is a catch-up from 0 over more than each prompt (plain blocks ran first)
    assert calls and all(a == 0 for a, _ in calls[0]), calls
    assert sorted(n for _, n in calls[0]) > sorted(len(p) for p in prompts), calls
    # a policy that never speculates: the draft never runs
    calls.clear()
    llm.engine.policy = _StartsPlain((0,), ex.caps.spec_ks, ex.caps.config.max_batch, ex.caps.config.buckets)
    _same(llm.generate(prompts, params, use_tqdm=False), want)
    assert calls == [] and set(llm.engine.policy.ran) == {0}
