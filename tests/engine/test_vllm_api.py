"""The LLM API in vLLM's shape (engine/llm.py, params.py, vllm_args.py) and n > 1 (group.py):
a vLLM-style script runs unchanged; the samples of one prompt share its prefill and its full KV
pages (the partial last page copied), sample i equals seed + i alone and in a batch; every page
comes back after aborts of the request or of one sample; unsupported vLLM names are ValueErrors."""
from __future__ import annotations

import pytest

from _checkpoints import write
from _engine_steps import drive
from graphrt import LLM, SamplingParams
from graphrt.engine.params import Logprob
from graphrt.engine.group import best_of
from graphrt.engine.params import CompletionOutput
from graphrt.engine.vllm_args import translate

pytest.importorskip("transformers")
PAGE = 4
PROMPT = [5, 9, 13, 17, 21, 25, 29, 33, 37, 41]          # 10 tokens: 2 full pages + a partial one


@pytest.fixture(scope="module")
def llm(tmp_path_factory):
    path = write(tmp_path_factory, "vllm_api", arch="llama", dtype="float32", seed=3)
    # vLLM's constructor names, as a vLLM script passes them
    return LLM(model=str(path), tensor_parallel_size=1, max_num_seqs=4, dtype="auto", block_size=PAGE,
               max_model_len=64, seed=0, enforce_eager=True, trust_remote_code=True, device="cpu",
               steps_per_graph=2, backend="reference")


def _ids(out):
    return [o.token_ids for o in out.outputs]


def test_a_vllm_style_script_runs_unchanged(llm):
    prompts = ["Hello, my name is", "The capital of France is"]
    outs = llm.generate(prompts, SamplingParams(n=2, temperature=0.8, seed=1, max_tokens=8), use_tqdm=False)
    assert llm.config.max_batch == 4 and llm.config.page_size == PAGE and llm.config.capture is False
    assert [len(o.outputs) for o in outs] == [2, 2]
    tok = llm.get_tokenizer()                                # vLLM's accessor
    for prompt, out in zip(prompts, outs):
        assert out.prompt == prompt and out.finished
        assert out.prompt_token_ids == tok(prompt).input_ids == tok.encode(prompt)
        for i, c in enumerate(out.outputs):
            assert c.index == i and isinstance(c.text, str) and c.finish_reason in ("stop", "length")
            assert 1 <= len(c.token_ids) <= 8
            assert c.text == llm.tokenizer.decode(c.token_ids, skip_special_tokens=True) or c.finish_reason == "stop"
    assert isinstance(outs[0].outputs[1].text, str)
    assert outs[0].text == outs[0].outputs[0].text and outs[0].token_ids == outs[0].outputs[0].token_ids
    alloc = llm.engine.scheduler.allocator
    assert alloc.num_free == alloc.num_pages


def test_sample_i_equals_seed_plus_i_alone_and_in_a_batch(llm):
    sp = dict(temperature=0.9, max_tokens=5, ignore_eos=True)
    whole = PROMPT[:8]                                       # 2 whole pages: nothing to copy
    # two groups of 3 in one batch on 4 slots: the last two samples wait, prefilled on their own
    streams = [llm.engine.add_request(p, SamplingParams(n=3, seed=11, **sp)) for p in (PROMPT, whole)]
    items = [list(s) for s in streams]
    assert all(len(d.outputs) == 1 for it in items for d in it)          # one sample's delta each
    assert items[0][-1].finished and not items[0][0].finished
    groups = [[[t for d in it for o in d.outputs if o.index == i for t in o.token_ids] for i in range(3)]
              for it in items]
    alone = llm.generate([PROMPT], SamplingParams(seed=12, **sp), use_tqdm=False)[0].token_ids
    batch = llm.generate([[7, 8, 9], PROMPT, PROMPT, whole],
                         [SamplingParams(seed=3, **sp)] + [SamplingParams(seed=s, **sp) for s in (11, 13, 12)],
                         use_tqdm=False)
    assert groups[0] == [batch[1].token_ids, alone, batch[2].token_ids]
    assert groups[1][1] == batch[3].token_ids
    assert len({tuple(t) for t in groups[0]}) > 1            # the samples differ (seeds do their job)


