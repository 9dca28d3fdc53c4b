"""The EAGLE-3 head's graphed prompt pass (speculative/eagle3/prompt.py) on CPU, float32: the
target's prefill graphs with the head's stage inside and the first-draft graph, run eagerly
through the graph runner (the captured functions themselves), against the eager pass (eager
target prefill, Eagle3Drafter.prefill) and the dense head of _eagle3_ref: the same head K/V
everywhere in the pool (padding rows and padding tokens write nothing), the same first
proposals, for prompts of 1, 15, 16, 17 and 100 tokens (pieces of 32) in one admission; a suffix
after a cached prefix; the staging of the first-draft rows; bad input."""
from __future__ import annotations

import pytest
import torch

from _eagle3_ref import D, H, HKV, HQ, V, DenseHead, original_config, random_tensors
from graphrt import RuntimeConfig
from graphrt.attention.kvcache import PagedKVCache
from graphrt.model import LlamaDecoder
from graphrt.model.runtime import ModelRuntime
from graphrt.speculative.eagle3 import Eagle3Drafter, Eagle3Head, parse_config
from graphrt.speculative.eagle3.phase import Eagle3Phase
from graphrt.speculative.eagle3.prompt import PAD_LEN, Eagle3PromptGraphs, stage_rows
from graphrt.speculative.eagle3.weights import fuse

transformers = pytest.importorskip("transformers")
PAGE, POOL, K, VD = 16, 60, 3, 40
IDS = (1, 2, 3)                      # the target's 3 layers: states entering layers 1, 2 and after 2
# the target: H = 64 (the head's; it shares the embedding table), one head of 64 (graphrt's head_dim)
LENS = [1, 15, 16, 17, 100]
SLOTS = [3, 0, 6, 1, 5]


@pytest.fixture(scope="module")
def parts():
    torch.manual_seed(0)
    hf = transformers.LlamaForCausalLM(transformers.LlamaConfig(
        vocab_size=V, hidden_size=H, intermediate_size=128, num_hidden_layers=3, num_attention_heads=1,
        num_key_value_heads=1, head_dim=H, max_position_embeddings=256, tie_word_embeddings=False)).eval()
    cfg = parse_config(original_config(draft_vocab=VD))
    tensors = random_tensors(draft_vocab=VD, seed=4)
    g = torch.Generator().manual_seed(6)
    k0, v0 = torch.randn(POOL, PAGE, HKV, D, generator=g), torch.randn(POOL, PAGE, HKV, D, generator=g)
    return hf, cfg, tensors, (k0, v0)


def _phase(parts, *, graphed: bool, tokens: int = 32):
    hf, cfg, tensors, (k0, v0) = parts
    model = LlamaDecoder.from_hf(hf)
    rc = RuntimeConfig(num_qo_heads=1, num_kv_heads=1, head_dim=H, page_size=PAGE, max_context_len=128,
                       buckets=[1, 2, 8], dtype="float32", backend="reference", kv_pool_pages=POOL)
    mrt = ModelRuntime(model, rc, "cpu", graphed_prefill=graphed, prefill_graph_tokens=tokens)
    head = Eagle3Head(cfg, fuse(cfg, tensors, dtype=torch.float32, device="cpu", where="t"),
                      target_embed=model.weights.embed, max_positions=256)
    drafter = Eagle3Drafter(head, PagedKVCache(k0.clone(), v0.clone()), K, max_len=128)
    phase = Eagle3Phase(drafter, IDS, target_hidden=H, max_batch=8, dtype=torch.float32, device="cpu")
    phase.attach_prefill(mrt)
    assert (phase.prompt is not None) == graphed
    return mrt, phase


def _prompts(lens, seed=1):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, V, (n,), generator=g) for n in lens]


def _admit(mrt, phase, prompts, table, first, slots):
    err = torch.zeros(1, dtype=torch.int32)
    logits, hidden = phase.target_prefill(mrt, prompts, table)
    phase.prefill(hidden, prompts, first, table, slots, err)
    assert int(err) == 0
    return logits, hidden


