"""Whole-model decode on CPU: graphrt's Llama/Qwen2/Qwen3 decoder vs HF transformers (-k hf),
multi-step graphs' tokens vs single steps, the K/V append kernel, and bad input."""
from __future__ import annotations

import pytest
import torch

from graphrt import DeviceInputError, RuntimeConfig
from graphrt.attention.buffers import StaticBuffers
from graphrt.kernels.append_kv import append_kv
from graphrt.attention.kvcache import PagedKVCache
from graphrt.model.runtime import ModelRuntime
from graphrt.model import LlamaDecoder

transformers = pytest.importorskip("transformers")
PAGE = 16


def _hf(kind: str, seed: int = 0):
    torch.manual_seed(seed)
    common = dict(vocab_size=160, hidden_size=128, intermediate_size=224, num_hidden_layers=2,
                  num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=256)
    if kind == "llama":
        cfg = transformers.LlamaConfig(tie_word_embeddings=False, **common)
        return transformers.LlamaForCausalLM(cfg).eval()
    if kind == "llama3-scaled":  # Llama-3.x frequency scaling, in transformers' rope_parameters
        rope = dict(rope_type="llama3", rope_theta=500000.0, factor=8.0, low_freq_factor=1.0,
                    high_freq_factor=4.0, original_max_position_embeddings=32)
        cfg = transformers.LlamaConfig(tie_word_embeddings=True, rope_parameters=rope, **common)
        return transformers.LlamaForCausalLM(cfg).eval()
    if kind == "qwen3":  # per-head q/k RMSNorm; head_dim 64 != hidden 96 / 2 heads; no qkv bias
        common.update(hidden_size=96, head_dim=64)
        cfg = transformers.Qwen3Config(tie_word_embeddings=False, **common)
        return transformers.Qwen3ForCausalLM(cfg).eval()
    cfg = transformers.Qwen2Config(tie_word_embeddings=True, **common)
    return transformers.Qwen2ForCausalLM(cfg).eval()


def _runtime(hf, *, k=1, backend="torch", buckets=(1, 2, 4), keep_logits=False,
             layout="NHD"):
    model = LlamaDecoder.from_hf(hf)
    cfg = RuntimeConfig(num_qo_heads=2, num_kv_heads=1, head_dim=64, page_size=PAGE,
                        max_context_len=128, buckets=list(buckets), dtype="float32",
                        backend=backend, kv_pool_pages=48, kv_layout=layout)
    return ModelRuntime(model, cfg, "cpu", steps_per_graph=k, keep_logits=keep_logits)


def _tables(n, gen):
    """Each request gets 8 distinct pages (128 tokens) from a shuffled pool."""
    return torch.randperm(48, generator=gen)[: n * 8].to(torch.int32).view(n, 8)


@pytest.mark.parametrize("kind", ["llama", "qwen2", "qwen3", "llama3-scaled"])
@pytest.mark.parametrize("lens", [[7], [5, 17, 33], [16, 1, 40, 31]])
def test_logits_match_hf(kind, lens):
    if kind == "llama3-scaled" and len(lens) != 3:
        pytest.skip("one ragged batch is enough for the scaled-RoPE variant")
    hf = _hf(kind)
    mrt = _runtime(hf, keep_logits=True)
    gen = torch.Generator().manual_seed(len(lens))
    prompts = [torch.randint(0, 160, (n,), generator=gen) for n in lens]
    table = _tables(len(lens), gen)
    logits = mrt.prefill(prompts, table)
    with torch.no_grad():
        ref = torch.stack([hf(p[None]).logits[0, -1] for p in prompts])
    torch.testing.assert_close(logits, ref, rtol=1e-4, atol=1e-4)
    seqs = list(prompts)
    seq_lens = torch.tensor(lens, dtype=torch.int32)
    for _ in range(8):                                   # feed fixed random tokens: no drift
        cur = torch.randint(0, 160, (len(lens),), generator=gen)
        seq_lens += 1
        tokens = mrt.decode(cur, table, seq_lens)
        seqs = [torch.cat([s, cur[i:i + 1]]) for i, s in enumerate(seqs)]
        with torch.no_grad():
            ref = torch.stack([hf(s[None]).logits[0, -1] for s in seqs])
        got = mrt.last_logits(len(lens))
        torch.testing.assert_close(got, ref, rtol=1e-4, atol=1e-4)
        assert tokens[0].tolist() == ref.argmax(-1).tolist()


