"""engine/prefix_cache.py + allocator.py + kv_manager.py + scheduler.py: the prefix cache and
chunked prefill. Greedy output is identical with and without the cache (CPU float32, exactly:
shared prefixes, a tiny pool that evicts and preempts, an abort mid-prefill), shared pages are never written,
every page comes back, and a long prompt's chunks interleave with running decode blocks."""
from __future__ import annotations

import hashlib
from array import array

import numpy as np
import pytest
import torch

from _checkpoints import write
from _engine_steps import assert_all_back, drive, engine_over, run_requests
from graphrt import LLM, SamplingParams
from graphrt.engine.allocator import PageAllocator
from graphrt.engine.engine import Engine
from graphrt.engine.kv_manager import KVCacheManager
from graphrt.engine.prefix_cache import PrefixCache

pytest.importorskip("transformers")
PS = 4                                               # tokens per page: short prompts span pages
CPU = dict(device="cpu", backend="reference", max_model_len=64, page_size=PS)
GREEDY = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
SHARED = [11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21]            # 11 tokens: 2 full pages + 3
PROMPTS = [SHARED + [30 + i, 40 + i, 50 + i] for i in range(3)]   # 14 tokens: 3 full pages + 2


# ---- host: hashes, LRU, refcounts, the write check ----------------------------------------------
def test_keys_chain_over_every_earlier_token_and_the_seed():
    a = PrefixCache(PageAllocator(8, first=1), page_size=2, seed="model-a")
    b = PrefixCache(PageAllocator(8, first=1), page_size=2, seed="model-b")
    ka, kb = a.extend([], [1, 2, 3, 4], 2), b.extend([], [1, 2, 3, 4], 2)
    assert ka != kb and ka[0] != kb[0]                              # another model never shares
    assert a.extend([], [9, 2, 3, 4], 2)[1] != ka[1]                # page 1 depends on page 0's tokens
    assert a.extend(list(ka[:1]), [1, 2, 3, 4], 2) == ka            # incremental = from scratch
    with pytest.raises(ValueError, match="only 3 tokens"):
        a.extend([], [1, 2, 3], 2)


def test_cached_pages_are_kept_until_needed_and_evicted_tail_first():
    kv = KVCacheManager(pool_pages=1 + 6, page_size=2, cache_seed="m")
    keys = kv.cache.extend([], list(range(8)), 4)
    pages = kv.allocate(4)
    kv.cache_full_pages(keys, pages, 0, 4)
    kv.release(pages)
    assert kv.num_free == 6 and kv.allocator.num_evictable == 4     # free, yet still findable
    assert kv.match(keys) == pages
    other = kv.allocate(3)                                          # 2 plain pages, then 1 evicted
    assert pages[3] in other and kv.match(keys) == pages[:3]        # the chain's tail went first
    hit = kv.match(keys)
    assert kv.free_after_sharing(hit) == 0
    kv.share(hit)                                                   # a hit revives unheld pages
    assert [kv.allocator.refcount(p) for p in hit] == [1, 1, 1] and kv.num_free == 0
    assert kv.allocate(1) is None
    with pytest.raises(RuntimeError, match="shared"):
        kv.check_writable(hit, 5, 6)                                # a cached page: never rewritten
    kv.check_writable(other, 0, 6)                                  # own plain pages: fine
    kv.share(other[:1])
    with pytest.raises(RuntimeError, match="owners 2"):
        kv.check_writable(other, 0, 1)
    kv.release(other[:1])
    kv.release(other)
    kv.release(hit)
    assert kv.num_free == 6 and all(kv.allocator.refcount(p) == 0 for p in range(1, 7))
    with pytest.raises(ValueError, match="cannot share a free page"):
        kv.share([other[0]])                                        # a plain free page


def _keys_from_scratch(seed: str, tokens: list[int], n: int, ps: int) -> list[bytes]:
    """The key chain computed directly (an independent reference): BLAKE2b-128 of the previous
    key + the page's tokens as native int64 bytes, from H("graphrt-prefix|" + seed)."""
    h = lambda b: hashlib.blake2b(b, digest_size=16).digest()          # noqa: E731
    prev, out = h(b"graphrt-prefix|" + seed.encode()), []
    for j in range(n):
        prev = h(prev + array("q", tokens[j * ps:(j + 1) * ps]).tobytes())
        out.append(prev)
    return out


