"""Graphed prefill (model/prefill_graphs.py) on CPU: the captured step run eagerly through the graph
runner, against HF float32 and against the eager prefill: buckets, pieces, cached prefixes, the K/V
it writes, the device error flag, bad input."""
from __future__ import annotations

import pytest
import torch

from graphrt import RuntimeConfig
from graphrt.model import LlamaDecoder
from graphrt.model.prefill_graphs import PrefillGraphs, plan_pieces, prefill_token_buckets, reachable_buckets
from graphrt.model.runtime import ModelRuntime

transformers = pytest.importorskip("transformers")
PAGE = 16


def _hf(kind="llama"):
    torch.manual_seed(0)
    common = dict(vocab_size=160, hidden_size=256, intermediate_size=224, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=1, max_position_embeddings=256)
    if kind == "qwen3":
        cfg = transformers.Qwen3Config(tie_word_embeddings=False, head_dim=64, **common)
        return transformers.Qwen3ForCausalLM(cfg).eval()
    return transformers.LlamaForCausalLM(transformers.LlamaConfig(tie_word_embeddings=False, **common)).eval()


def _runtime(hf, **kw):
    model = LlamaDecoder.from_hf(hf)
    s = model.spec
    cfg = RuntimeConfig(num_qo_heads=s.num_heads, num_kv_heads=s.num_kv_heads, head_dim=s.head_dim,
                        page_size=PAGE, max_context_len=128, buckets=[1, 4], dtype="float32",
                        backend="reference", kv_pool_pages=40)
    return ModelRuntime(model, cfg, "cpu", **kw)


def test_buckets_past_the_context_are_not_kept():
    b = prefill_token_buckets(512)
    assert reachable_buckets(b, 8192) == b and reachable_buckets(b, 512) == b
    assert reachable_buckets(b, 36) == (16, 32, 64) and reachable_buckets(b, 64) == (16, 32, 64)
    assert reachable_buckets(b, 1) == (16,)
    model = LlamaDecoder.from_hf(_hf())
    s = model.spec
    cfg = RuntimeConfig(num_qo_heads=s.num_heads, num_kv_heads=s.num_kv_heads, head_dim=s.head_dim,
                        page_size=PAGE, max_context_len=100, buckets=[1], dtype="float32", backend="reference",
                        kv_pool_pages=8)
    pg = PrefillGraphs(model, cfg, "cpu", max_tokens=512)      # a prompt holds at most 100 tokens
    assert pg.buckets == (16, 32, 64, 128) and set(pg.launch) == set(pg.buckets)


def test_buckets_and_pieces():
    assert prefill_token_buckets(512) == (16, 32, 64, 128, 256, 512)
    assert prefill_token_buckets(100) == (16, 32, 64, 100)
    assert prefill_token_buckets(8) == (8,)
    with pytest.raises(ValueError, match="max_tokens"):
        prefill_token_buckets(0)
    assert plan_pieces([40, 3], [0, 5], 16) == [(0, 0, 16), (0, 16, 16), (0, 32, 8), (1, 5, 3)]