def test_samples_share_the_prompt_pages_and_give_them_all_back(llm):
    eng, alloc = llm.engine, llm.engine.scheduler.allocator
    stream = eng.add_request(PROMPT, SamplingParams(n=3, temperature=0.8, seed=2, max_tokens=6, ignore_eos=True))
    eng.step()                                               # admission, one shared prefill, a block
    reqs = [r for r in eng.scheduler.slots if r is not None]
    assert len(reqs) == 3 and all(r.slot >= 0 for r in reqs)
    lead = reqs[0]
    assert all(r.pages[:2] == lead.pages[:2] for r in reqs)   # the two full prompt pages, shared
    assert [alloc.refcount(p) for p in lead.pages[:2]] == [3, 3]
    assert len({r.pages[2] for r in reqs}) == 3               # the partial page: one copy each
    own = sum(len(r.pages) for r in reqs)
    assert alloc.num_pages - alloc.num_free == own - 2 * 2    # 4 pages fewer than 3 separate requests
    drive(eng, max_steps=40)
    out = stream.result()
    assert [len(t) for t in _ids(out)] == [6] * 3
    assert alloc.num_free == alloc.num_pages


def test_aborting_the_request_or_one_sample_gives_every_page_back(llm):
    eng, alloc = llm.engine, llm.engine.scheduler.allocator
    sp = SamplingParams(n=3, temperature=0.8, seed=4, max_tokens=8, ignore_eos=True)
    stream = eng.add_request(PROMPT, sp, request_id="ab")
    eng.step()
    eng.abort("ab")
    drive(eng, max_steps=10)
    out = stream.result()
    assert [o.finish_reason for o in out.outputs] == ["abort"] * 3 and out.finished
    assert alloc.num_free == alloc.num_pages
    stream = eng.add_request(PROMPT, sp, request_id="one")
    eng.step()
    eng.abort("0_one")                                       # sample 0 (whose pages the others share)
    drive(eng, max_steps=40)
    out = stream.result()
    assert [o.finish_reason for o in out.outputs] == ["abort", "length", "length"]
    assert [len(o.token_ids) for o in out.outputs[1:]] == [8, 8]
    assert alloc.num_free == alloc.num_pages


def test_stop_reason_and_chat_of_several_conversations(llm):
    free = llm.generate([PROMPT], SamplingParams(temperature=0, max_tokens=4, ignore_eos=True), use_tqdm=False)[0]
    stop = free.token_ids[2]
    out = llm.generate([PROMPT], SamplingParams(temperature=0, max_tokens=4, stop_token_ids=[stop],
                                                ignore_eos=True), use_tqdm=False)[0]
    first = free.token_ids.index(stop)
    assert out.outputs[0].stop_reason == stop and out.token_ids == free.token_ids[:first + 1]
    assert free.outputs[0].stop_reason is None and free.finish_reason == "length"
    text = free.text
    assert len(text) >= 4, text
    word = text[2:4]
    out = llm.generate([PROMPT], SamplingParams(temperature=0, max_tokens=4, stop=[word, text[2:5] + "\x00"],
                                                ignore_eos=True), use_tqdm=False)[0]
    assert out.outputs[0].stop_reason == word and out.text == text[:text.index(word)]
    conv = [{"role": "user", "content": "Hi"}]
    sp = SamplingParams(temperature=0, max_tokens=2, ignore_eos=True)
    two = llm.chat([conv, [{"role": "user", "content": "Bye"}]], sp, use_tqdm=False)
    one = llm.chat(conv, sp)
    assert len(two) == 2 and len(one) == 1 and one[0].token_ids == two[0].token_ids == one.token_ids
    assert two[0].prompt_token_ids != two[1].prompt_token_ids


def test_best_of_ranks_by_cumulative_logprob():
    outs = [CompletionOutput(0, "a", [1], -3.0), CompletionOutput(1, "b", [2], -1.0),
            CompletionOutput(2, "c", [3], -2.0, logprobs=[{}])]
    got = best_of(outs, 2, keep_logprobs=False)
    assert [(o.index, o.text, o.logprobs) for o in got] == [(0, "b", None), (1, "c", None)]
    with pytest.raises(ValueError, match="^best_of: completion 0 has no cumulative_logprob"):
        best_of([CompletionOutput(0)], 1, keep_logprobs=False)



def test_best_of_joins_each_samples_deltas_once():
    """best_of > n holds every sample's deltas until the ranking (engine thread): appending each to
    a running total copied the whole output again per delta (best_of 64 x 32k tokens: 7.9 s of the
    engine's thread); joined once at the end it is linear."""
    import time
    from graphrt.engine.group import GroupSink
    from graphrt.engine.params import RequestOutput

    class Stream:
        request_id, items = "r", []
        put = items.append
    samples, length = 8, 16_384
    sink = GroupSink(Stream, SamplingParams(n=1, best_of=samples, temperature=1.0, logprobs=0), [1, 2],
                     child_ids=[f"{i}_r" for i in range(samples)], abort=lambda cid: None, done=lambda: None)
    deltas = [[RequestOutput(f"{i}_r", [1, 2], "ab", [t], "length" if t == length - 1 else None,
                             logprobs=[{t: Logprob(-0.5)}], cumulative_logprob=-0.5 * (t + 1) - i)
               for t in range(length)] for i in range(samples)]
    t0 = time.perf_counter()
    for i, per in enumerate(deltas):
        for d in per:
            sink.put(i, d)
    took = time.perf_counter() - t0
    (out,) = Stream.items
    best = out.outputs[0]
    assert out.finished and best.text == "ab" * length and best.token_ids == list(range(length))
    assert len(best.logprobs) == length and best.cumulative_logprob == -0.5 * length
    assert took < 1.0, took