def test_cached_pages_skip_their_hash_with_the_same_keys(monkeypatch):
    from graphrt.engine import prefix_cache
    calls = []
    real = prefix_cache._B2
    monkeypatch.setattr(prefix_cache, "_B2", lambda *a, **k: calls.append(1) or real(*a, **k))
    kv = KVCacheManager(pool_pages=1 + 6, page_size=2, cache_seed="m")
    calls.clear()                                                         # the root's
    tokens = [5, 9, 2, 7, 1, 1, 3, 8, 6]
    keys = kv.cache.extend([], tokens, 4)
    assert keys == _keys_from_scratch("m", tokens, 4, 2) and len(calls) == 4
    arr = np.array(tokens, dtype=np.int64)
    assert kv.cache.extend([], arr, 4) == keys and kv.cache.extend(keys[:1], arr[:8], 4) == keys
    pages = kv.allocate(4)
    kv.cache_full_pages(keys, pages, 0, 3)                               # three pages cached
    calls.clear()
    assert kv.cache.extend([], arr, 4) == keys and len(calls) == 1        # only the uncached page hashed
    assert kv.cache.extend([], tokens[:6] + [4, 4], 4)[:3] == keys[:3] and len(calls) == 2
    kv.release(pages)
    kv.allocate(6)                                                        # evicts all three
    assert kv.cache.num_cached == 0 and kv.match(keys) == []
    calls.clear()
    assert kv.cache.extend([], arr, 4) == keys and len(calls) == 4        # forgotten with their pages
    for i in range(10):                                                   # hashed, never cached:
        kv.cache.extend([], [100 + i] * 8, 4)                             # the queue stays bounded
    assert len(kv.cache._recent) <= 2 * kv.num_pages


def test_match_stops_at_the_first_uncached_key():
    kv = KVCacheManager(pool_pages=1 + 8, page_size=2, cache_seed="m")
    keys = kv.cache.extend([], list(range(12)), 6)
    pages = kv.allocate(6)
    kv.cache_full_pages(keys, pages, 0, 2)
    kv.cache_full_pages(keys, pages, 3, 6)                                # a hole at page 2
    assert kv.match(keys) == pages[:2] and kv.match(keys[3:]) == pages[3:]
    assert kv.match(keys[2:]) == [] and kv.match([]) == []
    assert kv.cache.queries == 2 * (6 + 3 + 4) and kv.cache.hits == 2 * (2 + 3)
    kv.release(pages)


# ---- the engine ---------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def path(tmp_path_factory):
    return write(tmp_path_factory, "prefix", arch="llama", dtype="float32", seed=11)


@pytest.fixture(scope="module")
def llm(path):
    return LLM(path, max_batch=4, steps_per_graph=3, **CPU)


def _engine(llm, **kw) -> Engine:
    return engine_over(llm, **kw)


def _run(eng, prompts, params=GREEDY, *, on_step=None):
    return run_requests(eng, prompts, params, on_step=on_step)


_all_back = assert_all_back


@pytest.fixture(scope="module")
def reference(llm):
    """Greedy tokens without the prefix cache."""
    eng = _engine(llm, enable_prefix_caching=False)
    assert eng.scheduler.kv.cache is None
    return [o.token_ids for o in _run(eng, PROMPTS)]


def test_a_shared_prefix_is_reused_with_identical_tokens_and_counted(llm, reference):
    eng = _engine(llm)
    first = _run(eng, PROMPTS[:1])[0]
    assert first.token_ids == reference[0] and first.num_cached_tokens == 0
    shared_pages = {}                                   # page -> K of layer 0 when first shared

    def snapshot(e):
        a, k = e.scheduler.allocator, llm.runtime.runtime.kv_caches[0].k
        for p in range(1, a.num_pages + 1):
            if a.refcount(p) >= 2 and p not in shared_pages:
                shared_pages[p] = k[p].clone()
    outs = _run(eng, PROMPTS, on_step=snapshot)        # all three share SHARED's 2 full pages
    assert [o.token_ids for o in outs] == reference
    assert outs[0].num_cached_tokens == 12             # its own 3 full pages (14 tokens: 13 may hit)
    assert [o.num_cached_tokens for o in outs[1:]] == [8, 8]
    assert len(shared_pages) >= 2
    k = llm.runtime.runtime.kv_caches[0].k
    assert all(torch.equal(k[p], v) for p, v in shared_pages.items())   # never written while shared
    st = eng.stats()
    assert st["prefix_cache_queries"] == 12 + 3 * 12 and st["prefix_cache_hits"] == 12 + 8 + 8
    assert st["pages_cached"] > 0
    _all_back(eng)
    # a page-aligned prompt fully cached still prefills its last token (the first logits)
    aligned = SHARED[:8]
    again = [_run(eng, [aligned])[0] for _ in range(2)]
    assert again[0].token_ids == again[1].token_ids and again[1].num_cached_tokens == 4
    _all_back(eng)


def test_tiny_pool_evicts_and_preempts_with_identical_tokens(path):
    tight = LLM(path, max_batch=3, steps_per_graph=3, num_pages=9, enable_prefix_caching=False, **CPU)
    params = SamplingParams(max_tokens=9, temperature=0.0, ignore_eos=True)
    prompts = PROMPTS + [SHARED + [60, 61]]
    want = _run(tight.engine, prompts, params)
    assert tight.engine.scheduler.kv.cache is None
    eng = _engine(tight)                                # cached, same 9-page pool
    got = _run(eng, prompts, params)                    # SHARED's pages shared, evicted, hit again
    assert [g.token_ids for g in got] == [w.token_ids for w in want]
    _all_back(eng)
    assert eng.scheduler.num_preemptions > 0 and eng.stats()["prefix_cache_hits"] > 0