@pytest.mark.parametrize("backend", ["torch", "torch-splitkv", "reference", "triton-decode"])
def test_multi_step_tokens_equal_single_steps(backend):
    hf = _hf("llama", seed=1)
    gen = torch.Generator().manual_seed(5)
    lens = [9, 30, 2]
    prompts = [torch.randint(0, 160, (n,), generator=gen) for n in lens]
    table = _tables(3, gen)
    first = torch.randint(0, 160, (3,), generator=gen)
    seq_lens = torch.tensor(lens, dtype=torch.int32) + 1
    one, four = _runtime(hf, k=1, backend=backend), _runtime(hf, k=4, backend=backend)
    for rt in (one, four):
        rt.prefill(prompts, table)
    multi = four.decode(first, table, seq_lens).clone()          # [4, 3] in one call
    singles, cur = [], first
    for step in range(4):
        cur = one.decode(cur, table, seq_lens + step)[0].clone()
        singles.append(cur)
    assert multi.tolist() == torch.stack(singles).tolist()
    # both left the same K/V in every layer's cache
    for a, b in zip(one.kv_caches, four.kv_caches):
        torch.testing.assert_close(a.k, b.k)


def test_multi_step_refuses_block_table_without_room():
    mrt = _runtime(_hf("llama"), k=4)
    table = torch.arange(2, dtype=torch.int32).view(1, 2)        # 2 pages = 32 tokens
    with pytest.raises(ValueError, match="block_table.*needs 3 pages"):
        mrt.decode(torch.tensor([3]), table, torch.tensor([30], dtype=torch.int32))
    with pytest.raises(ValueError, match="max_context_len"):
        mrt.decode(torch.tensor([3]), torch.zeros((1, 8), dtype=torch.int32),
                   torch.tensor([127], dtype=torch.int32))
    with pytest.raises(ValueError, match="tokens"):
        mrt.decode(torch.tensor([3.0]), table, torch.tensor([3], dtype=torch.int32))


def test_model_config_mismatch_is_refused():
    model = LlamaDecoder.from_hf(_hf("llama"))
    cfg = RuntimeConfig(num_qo_heads=4, num_kv_heads=1, head_dim=64, page_size=PAGE,
                        max_context_len=64, buckets=[1], dtype="float32", backend="reference")
    with pytest.raises(ValueError, match="num_qo_heads"):
        ModelRuntime(model, cfg, "cpu")


@pytest.mark.parametrize("layout", ["NHD", "HND"])
def test_append_kv_writes_slot_seq_len_minus_one(layout):
    cfg = RuntimeConfig(num_qo_heads=4, num_kv_heads=2, head_dim=64, page_size=4, max_pages_per_seq=3,
                        buckets=[4], dtype="float32", backend="reference", kv_layout=layout)
    view = StaticBuffers(cfg, torch.device("cpu")).view(4)
    cache = PagedKVCache.allocate(cfg, 10, "cpu")
    before_k = cache.k.clone()
    view.block_table.copy_(torch.tensor([[3, 4, 5], [6, 7, 8], [0, 1, 2], [9, 9, 9]], dtype=torch.int32))
    view.seq_lens.copy_(torch.tensor([6, 1, 0, 13], dtype=torch.int32))  # row 2 padding, row 3 too long
    k, v = torch.randn(4, 2, 64), torch.randn(4, 2, 64)
    append_kv(k, v, cache, view.block_table, view.seq_lens, view.device_error)
    tok = (lambda c, p, s: c[p, s]) if layout == "NHD" else (lambda c, p, s: c[p, :, s])
    torch.testing.assert_close(tok(cache.k, 4, 1), k[0])   # pos 5 -> page col 1 (4), slot 1
    torch.testing.assert_close(tok(cache.v, 6, 0), v[1])   # pos 0 -> page 6, slot 0
    changed = (cache.k != before_k).flatten(1).any(1).nonzero().flatten().tolist()
    assert changed == [4, 6]                               # padding / overflowing rows wrote nothing
    assert int(view.device_error) == 8


