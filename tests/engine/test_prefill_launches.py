"""Engine._prefill_launches on CPU float32: where the executor prefills through its prefill graphs
(one replay per piece of one request either way), requests whose prompts complete in the same
step are launched one prefill group at a time, fewest new tokens first, each read back on its own;
every request's tokens equal the one-launch engine's (greedy and seeded sampling, with the prefix
cache); samples sharing a prefill stay in one launch; prompt log-probs, an eager prefill and a
single request keep one launch. (On CPU the runtime has no prefill graphs: the tests say the
executor's `prefill_graphed` is True, which changes only how the work is grouped.)"""
from __future__ import annotations

import pytest

from _checkpoints import write
from _engine_steps import drive
from graphrt import LLM, SamplingParams

pytest.importorskip("transformers")
CPU = dict(device="cpu", backend="reference", max_model_len=64, page_size=4)
GREEDY = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
SEEDED = SamplingParams(max_tokens=6, temperature=0.9, top_p=0.9, seed=77, ignore_eos=True)


@pytest.fixture(scope="module")
def path(tmp_path_factory):
    return write(tmp_path_factory, "launches", shape="tiny", arch="llama")


@pytest.fixture(scope="module")
def plain(path):
    return LLM(path, max_batch=4, steps_per_graph=2, **CPU)


@pytest.fixture()
def split(path, monkeypatch):
    llm = LLM(path, max_batch=4, steps_per_graph=2, **CPU)
    llm.engine.PREFILL_MERGE_TOKENS = 0               # every group its own launch (the rule below)
    asked = []
    monkeypatch.setattr(llm.engine.runtime, "prefill_graphed", lambda n: asked.append(n) or n <= 2048)
    calls = []
    inner = llm.engine._prefill

    def spy(work):
        calls.append([(r.request_id, a, e) for r, a, e in work])
        return inner(work)
    monkeypatch.setattr(llm.engine, "_prefill", spy)
    read = []                                         # prefill read-backs: request ids, in order
    finish = llm.engine._finish

    def finish_spy(block):
        if block.kind == "prefill":
            read.append([r.request_id for r, _, _, _ in block.rows])
        return finish(block)
    monkeypatch.setattr(llm.engine, "_finish", finish_spy)
    llm.calls, llm.asked, llm.read = calls, asked, read
    return llm


def _run(llm, items):
    """Add every (prompt, params) at once, drive to the end; -> (outputs, request ids), pages back."""
    eng = llm.engine
    streams = [eng.add_request(p, sp) for p, sp in items]
    drive(eng, max_steps=200)
    a = eng.scheduler.allocator
    assert not eng._pending and all(a.refcount(p) == 0 for p in range(1, a.num_pages + 1))
    return [s.result() for s in streams], [s.request_id for s in streams]


def test_short_prompts_launch_first_and_tokens_do_not_change(split, plain):
    items = [(list(range(20, 40)), GREEDY), (list(range(5, 10)), SEEDED), (list(range(50, 62)), GREEDY)]
    got, ids = _run(split, items)
    want, _ = _run(plain, items)
    assert [o.token_ids for o in got] == [o.token_ids for o in want]
    assert split.asked == [37]                                        # the step's new tokens
    assert split.calls == [[(ids[1], 0, 5)], [(ids[2], 0, 12)], [(ids[0], 0, 20)]]
    assert split.read == [[ids[1]], [ids[2]], [ids[0]]]               # each first token read on its own
    # again: the prefix cache holds their full pages, the launches start after them; new tokens
    # 1, 4, 4: ties keep their arrival order
    split.calls.clear()
    again, ids = _run(split, items)
    assert [o.token_ids for o in again] == [o.token_ids for o in want]
    assert split.calls == [[(ids[1], 4, 5)], [(ids[0], 16, 20)], [(ids[2], 8, 12)]]


def test_samples_sharing_a_prefill_stay_in_one_launch(split, plain):
    """n = 2: the samples share one 10-token prefill (counted once: 10 new tokens, before a lone
    15-token prompt), in one launch and one read-back."""
    two = SamplingParams(max_tokens=5, temperature=0.8, seed=3, n=2, ignore_eos=True)
    items = [(list(range(30, 45)), GREEDY), (list(range(3, 13)), two)]
    got, ids = _run(split, items)
    want, _ = _run(plain, items)
    assert [[c.token_ids for c in o.outputs] for o in got] == [[c.token_ids for c in o.outputs] for o in want]
    assert len(got[1].outputs) == 2
    assert [len(c) for c in split.calls] == [2, 1]
    assert [e for _, _, e in split.calls[0]] == [10, 10] and split.calls[1] == [(ids[0], 0, 15)]
    assert split.asked == [25]
    assert [len(r) for r in split.read] == [2, 1]


def test_a_failing_launch_fails_its_request_only(split, plain, monkeypatch):
    items = [(list(range(100, 120)), GREEDY), (list(range(120, 126)), SEEDED), (list(range(130, 142)), GREEDY)]
    want, _ = _run(plain, items)
    ex = split.engine.runtime
    real = ex.prefill

    def refuse(launch):
        if any(p.numel() == 12 for p in launch.prompts):
            raise ValueError("prompt: refused for the test")
        return real(launch)
    monkeypatch.setattr(ex, "prefill", refuse)
    eng = split.engine
    streams = [eng.add_request(p, sp) for p, sp in items]
    drive(eng, max_steps=200)
    with pytest.raises(ValueError, match="refused for the test"):
        streams[2].result()
    assert [streams[i].result().token_ids for i in (0, 1)] == [want[i].token_ids for i in (0, 1)]
    a = eng.scheduler.allocator
    assert not eng._pending and all(a.refcount(p) == 0 for p in range(1, a.num_pages + 1))
    assert [len(c) for c in split.calls] == [1, 1, 1]                 # three launches: the failure alone
    later = eng.add_request(list(range(100, 120)), GREEDY)            # the engine keeps serving
    drive(eng, max_steps=200)
    assert later.result().token_ids == want[0].token_ids


