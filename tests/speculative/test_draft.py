"""Draft-model proposer on CPU (float32): greedy speculative output with a different random draft
equals plain greedy decoding; with the target as its own draft every proposal is accepted."""
from __future__ import annotations

import pytest
import torch

from _spec_helpers import PAGE, POOL, VOCAB, hf_greedy, page_table, runtime_config, sample_prompts
from graphrt.attention.kvcache import PagedKVCache
from graphrt.model import LlamaDecoder
from graphrt.speculative import DraftProposer, SpeculativeConfig, SpeculativeRunner

transformers = pytest.importorskip("transformers")


def _llama(seed, layers):
    torch.manual_seed(seed)
    cfg = transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=128, intermediate_size=128, head_dim=64,
                                   num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                                   max_position_embeddings=256, tie_word_embeddings=False)
    return transformers.LlamaForCausalLM(cfg).eval()


def _run(target_hf, draft_hf, prompts, max_tokens, k):
    table = page_table()
    target = LlamaDecoder.from_hf(target_hf)
    caches = [PagedKVCache.allocate(runtime_config(), POOL, "cpu", seed=i) for i in range(target.spec.num_layers)]
    first = target.prefill(prompts, caches, table).argmax(-1)
    dmodel = LlamaDecoder.from_hf(draft_hf)
    dcaches = [PagedKVCache.allocate(runtime_config(), POOL, "cpu", seed=50 + i) for i in range(dmodel.spec.num_layers)]
    draft = DraftProposer(dmodel, dcaches, k, max_len=128)
    draft.prefill(prompts, table)
    runner = SpeculativeRunner(target, caches, SpeculativeConfig(method="draft", draft_model="-", num_tokens=k),
                               buckets=(1, 3), max_len=128, page_size=PAGE, rounds=2, draft=draft)
    for i, p in enumerate(prompts):
        runner.set_slot(i, p.tolist(), append=first[i:i + 1], limit=len(p) + max_tokens[i],
                        block_table=table[i])
    got, per_round = [[int(t)] for t in first], []
    for _ in range(30):
        out, emitted, proposed, _, _ = runner.run(len(prompts))
        if int(emitted.sum()) == 0:
            break
        for r in range(2):
            for i in range(len(prompts)):
                got[i] += out[r, i, : int(emitted[r, i])].tolist()
        per_round.append((emitted.clone(), proposed.clone()))
    assert int(runner.device_error) == 0
    return got, per_round


def test_different_draft_matches_plain_greedy():
    target, draft = _llama(0, 2), _llama(5, 1)
    prompts, max_tokens = sample_prompts()[:2], [6, 4]
    got, _ = _run(target, draft, prompts, max_tokens, 2)
    assert got == hf_greedy(target, prompts, max_tokens)


def test_self_draft_accepts_everything():
    target = _llama(0, 2)
    prompts, max_tokens = sample_prompts()[:1], [10]
    got, per_round = _run(target, target, prompts, max_tokens, 3)
    assert got == hf_greedy(target, prompts, max_tokens)
    emitted = torch.cat([e[:, 0] for e, _ in per_round])
    emitted = emitted[emitted > 0]
    # 1 + 4 + 4 + 1 (clipped by max_tokens): every round with room emits k + 1 = 4
    assert emitted[:-1].eq(4).all() and int(emitted.sum()) == 9


def test_graphed_draft_prefill_writes_the_eager_prefills_kv():
    """A draft with prefill graphs (captured into the runner's GraphRunner: run eagerly on CPU)
    writes the same K/V as its eager prefill, whole prompts and a catch-up from a position."""
    from graphrt.attention.graphs import GraphRunner
    from graphrt.model.prefill_graphs import PrefillGraphs
    dmodel = LlamaDecoder.from_hf(_llama(5, 1))
    table, prompts = page_table(), sample_prompts()[:2]
    rc = runtime_config()
    drafts = []
    for graphed in (True, False):
        caches = [PagedKVCache.allocate(rc, POOL, "cpu", seed=50 + i) for i in range(dmodel.spec.num_layers)]
        pg = PrefillGraphs(dmodel, rc, "cpu", max_tokens=16, phase="draft_prefill") if graphed else None
        d = DraftProposer(dmodel, caches, 2, max_len=128, prefill_graphs=pg)
        d.capture(GraphRunner("cpu"))
        drafts.append(d)
    assert drafts[0].graphs is not None and drafts[1].graphs is None
    for d in drafts:
        d.prefill([p[:3] for p in prompts], table)
        d.prefill([p[3:] for p in prompts], table, starts=[3, 3]) if d.prefill_graphs else \
            d.prefill(prompts, table)                                 # eager without attention: whole
    for cg, ce in zip(drafts[0].kv_caches, drafts[1].kv_caches):
        for r, p in enumerate(prompts):
            pages = table[r, : -(-len(p) // PAGE)].long()
            torch.testing.assert_close(cg.k[pages].flatten(0, 1)[: len(p)], ce.k[pages].flatten(0, 1)[: len(p)],
                                       rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(cg.v[pages].flatten(0, 1)[: len(p)], ce.v[pages].flatten(0, 1)[: len(p)],
                                       rtol=1e-5, atol=1e-5)