def test_graphed_prompt_pass_equals_the_eager_one_and_the_dense_head(parts):
    """One admission of prompts of 1, 15, 16, 17, 100 tokens (the last: pieces 32, 32, 32, 4) into
    slots out of order, bucket 8 (3 padding rows): graphed and eager write the same head K/V over
    the whole pool (nothing outside each prompt's positions and its chain steps), give the same
    first proposals, equal to the dense head's over the eager target's recorded states."""
    _, _, tensors, (k0, _) = parts
    prompts = _prompts(LENS)
    g = torch.Generator().manual_seed(2)
    table = torch.randperm(POOL - 1, generator=g)[:40].add(1).to(torch.int32).view(5, 8)
    first = torch.randint(0, V, (5,), generator=g)
    out = {}
    for graphed in (True, False):
        mrt, phase = _phase(parts, graphed=graphed)
        logits, hidden = _admit(mrt, phase, prompts, table, first, SLOTS)
        assert (hidden is None) == graphed
        out[graphed] = (logits, phase, hidden)
    (lg_g, ph_g, _), (lg_e, ph_e, states) = out[True], out[False]
    torch.testing.assert_close(lg_g, lg_e, rtol=1e-4, atol=1e-4)
    cg, ce = ph_g.kv_cache, ph_e.kv_cache
    torch.testing.assert_close(cg.k, ce.k, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(cg.v, ce.v, rtol=1e-4, atol=1e-4)
    unused = sorted(set(range(POOL)) - set(table.flatten().tolist()))
    assert torch.equal(cg.k[unused], k0[unused])                        # padding wrote nothing
    for r, n in enumerate(LENS):                                         # nor past the chain steps
        pos = torch.arange(n + K - 1, 8 * PAGE)
        assert torch.equal(cg.k[table[r].long()].flatten(0, 1)[pos], k0[table[r].long()].flatten(0, 1)[pos])
    assert torch.equal(ph_g.proposals[:8], ph_e.proposals[:8])
    others = [s for s in range(8) if s not in SLOTS]
    assert (ph_g.proposals[others] == 0).all()
    start = 0
    for r, n in enumerate(LENS):                                         # the independent reference
        ref = DenseHead(tensors, ph_e.drafter.head.embed)
        nxt = torch.cat([prompts[r][1:], first[r:r + 1]])
        for t in range(n):
            lg, hh = ref.target(states[start + t], int(nxt[t]), t)
        want, ids = [], ref.draft_ids()
        for j in range(K):
            want.append(int(ids[lg.argmax()]))
            if j + 1 < K:
                lg, hh = ref.step(hh, want[-1], n + j)
        assert ph_g.proposals[SLOTS[r]].tolist() == want, r
        start += n


def test_a_suffix_after_a_cached_prefix_writes_from_its_start(parts):
    """The stage writes positions cache_len .. cache_len + q_len - 1 of a piece after cached ones
    (a suffix call with starts): the eager pass's K/V there, positions below untouched. (A call's
    last position is paired with the token after it, which that call does not have; the engine's
    piece passes it as `after`: test_an_admission_in_pieces_equals_a_whole_one.)"""
    p = _prompts([60], seed=3)[0]
    row = torch.arange(1, 9, dtype=torch.int32)[None]
    mrt, phase = _phase(parts, graphed=True, tokens=16)
    mrt.prefill([p[:32]], row, record=IDS, hidden_last=phase.prompt.buf.hidden)
    cache = phase.kv_cache
    before = cache.k.clone()
    mrt.prefill([p[32:]], row, starts=[32], record=IDS, hidden_last=phase.prompt.buf.hidden)
    eager_mrt, eager = _phase(parts, graphed=False)
    states = torch.empty((60, 3 * H))
    eager_mrt.prefill([p], row, record=IDS, hidden_out=states)
    err = torch.zeros(1, dtype=torch.int32)
    eager.drafter.head.prefill_kv(states, torch.cat([p[1:], p[:1]]), [60], eager.kv_cache, row, err)
    flat = lambda c: c[row[0].long()].flatten(0, 1)                   # noqa: E731  [positions, Hkv, D]
    torch.testing.assert_close(flat(cache.k)[32:59], flat(eager.kv_cache.k)[32:59], rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(flat(cache.v)[32:59], flat(eager.kv_cache.v)[32:59], rtol=1e-4, atol=1e-4)
    assert torch.equal(flat(cache.k)[:32], flat(before)[:32])
    torch.testing.assert_close(flat(cache.k)[:31], flat(eager.kv_cache.k)[:31], rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("graphed", [True, False])
def test_an_admission_in_pieces_equals_a_whole_one(parts, graphed):
    """A 70-token prompt admitted in pieces, as the engine runs a cached prefix and chunks:
    positions [0, 20) and [20, 45) as chunks that draw nothing (LocalExecutor.prefill's path:
    target_prefill with `after`, the context's next token, then prefill_part), then the last
    piece [45, 70) with starts and the first token (prefill). The head's K/V at every position
    and its first proposals equal one whole admission's, graphed and eager."""
    p = _prompts([70], seed=5)[0]
    row = torch.arange(1, 9, dtype=torch.int32)[None]
    first = torch.tensor([17])
    err = torch.zeros(1, dtype=torch.int32)
    mrt, whole = _phase(parts, graphed=graphed, tokens=16)
    _admit(mrt, whole, [p], row, first, [2])
    mrt, split = _phase(parts, graphed=graphed, tokens=16)
    for a, e in ((0, 20), (20, 45)):
        _, hidden = split.target_prefill(mrt, [p[a:e]], row, starts=[a], after=[int(p[e])])
        split.prefill_part(hidden, [p[a:e]], [int(p[e])], row, [a], err)
    _, hidden = split.target_prefill(mrt, [p[45:]], row, starts=[45])
    split.prefill(hidden, [p[45:]], first, row, [2], err, starts=[45])
    assert int(err) == 0
    flat = lambda c: c[row[0].long()].flatten(0, 1)[:70 + K - 1]       # noqa: E731  written positions
    torch.testing.assert_close(flat(split.kv_cache.k), flat(whole.kv_cache.k), rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(flat(split.kv_cache.v), flat(whole.kv_cache.v), rtol=1e-4, atol=1e-4)
    assert torch.equal(split.proposals[2], whole.proposals[2])


def test_stage_rows():
    t = torch.tensor([[4, 5], [6, 7]], dtype=torch.int32)
    got = stage_rows(4, [3, 10], [2, 0], t, width=3, spare=8)
    assert got.tolist() == [[2, 2, 4, 5, 0], [9, 0, 6, 7, 0], [PAD_LEN, 8, 0, 0, 0], [PAD_LEN, 8, 0, 0, 0]]
    assert stage_rows(1, [], [], t[:0], width=3, spare=8).tolist() == [[PAD_LEN, 8, 0, 0, 0]]
    for bad in (dict(size=1), dict(slots=[2]), dict(width=1)):
        kw = {"size": 4, "lens": [3, 10], "slots": [2, 0], "host_table": t, "width": 3, "spare": 8, **bad}
        with pytest.raises(ValueError, match="lens, slots, host_table"):
            stage_rows(kw.pop("size"), kw.pop("lens"), kw.pop("slots"), kw.pop("host_table"), **kw)


def test_bad_input(parts):
    mrt, phase = _phase(parts, graphed=True)
    pg = mrt.prefill_graphs
    with pytest.raises(RuntimeError, match="add_stage"):                  # one stage
        pg.add_stage(lambda t, b: None)
    with pytest.raises(ValueError, match="proposals"):
        Eagle3PromptGraphs(phase.drafter, IDS, pg, mrt.graphs, buckets=(1, 2, 8), proposals=phase.proposals[:8])
    p, row = _prompts([5]), torch.arange(1, 9, dtype=torch.int32)[None]
    with pytest.raises(ValueError, match="hidden_last"):                 # wrong width
        mrt.prefill(p, row, record=IDS, hidden_last=torch.zeros((1, H)))
    with pytest.raises(ValueError, match="hidden_last"):                 # no record ids
        mrt.prefill(p, row, hidden_last=phase.prompt.buf.hidden)
    with pytest.raises(ValueError, match="hidden_last"):                 # the eager path (prompt log-probs)
        mrt.prefill(p, row, record=IDS, hidden_last=phase.prompt.buf.hidden, on_logits=lambda *a: None,
                    logits_rows={0})
    assert mrt.prefill_graphed(5, record=IDS) and not mrt.prefill_graphed(5, record=(1,))
    assert not mrt.prefill_graphed(5, record=IDS, logits_rows={0})
    err = torch.zeros(1, dtype=torch.int32)
    phase.prompt.capture(err)                                             # CPU: nothing captured
    with pytest.raises(ValueError, match="error"):
        phase.prompt.first_draft(torch.zeros(1, dtype=torch.int64), [0], [5], row, torch.zeros(1, dtype=torch.int32))
    with pytest.raises(ValueError, match="slots, first"):
        phase.prompt.first_draft(torch.zeros(9, dtype=torch.int64), list(range(9)), [5] * 9, row.expand(9, 8), err)
    with pytest.raises(RuntimeError, match="add_stage"):                 # after capture
        pg2 = mrt.prefill_graphs.__class__(mrt.model, mrt.config, "cpu", max_tokens=16)
        pg2.capture(mrt.graphs, mrt.kv_caches)
        pg2.add_stage(lambda t, b: None)
    with pytest.raises(TypeError, match="stage"):
        mrt.prefill_graphs.__class__(mrt.model, mrt.config, "cpu", max_tokens=16).add_stage(3)