def test_device_guard_reports_kv_slot_overflow():
    mrt = _runtime(_hf("llama"))
    view = mrt.buffers.view(1)
    view.device_error.fill_(8)
    with pytest.raises(DeviceInputError, match="K/V slot"):
        mrt.check_device_errors()
    view.device_error.fill_(16)                          # rope_append: position past the table
    with pytest.raises(DeviceInputError, match="RoPE cos/sin table"):
        mrt.check_device_errors()


def test_model_runtime_bad_arguments():
    hf = _hf("llama")
    with pytest.raises(ValueError, match="steps_per_graph"):
        _runtime(hf, k=0)
    mrt = _runtime(hf)
    table = torch.zeros((1, 8), dtype=torch.int32)
    lens = torch.tensor([3], dtype=torch.int32)
    with pytest.raises(ValueError, match="tokens: ids in"):
        mrt.decode(torch.tensor([160]), table, lens)          # vocabulary has 160 ids
    with pytest.raises(ValueError, match="tokens: ids in"):
        mrt.decode(torch.tensor([-1]), table, lens)
    with pytest.raises(ValueError, match="tokens"):
        mrt.decode(torch.zeros(0, dtype=torch.int64), table[:0], lens[:0])


@pytest.mark.parametrize("pages", [0, -3, 2.5])
def test_model_runtime_num_pages_is_checked(pages):
    model = LlamaDecoder.from_hf(_hf("llama"))
    cfg = RuntimeConfig(num_qo_heads=2, num_kv_heads=1, head_dim=64, page_size=PAGE, max_context_len=64,
                        buckets=[1], dtype="float32", backend="reference")
    with pytest.raises(ValueError, match="num_pages"):
        ModelRuntime(model, cfg, "cpu", num_pages=pages)


def test_hnd_cache_logits_match_hf():
    hf = _hf("qwen3", seed=3)
    mrt = _runtime(hf, keep_logits=True, layout="HND")
    gen = torch.Generator().manual_seed(3)
    prompts = [torch.randint(0, 160, (n,), generator=gen) for n in (17, 4)]
    table = _tables(2, gen)
    with torch.no_grad():
        torch.testing.assert_close(mrt.prefill(prompts, table),
                                   torch.stack([hf(p[None]).logits[0, -1] for p in prompts]),
                                   rtol=1e-4, atol=1e-4)
        cur = torch.randint(0, 160, (2,), generator=gen)
        mrt.decode(cur, table, torch.tensor([18, 5], dtype=torch.int32))
        ref = torch.stack([hf(torch.cat([p, cur[i:i + 1]])[None]).logits[0, -1]
                           for i, p in enumerate(prompts)])
    torch.testing.assert_close(mrt.last_logits(2), ref, rtol=1e-4, atol=1e-4)