def test_unsupported_vllm_names_are_value_errors_naming_them(llm):
    for kwargs, field in [(dict(allowed_token_ids=[1]), "allowed_token_ids"), (dict(truncate_prompt_tokens=4),
                          "truncate_prompt_tokens"), (dict(presence_penalty=5.0), "presence_penalty"),
                          (dict(logprobs=21), "logprobs"), (dict(no_such=1), "no_such"),
                          (dict(skip_special_tokens=False), "skip_special_tokens"), (dict(n=0), "n"),
                          (dict(n=3, best_of=2), "best_of"), (dict(n=2, seed=2**63 - 1), "seed")]:
        with pytest.raises(ValueError, match=f"^{field}:"):
            SamplingParams(**kwargs)
    assert SamplingParams(allowed_token_ids=None, detokenize=True).n == 1          # vLLM defaults
    sp = SamplingParams(presence_penalty=0.5, min_p=0.1, logprobs=2, min_tokens=1)   # real fields win
    assert (sp.presence_penalty, sp.min_p, sp.logprobs, sp.min_tokens) == (0.5, 0.1, 2, 1)
    assert translate({"tensor_parallel_size": 2, "max_num_seqs": 8, "dtype": "half", "enforce_eager": False,
                      "trust_remote_code": True, "kv_cache_dtype": "auto", "pipeline_parallel_size": 1,
                      "enable_prefix_caching": False}) == \
        {"tensor_parallel": 2, "max_batch": 8, "dtype": "float16", "capture": True, "kv_cache_dtype": "auto",
         "enable_prefix_caching": False}
    for kwargs, field in [({"pipeline_parallel_size": 2}, "pipeline_parallel_size"), ({"dtype": "fp4"}, "dtype"),
                          ({"enable_chunked_prefill": False}, "enable_chunked_prefill"), ({"bogus": 1}, "bogus"),
                          ({"max_num_seqs": 2, "max_batch": 2}, "max_batch"), ({"tokenizer": "/other"}, "tokenizer")]:
        with pytest.raises(ValueError, match=f"^{field}:"):
            translate(kwargs, model="/m")
    with pytest.raises(ValueError, match="^model:"):
        LLM()
    with pytest.raises(ValueError, match="^prompts: a prompt dict"):
        llm.generate([{"text": "x"}])
    assert llm.generate({"prompt_token_ids": [3, 4]}, SamplingParams(max_tokens=1), use_tqdm=False)[0].prompt is None


def _same_logprobs(a, b) -> None:
    """{token id: Logprob} per position, twice: the same (position, token id, rank) keys, logprobs within 1e-5.

    The keys compare exactly and the floats through a flat `pytest.approx` (pytest 8 and 9 both
    refuse nested structures there)."""
    keys = lambda entries: [(i, k, v.rank) for i, e in enumerate(entries) for k, v in sorted(e.items())]
    values = lambda entries: [v.logprob for e in entries for _, v in sorted(e.items())]
    assert keys(a) == keys(b)
    assert values(a) == pytest.approx(values(b), abs=1e-5)


def _cum(c) -> float:
    return sum(e[t].logprob for e, t in zip(c.logprobs, c.token_ids))


def test_the_vllm_script_with_n_logprobs_and_a_penalty(tmp_path_factory):
    path = write(tmp_path_factory, "vllm_script", arch="llama", dtype="float32", seed=3)
    llm = LLM(model=str(path))                               # the script's line, nothing else
    sp = SamplingParams(n=2, logprobs=2, presence_penalty=0.5, max_tokens=5, seed=7, ignore_eos=True)
    outs = llm.generate(["Hello, my name is"], sp, use_tqdm=False)
    c = outs[0].outputs[1]
    assert isinstance(c.text, str) and len(c.token_ids) == 5 and len(c.logprobs) == 5
    for e, t in zip(c.logprobs, c.token_ids):                # the sampled token + the top 2
        assert t in e and 2 <= len(e) <= 3 and all(isinstance(v, Logprob) for v in e.values())
        assert {v.rank for k, v in e.items() if k != t} <= {1, 2}
    assert c.cumulative_logprob == pytest.approx(_cum(c))
    alone = llm.generate(["Hello, my name is"], SamplingParams(logprobs=2, presence_penalty=0.5, max_tokens=5,
                                                                seed=8, ignore_eos=True), use_tqdm=False)[0]
    assert alone.token_ids == c.token_ids                   # sample 1 = seed + 1 alone, penalty included
    _same_logprobs(alone.outputs[0].logprobs, c.logprobs)
    alloc = llm.engine.scheduler.allocator
    assert alloc.num_free == alloc.num_pages