@pytest.mark.parametrize("kind", ["llama", "qwen3"])
def test_graphed_prefill_equals_hf_and_writes_the_same_kv(kind):
    """Prompts of 1-45 tokens through buckets (16, 32) and pieces of 32: last-token logits == HF
    float32; every written K/V equals the eager prefill's."""
    hf = _hf(kind)
    graphed = _runtime(hf, graphed_prefill=True, prefill_graph_tokens=32)
    eager = _runtime(hf, graphed_prefill=False)
    assert graphed.prefill_graphs.buckets == (16, 32) and eager.prefill_graphs is None
    gen = torch.Generator().manual_seed(3)
    lens = [7, 1, 45, 32]
    prompts = [torch.randint(0, 160, (n,), generator=gen) for n in lens]
    table = torch.randperm(40, generator=gen)[:32].to(torch.int32).view(4, 8)
    got = graphed.prefill(prompts, table)
    ref_eager = eager.prefill(prompts, table)
    for r, p in enumerate(prompts):
        with torch.no_grad():
            ref = hf(p[None]).logits[0, -1].float()
        torch.testing.assert_close(got[r], ref, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(got, ref_eager, rtol=1e-4, atol=1e-4)
    for cg, ce in zip(graphed.kv_caches, eager.kv_caches):
        for r, n in enumerate(lens):
            pages = table[r, : -(-n // PAGE)].long()
            kg, ke = cg.k[pages].flatten(0, 1)[:n], ce.k[pages].flatten(0, 1)[:n]   # NHD pages
            vg, ve = cg.v[pages].flatten(0, 1)[:n], ce.v[pages].flatten(0, 1)[:n]
            torch.testing.assert_close(kg, ke, rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(vg, ve, rtol=1e-5, atol=1e-5)


def test_cached_prefix_then_suffix_equals_whole_prompt():
    """starts: the prefix's K/V already in the pages (an earlier prefill), the suffix graphed."""
    hf = _hf()
    mrt = _runtime(hf, graphed_prefill=True, prefill_graph_tokens=16)
    gen = torch.Generator().manual_seed(5)
    p = torch.randint(0, 160, (50,), generator=gen)
    table = torch.arange(8, dtype=torch.int32)[None]
    mrt.prefill([p[:32]], table)                                     # the cached prefix: 2 pages
    got = mrt.prefill([p[32:]], table, starts=[32])
    with torch.no_grad():
        ref = hf(p[None]).logits[0, -1].float()
    torch.testing.assert_close(got[0], ref, rtol=1e-4, atol=1e-4)


def test_padding_writes_no_kv_and_bad_pages_are_refused():
    hf = _hf()
    mrt = _runtime(hf, graphed_prefill=True, prefill_graph_tokens=16)
    before = [c.k.clone() for c in mrt.kv_caches]
    table = torch.tensor([[3, 4, 5, 6, 7, 8, 9, 10]], dtype=torch.int32)
    mrt.prefill([torch.arange(5)], table)                             # bucket 16: 11 padding tokens
    for c, b in zip(mrt.kv_caches, before):
        changed = (c.k != b).flatten(1).any(1).nonzero().flatten().tolist()
        assert changed == [3]                                        # only the prompt's first page
        assert (c.k[3, 5:] == b[3, 5:]).all()                        # and only its 5 slots
    with pytest.raises(ValueError, match="block_table"):
        mrt.prefill([torch.arange(5)], torch.tensor([[99] * 8], dtype=torch.int32))
    with pytest.raises(ValueError, match="host_table"):               # wider than max_pages_per_seq
        mrt.prefill_graphs.prefill(mrt.graphs, [torch.arange(5)], torch.zeros((1, 9), dtype=torch.int32),
                                   [0], mrt.kv_caches)
    with pytest.raises(ValueError, match="hidden_out"):                # these graphs record nothing
        mrt.prefill_graphs.prefill(mrt.graphs, [torch.arange(5)], table, [0], mrt.kv_caches,
                                   hidden_out=torch.zeros((5, 256)))
    with pytest.raises(ValueError, match="prefill_graph_tokens"):
        _runtime(hf, prefill_graph_tokens=-1)
    with pytest.raises(ValueError, match="graphed_prefill"):
        _runtime(hf, graphed_prefill="yes")


def test_eager_features_keep_the_eager_path():
    """Prompt log-probs need every position's logits: the eager path serves them, same last logits."""
    hf = _hf()
    mrt = _runtime(hf, graphed_prefill=True, prefill_graph_tokens=16)
    seen = {}
    p = torch.randint(0, 160, (20,), generator=torch.Generator().manual_seed(1))
    table = torch.arange(8, dtype=torch.int32)[None]
    got = mrt.prefill([p], table, on_logits=lambda i, s, x: seen.setdefault(i, x), logits_rows={0})
    assert seen[0].shape == (20, 160)
    torch.testing.assert_close(got[0], seen[0][-1], rtol=1e-5, atol=1e-5)


def test_recorded_states_equal_the_eager_prefills():
    """record_states (an EAGLE-3 head's target): every token's recorded residual states, prompts
    concatenated, in pieces; other ids than the graphs record take the eager path."""
    hf = _hf()
    graphed = _runtime(hf, graphed_prefill=True, prefill_graph_tokens=16)
    graphed.prefill_graphs.record_states((0, 1, 2))
    eager = _runtime(hf, graphed_prefill=False)
    gen = torch.Generator().manual_seed(9)
    prompts = [torch.randint(0, 160, (n,), generator=gen) for n in (21, 4)]
    table = torch.randperm(40, generator=gen)[:16].to(torch.int32).view(2, 8)
    rows, width = 25, 3 * 256
    outs = []
    for mrt in (graphed, eager):
        hidden = torch.full((rows, width), float("nan"))
        logits = mrt.prefill(prompts, table, record=(0, 1, 2), hidden_out=hidden)
        outs.append((logits, hidden))
    torch.testing.assert_close(outs[0][0], outs[1][0], rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(outs[0][1], outs[1][1], rtol=1e-4, atol=1e-4)
    other = torch.zeros((rows, 256))
    graphed.prefill(prompts, table, record=(2,), hidden_out=other)        # eager: same states
    torch.testing.assert_close(other, outs[1][1][:, 512:], rtol=1e-4, atol=1e-4)
    with pytest.raises(ValueError, match="hidden_out"):
        graphed.prefill(prompts, table, record=(0, 1, 2), hidden_out=torch.zeros((rows - 1, width)))
    with pytest.raises(ValueError, match="record"):
        graphed.prefill_graphs.record_states((0, 9))


def test_a_long_call_runs_eagerly(monkeypatch):
    """More new tokens than EAGER_ABOVE_TOKENS in one call: the eager prefill (FlashInfer's batch
    prefill on a GPU), same logits; at or below it the graphs."""
    from graphrt.model import prefill_graphs
    hf = _hf()
    mrt = _runtime(hf, graphed_prefill=True, prefill_graph_tokens=16)
    calls = []
    real = prefill_graphs.PrefillGraphs.prefill
    monkeypatch.setattr(prefill_graphs.PrefillGraphs, "prefill", lambda self, *a, **k: calls.append(1) or real(self, *a, **k))
    monkeypatch.setattr(prefill_graphs, "EAGER_ABOVE_TOKENS", 20)
    p = torch.randint(0, 160, (30,), generator=torch.Generator().manual_seed(4))
    table = torch.arange(8, dtype=torch.int32)[None]
    long = mrt.prefill([p], table)
    assert calls == []
    short = mrt.prefill([p[:20]], table)
    assert calls == [1]
    with torch.no_grad():
        torch.testing.assert_close(long[0], hf(p[None]).logits[0, -1].float(), rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(short[0], hf(p[None, :20]).logits[0, -1].float(), rtol=1e-4, atol=1e-4)
    from graphrt.kernels.multiquery_attention import piece_block_n
    assert piece_block_n(512) == 128 and piece_block_n(64) == 128 and piece_block_n(32) == 64


def test_a_stage_runs_in_every_piece_with_the_next_token_staged():
    """add_stage: the stage runs inside each piece's step after the target's layers, reading the
    piece's buffers (cache_len, q_len, the tokens after each position: the next piece's first
    token, or a stale one after the prompt's last); hidden_last holds each prompt's last
    recorded states (those of hidden_out)."""
    hf = _hf()
    mrt = _runtime(hf, graphed_prefill=True, prefill_graph_tokens=16)
    pg = mrt.prefill_graphs
    pg.record_states((0, 2))
    seen = []

    def stage(t, buf):
        n = int(buf.q_len)
        seen.append((t, int(buf.cache_len), n, buf.tokens[1: n + 1].tolist()))
    pg.add_stage(stage, caches=[])
    gen = torch.Generator().manual_seed(2)
    prompts = [torch.randint(0, 160, (n,), generator=gen) for n in (20, 3)]
    table = torch.randperm(40, generator=gen)[:16].to(torch.int32).view(2, 8)
    hidden, last = torch.zeros((23, 512)), torch.full((4, 512), float("nan"))
    mrt.prefill(prompts, table, record=(0, 2), hidden_out=hidden, hidden_last=last)
    assert [s[:3] for s in seen] == [(16, 0, 16), (16, 16, 4), (16, 0, 3)]
    assert seen[0][3] == prompts[0][1:17].tolist() and seen[1][3][:3] == prompts[0][17:].tolist()
    assert seen[2][3][:2] == prompts[1][1:].tolist()
    torch.testing.assert_close(last[:2], hidden[[19, 22]])
    with pytest.raises(RuntimeError, match="add_stage"):
        pg.add_stage(stage)