def test_logits_are_opt_in_and_tokens_do_not_need_them():
    hf = _hf("qwen2", seed=2)
    lean, full = _runtime(hf), _runtime(hf, keep_logits=True)
    assert lean._logits is None and full._logits is not None
    gen = torch.Generator().manual_seed(2)
    prompts = [torch.randint(0, 160, (n,), generator=gen) for n in (6, 21, 2)]
    table = _tables(3, gen)
    cur = torch.randint(0, 160, (3,), generator=gen)
    lens = torch.tensor([7, 22, 3], dtype=torch.int32)
    for rt in (lean, full):
        rt.prefill(prompts, table)
    assert lean.decode(cur, table, lens).tolist() == full.decode(cur, table, lens).tolist()
    assert full.decode(cur, table, lens)[0].tolist() == full.last_logits(3).argmax(-1).tolist()
    with pytest.raises(ValueError, match="keep_logits"):
        lean.last_logits(3)


def test_rope_table_must_cover_max_context_len():
    model = LlamaDecoder.from_hf(_hf("llama"), max_positions=100)   # config wants 128
    cfg = RuntimeConfig(num_qo_heads=2, num_kv_heads=1, head_dim=64, page_size=PAGE,
                        max_context_len=128, buckets=[1], dtype="float32", backend="reference")
    with pytest.raises(ValueError, match="max_context_len=128.*max_positions=100"):
        ModelRuntime(model, cfg, "cpu")


def test_prefill_bad_input_is_named():
    mrt = _runtime(_hf("llama"))
    # the model's own checks (ModelRuntime.prefill checks first: tests/test_reliability.py)
    def prefill(prompts, table):
        return mrt.model.prefill(prompts, mrt.kv_caches, table)
    table = torch.arange(2, dtype=torch.int32).view(1, 2)             # 2 pages = 32 tokens
    with pytest.raises(ValueError, match=r"prompts\[0\]: 33 tokens"):
        prefill([torch.zeros(33, dtype=torch.int64)], table)
    with pytest.raises(ValueError, match="block_table: row 0 uses page ids"):
        prefill([torch.zeros(20, dtype=torch.int64)], torch.tensor([[0, 48]], dtype=torch.int32))
    with pytest.raises(ValueError, match="block_table: expected"):
        prefill([torch.zeros(3, dtype=torch.int64)] * 2, table)
    with pytest.raises(ValueError, match=r"prompts\[0\]: expected"):
        prefill([torch.zeros(3, dtype=torch.int32)], table)


@pytest.mark.parametrize("chunk", [5, 16, 4096])
def test_chunked_prefill_through_prefill_attention_equals_hf(chunk):
    """ModelRuntime.prefill: ragged prompts in chunks of `chunk` tokens (a prompt split across
    chunks, several prompts in one) through PrefillAttention; last-token logits == HF."""
    hf = _hf("llama")
    model = LlamaDecoder.from_hf(hf)
    cfg = RuntimeConfig(num_qo_heads=model.spec.num_heads, num_kv_heads=model.spec.num_kv_heads,
                        head_dim=model.spec.head_dim, page_size=PAGE, max_context_len=128,
                        buckets=[1, 4], dtype="float32", backend="reference")
    mrt = ModelRuntime(model, cfg, "cpu", prefill_chunk_tokens=chunk)
    gen = torch.Generator().manual_seed(7)
    lens = [11, 3, 37]
    prompts = [torch.randint(0, model.spec.vocab_size, (n,), generator=gen) for n in lens]
    pages = -(-128 // PAGE)
    table = torch.arange(len(lens) * pages, dtype=torch.int32).view(len(lens), pages)
    got = mrt.prefill(prompts, table)
    for r, p in enumerate(prompts):
        with torch.no_grad():
            ref = hf(p[None]).logits[0, -1].float()
        torch.testing.assert_close(got[r], ref, rtol=1e-4, atol=1e-4)
    with pytest.raises(ValueError, match="prefill_chunk_tokens"):
        ModelRuntime(model, cfg, "cpu", prefill_chunk_tokens=0)
    with pytest.raises(ValueError, match="keep_logits: expected a bool"):
        ModelRuntime(model, cfg, "cpu", keep_logits="yes")
    with pytest.raises(ValueError, match="sampling: expected a bool"):
        ModelRuntime(model, cfg, "cpu", sampling=1)