def test_one_launch_where_grouping_gains_nothing(split, path, monkeypatch):
    lp = SamplingParams(max_tokens=3, temperature=0.0, prompt_logprobs=2, ignore_eos=True)
    _run(split, [(list(range(10, 19)), lp), (list(range(60, 64)), GREEDY)])
    assert [len(c) for c in split.calls] == [2]                       # prompt log-probs: eager, batched
    split.calls.clear()
    lp0 = SamplingParams(max_tokens=3, temperature=0.0, prompt_logprobs=0, ignore_eos=True)
    _run(split, [(list(range(40, 49)), lp0), (list(range(50, 54)), GREEDY)])
    assert [len(c) for c in split.calls] == [2]                       # prompt_logprobs=0 too
    split.calls.clear()
    _run(split, [(list(range(70, 79)), GREEDY)])
    assert [len(c) for c in split.calls] == [1]                       # one request
    split.calls.clear()
    monkeypatch.setattr(split.engine.runtime, "prefill_graphed", lambda n: False)   # eager prefill
    _run(split, [(list(range(80, 89)), GREEDY), (list(range(90, 94)), GREEDY)])
    assert [len(c) for c in split.calls] == [2]


def test_the_executor_asks_its_runtime(plain):
    ex = plain.engine.runtime
    assert ex.prefill_graphed(8) is False                             # CPU: no prefill graphs
    assert ex.prefill_graphed(8) == ex.runtime.prefill_graphed(8)


def _item(n, *, done=True, shares=None, logprobs=None):
    """A (request, start, end) work item of n new tokens: its context complete or a chunk of it."""
    from types import SimpleNamespace
    r = SimpleNamespace(prompt=[0] * (n if done else 2 * n), token_ids=[], shares=shares,
                        params=SimpleNamespace(prompt_logprobs=logprobs))
    return (r, 0, n)


def test_the_grouping_rule_on_its_own():
    """BlockMixin._prefill_launches over hand-made work: the order, and the guards that keep one launch."""
    from types import SimpleNamespace
    from graphrt.engine.blocks import BlockMixin
    graphs = SimpleNamespace(runtime=SimpleNamespace(prefill_graphed=lambda n: n <= 2048), PREFILL_MERGE_TOKENS=0)

    def launches(eng, work):
        return BlockMixin._prefill_launches(eng, work)
    chunk, long, short = _item(30, done=False), _item(20), _item(5)
    assert launches(graphs, [chunk, long, short]) == [[short], [long], [chunk]]   # the chunk last
    work = [long, short]
    assert launches(SimpleNamespace(runtime=SimpleNamespace(prefill_graphed=lambda n: False), PREFILL_MERGE_TOKENS=0),
                    work) == [work]   # eager
    big = [long, _item(2040)]
    assert launches(graphs, big) == [big]                                         # over 2048: eager, batched
    logprobs = [long, _item(5, logprobs=0)]
    assert launches(graphs, logprobs) == [logprobs]                               # prompt log-probs
    owner = _item(8)
    orphan = [long, _item(8, shares=owner[0])]                                    # its owner not in the step
    assert launches(graphs, orphan) == [orphan]
    together = [long, owner, _item(8, shares=owner[0])]
    assert launches(graphs, together) == [[owner, together[2]], [long]]           # 8 new tokens, once


def test_short_groups_share_a_launch():
    """Adjacent groups (fewest new tokens first) ride one launch while its new tokens stay within
    PREFILL_MERGE_TOKENS; a group past it starts a launch of its own; chunks still go last."""
    from types import SimpleNamespace
    from graphrt.engine.blocks import BlockMixin
    eng = SimpleNamespace(runtime=SimpleNamespace(prefill_graphed=lambda n: n <= 2048), PREFILL_MERGE_TOKENS=128)
    a, b, c, d, chunk = _item(100), _item(20), _item(5), _item(300), _item(30, done=False)
    assert BlockMixin._prefill_launches(eng, [a, b, c, d, chunk]) == [[c, b, a], [d], [chunk]]
    e, f = _item(4), _item(125)
    assert BlockMixin._prefill_launches(eng, [d, e, f]) == [[e], [f], [d]]      # 4 + 125 > 128


def test_cached_prompts_prefill_in_one_launch(path):
    """The engine's default: prompts whose pieces are short (here all; again with their pages
    cached: a few tokens each) prefill in one launch, and their tokens equal the split launches'."""
    llm = LLM(path, max_batch=4, steps_per_graph=2, **CPU)
    llm.engine.runtime.prefill_graphed = lambda n: n <= 2048
    calls = []
    inner = llm.engine._prefill
    llm.engine._prefill = lambda work: calls.append(len(work)) or inner(work)
    items = [(list(range(20, 40)), GREEDY), (list(range(5, 10)), SEEDED), (list(range(50, 62)), GREEDY)]
    got, _ = _run(llm, items)
    assert calls == [3]
    calls.clear()
    again, _ = _run(llm, items)
    assert calls == [3]
    assert [o.token_ids for o in again] == [o.token_ids for o in got]