def test_best_of_keeps_the_n_samples_with_the_highest_cumulative_logprob(llm):
    sp = dict(temperature=1.0, max_tokens=4, ignore_eos=True)
    out = llm.generate([PROMPT], SamplingParams(n=2, best_of=4, seed=20, **sp), use_tqdm=False)[0]
    alone = [llm.generate([PROMPT], SamplingParams(seed=20 + i, logprobs=0, **sp), use_tqdm=False)[0].outputs[0]
             for i in range(4)]
    for a in alone:
        assert a.cumulative_logprob == pytest.approx(_cum(a))
    ranked = sorted(range(4), key=lambda i: -alone[i].cumulative_logprob)[:2]
    assert [o.token_ids for o in out.outputs] == [alone[i].token_ids for i in ranked]
    assert [o.index for o in out.outputs] == [0, 1] and all(o.logprobs is None for o in out.outputs)
    assert [o.cumulative_logprob for o in out.outputs] == pytest.approx([alone[i].cumulative_logprob for i in ranked])
    alloc = llm.engine.scheduler.allocator
    assert alloc.num_free == alloc.num_pages


def test_samples_fork_over_cached_pages_and_prompt_logprobs_come_once(llm):
    eng, alloc = llm.engine, llm.engine.scheduler.allocator
    sp = SamplingParams(n=3, temperature=0.8, seed=5, max_tokens=4, ignore_eos=True)
    first = llm.generate([PROMPT], sp, use_tqdm=False)[0]    # caches the two full prompt pages
    stream = eng.add_request(PROMPT, sp)
    eng.step()
    reqs = [r for r in eng.scheduler.slots if r is not None]
    lead = reqs[0]
    assert len(reqs) == 3 and all(r.shares is lead for r in reqs[1:]) and lead.num_cached_tokens == 8
    assert [alloc.refcount(p) for p in lead.pages[:2]] == [3, 3] and all(alloc.is_cached(p) for p in lead.pages[:2])
    drive(eng, max_steps=40)
    again = stream.result()
    assert _ids(again) == _ids(first) and again.num_cached_tokens == 8
    assert alloc.num_free == alloc.num_pages
    lp = SamplingParams(n=2, temperature=0.8, seed=5, max_tokens=2, prompt_logprobs=1)
    two = llm.generate([PROMPT], lp, use_tqdm=False)[0]       # prefilled whole: no cached prefix
    one = llm.generate([PROMPT], SamplingParams(temperature=0.8, seed=5, max_tokens=2, prompt_logprobs=1),
                       use_tqdm=False)[0]
    assert len(two.prompt_logprobs) == len(PROMPT) and two.prompt_logprobs[0] is None
    _same_logprobs(two.prompt_logprobs[1:], one.prompt_logprobs[1:])
    assert two.outputs[0].token_ids == one.token_ids
    assert alloc.num_free == alloc.num_pages


def test_samples_prefill_apart_while_a_chunk_budget_applies(llm):
    eng, sched, alloc = llm.engine, llm.engine.scheduler, llm.engine.scheduler.allocator
    sp = dict(temperature=0.8, max_tokens=4, ignore_eos=True)
    budget, sched.max_num_batched_tokens = sched.max_num_batched_tokens, 3    # chunks of 3 tokens
    try:
        busy = eng.add_request([7, 8, 9], SamplingParams(temperature=0, max_tokens=20, ignore_eos=True))
        eng.step()                                           # a row decodes: the budget applies
        stream = eng.add_request(PROMPT[:9] + [3], SamplingParams(n=2, seed=30, **sp))
        eng.step()
        reqs = [r for r in sched.slots if r is not None and r.request_id.endswith("_req-" + stream.request_id[4:])]
        assert len(reqs) == 2 and all(r.shares is None for r in reqs)     # no fork: each one prefilled
        drive(eng, max_steps=80)
        out, _ = stream.result(), busy.result()
    finally:
        sched.max_num_batched_tokens = budget
    alone = [llm.generate([PROMPT[:9] + [3]], SamplingParams(seed=30 + i, **sp), use_tqdm=False)[0].token_ids
             for i in range(2)]
    assert _ids(out) == alone
    assert alloc.num_free == alloc.num_pages