def test_chunked_prefill_interleaves_with_decode_and_keeps_tokens(llm, reference):
    eng = _engine(llm, max_num_batched_tokens=8, enable_prefix_caching=False)
    long = SHARED + SHARED + [5, 6]                     # 24 tokens: 3 chunks of 8
    want = _run(_engine(llm, enable_prefix_caching=False), [long])[0].token_ids
    sched = eng.scheduler
    sched.record = True
    params = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
    running = [eng.add_request(p, params) for p in PROMPTS[:2]]
    eng.step()                                          # nothing decodes yet: prefilled whole
    assert [e[:2] for e in sched.launches if e[0] == "prefill"] == [("prefill", running[0].request_id),
                                                                    ("prefill", running[1].request_id)]
    late = eng.add_request(long, GREEDY)
    drive(eng, max_steps=400)
    assert late.result().token_ids == want
    assert [s.result().token_ids[:6] for s in running] == reference[:2]
    log = [e for e in sched.launches if e[0] == "decode" or e[1] == late.request_id]
    chunks = [i for i, e in enumerate(log) if e[0] == "prefill"]
    assert [log[i][2:] for i in chunks] == [(0, 8), (8, 16), (16, 24)]
    assert all(log[i + 1][0] == "decode" for i in chunks[:-1])   # a decode block after each chunk
    first_decode = next(i for i, e in enumerate(log) if e[0] == "decode" and late.request_id in e[1].split(","))
    assert first_decode > chunks[-1]                    # decodes only after its last chunk
    _all_back(eng)


def test_chunks_start_after_the_cached_prefix_and_survive_aborts(llm, reference):
    eng = _engine(llm, max_num_batched_tokens=4)
    sched = eng.scheduler
    sched.record = True
    params = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True)
    run = eng.add_request(PROMPTS[0], params)
    eng.step()
    late = [eng.add_request(p, GREEDY) for p in PROMPTS[1:]]
    eng.step()
    eng.abort(late[1].request_id)                       # mid-prefill (chunked behind late[0])
    drive(eng, max_steps=400)
    got = late[0].result()
    assert run.result().token_ids[:6] == reference[0] and got.token_ids == reference[1]
    assert late[1].result().finish_reason == "abort"
    starts = [e[2] for e in sched.launches if e[0] == "prefill" and e[1] == late[0].request_id]
    assert starts[0] == 8 and got.num_cached_tokens == 8   # after SHARED's 2 full pages
    _all_back(eng)


def test_bad_options_name_the_field(llm):
    with pytest.raises(ValueError, match="max_num_batched_tokens"):
        _engine(llm, max_num_batched_tokens=0)
    with pytest.raises(ValueError, match="enable_prefix_caching"):
        _engine(llm, enable_prefix_caching="yes")


def test_prefill_from_an_offset_matches_the_whole_prefill(llm):
    """ModelRuntime.prefill(starts=...): the K/V of positions [0, start) read from the pages."""
    mrt = llm.runtime.runtime
    prompt = torch.tensor(PROMPTS[0])
    top = mrt.num_pages - 1                                         # pages no engine here holds
    table = torch.zeros((2, mrt.config.max_pages_per_seq), dtype=torch.int32)
    table[0, :4] = torch.arange(top - 7, top - 3)
    table[1, :4] = torch.arange(top - 3, top + 1)
    whole = mrt.prefill([prompt], table[:1])
    mrt.prefill([prompt[:8]], table[1:])
    part = mrt.prefill([prompt[8:]], table[1:], starts=[8])
    assert torch.allclose(whole, part, atol=1e-5, rtol=1e-5)
    k = mrt.kv_caches[1].k                                         # the same K/V, however split
    assert torch.allclose(k[table[0, :3].long()], k[table[1, :3].long()], atol=1e-5, rtol=1e-5)   # full pages
    with pytest.raises(ValueError, match="starts"):
        mrt.prefill([prompt[8:]], table[1:], starts=[-1])


def test_startup_line_names_every_phase(llm):
    from graphrt.attention.graphs import CaptureStats
    from graphrt.engine.startup import StartupTimes
    t = llm.startup
    assert t.total_s >= t.weights_s + t.runtime_s > 0
    line = t.line(pages=10, pool_bytes=2**30)
    assert line.startswith("startup: ready in ") and "weights read" in line and "1.00 GiB" in line
    s = StartupTimes(t0=0.0, weights_s=1.0, runtime_s=0.5, capture_s=4.0, engine_s=0.25, total_s=6.0)
    s.from_capture([CaptureStats(1, 500.0, 3000.0, 0), CaptureStats(2, 250.0, 0.0, 0)])
    assert s.kernels_s == 3.0 and s.graphs_s == 0.75 and s.num_graphs == 2
    assert "kernels 3.00 s" in s.line(pages=1, pool_bytes=0) and "graphs 0.75 s (2 captured)" in s.line(
        pages=1, pool_bytes=0) and "other 0.50 s" in s.line(pages=1, pool_bytes=0)
