"""A decode block whose first step also prefills a prompt chunk (model/mixed.py) on CPU float32:
the decode rows' tokens equal a plain block's, the chunk's K/V equal a plain prefill's, the
chunk's later prompt logits follow HF float32, padding writes nothing, bad input names the field."""
from __future__ import annotations

import pytest
import torch

from graphrt import RuntimeConfig
from graphrt.model import LlamaDecoder
from graphrt.config import check_mixed_tokens
from graphrt.model.mixed import MixedChunk
from graphrt.model.runtime import ModelRuntime

transformers = pytest.importorskip("transformers")
PAGE, K, C, POOL = 16, 2, 16, 40


def _hf(kind="llama"):
    torch.manual_seed(0)
    common = dict(vocab_size=160, hidden_size=256, intermediate_size=224, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=1, max_position_embeddings=256)
    if kind == "qwen3":
        return transformers.Qwen3ForCausalLM(transformers.Qwen3Config(tie_word_embeddings=False, head_dim=64,
                                                                      **common)).eval()
    return transformers.LlamaForCausalLM(transformers.LlamaConfig(tie_word_embeddings=False, **common)).eval()


def _runtime(hf, mixed=C, backend="reference"):
    model = LlamaDecoder.from_hf(hf)
    s = model.spec
    cfg = RuntimeConfig(num_qo_heads=s.num_heads, num_kv_heads=s.num_kv_heads, head_dim=s.head_dim,
                        page_size=PAGE, max_context_len=128, buckets=[1, 4], dtype="float32",
                        backend=backend, kv_pool_pages=POOL)
    return ModelRuntime(model, cfg, "cpu", steps_per_graph=K, mixed_prefill_tokens=mixed)


def _state(mrt):
    return [(c.k.clone(), c.v.clone()) for c in mrt.kv_caches], mrt.slots.seq_lens.clone(), mrt.slots.tokens.clone()


def _restore(mrt, state):
    caches, seq, tok = state
    for c, (k, v) in zip(mrt.kv_caches, caches):
        c.k.copy_(k)
        c.v.copy_(v)
    mrt.slots.seq_lens.copy_(seq)
    mrt.slots.tokens.copy_(tok)


@pytest.mark.parametrize("kind,backend", [("llama", "reference"), ("qwen3", "reference"),
                                          ("llama", "torch-splitkv"), ("llama", "triton-decode")])
def test_a_mixed_block_equals_a_plain_block_plus_a_plain_prefill(kind, backend):
    """Every decode backend attends into a slice of the step's output (the decode rows')."""
    hf = _hf(kind)
    mrt = _runtime(hf, backend=backend)
    gen = torch.Generator().manual_seed(3)
    a, b = torch.randint(0, 160, (21,), generator=gen), torch.randint(0, 160, (9,), generator=gen)
    long = torch.randint(0, 160, (60,), generator=gen)
    table = torch.tensor([[1, 2, 3, 4], [5, 6, 7, 8], [9, 10, 11, 12]], dtype=torch.int32)
    mrt.prefill([a[:-1], b[:-1], long[:16]], table)                 # rows 0, 1 decode; slot 2 prefills
    seq = torch.tensor([21, 9, 0], dtype=torch.int32)                # slot 2: no decode row (padding)
    mrt.slots.load(3, torch.stack([a[-1], b[-1], torch.tensor(0)]), table, seq, None)
    before = _state(mrt)

    plain = mrt.decode_slots(3, sampled=False).clone()              # [K, 3]
    mrt.prefill([long[16:16 + C]], table[2:3], starts=[16])          # the chunk, separately
    want = [(c.k.clone(), c.v.clone()) for c in mrt.kv_caches]

    _restore(mrt, before)
    mrt.stage_chunk(2, long[16:16 + C].clone(), 16, table_row=table[2].numpy())
    mixed = mrt.decode_slots(3, sampled=False, chunk=True).clone()
    assert torch.equal(mixed[:, :2], plain[:, :2])                  # the decode rows: the same tokens
    for c, (k, v) in zip(mrt.kv_caches, want):                      # every page: the chunk's K/V as a
        torch.testing.assert_close(c.k, k, rtol=1e-5, atol=1e-5)    # prefill writes them, nothing else
        torch.testing.assert_close(c.v, v, rtol=1e-5, atol=1e-5)
    assert torch.equal(mrt.slots.seq_lens[:3], seq + torch.tensor([K, K, 0], dtype=torch.int32))

    rest = mrt.prefill([long[16 + C:]], table[2:3], starts=[16 + C])  # the prompt's last piece
    with torch.no_grad():
        ref = hf(long[None]).logits[0, -1].float()
    torch.testing.assert_close(rest[0], ref, rtol=1e-4, atol=1e-4)


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["bf", "w8a8", "kv8", "w8a8+kv8"])
def test_one_mixed_step_keeps_the_decode_logits_for_every_weight_and_kv_format(mode):
    """K = 1, logits compared: W8A8 weights (one scale per fused weight, an FP8 LM head: the
    GEMMs' ScaledAcc into one rope_append over B + C rows) and FP8 pages, and a staging of
    n = 0 (what capture runs) writes only the decode rows' K/V."""
    from graphrt.model.fp8_weights import quantize_weights
    from graphrt.model.spec import LlamaSpec
    from graphrt.model.weights import fuse_hf_state_dict
    hf = _hf()
    spec = LlamaSpec.from_hf(hf.config)
    model = (LlamaDecoder(spec, quantize_weights(fuse_hf_state_dict(spec, hf.state_dict()), spec, "fused-tensor",
                                                 lm_head=True)) if "w8a8" in mode else LlamaDecoder.from_hf(hf))
    cfg = RuntimeConfig(num_qo_heads=spec.num_heads, num_kv_heads=spec.num_kv_heads, head_dim=spec.head_dim,
                        page_size=PAGE, max_context_len=128, buckets=[1, 4], dtype="float32", backend="reference",
                        kv_pool_pages=POOL, kv_cache_dtype="fp8" if "kv8" in mode else "auto")
    mrt = ModelRuntime(model, cfg, "cpu", steps_per_graph=1, mixed_prefill_tokens=C, keep_logits=True)
    gen = torch.Generator().manual_seed(3)
    a, b = torch.randint(0, 160, (21,), generator=gen), torch.randint(0, 160, (9,), generator=gen)
    long = torch.randint(0, 160, (60,), generator=gen)
    table = torch.tensor([[1, 2, 3, 4], [5, 6, 7, 8], [9, 10, 11, 12]], dtype=torch.int32)
    mrt.prefill([a[:-1], b[:-1], long[:16]], table)
    mrt.slots.load(3, torch.stack([a[-1], b[-1], torch.tensor(0)]), table,
                   torch.tensor([21, 9, 0], dtype=torch.int32), None)
    before = _state(mrt)
    plain = mrt.decode_slots(3, sampled=False).clone()
    plain_logits = mrt.last_logits(3)[:2].clone()
    after_plain = [(c.k.clone(), c.v.clone()) for c in mrt.kv_caches]
    mrt.prefill([long[16:16 + C]], table[2:3], starts=[16])
    want = [(c.k.clone(), c.v.clone()) for c in mrt.kv_caches]

    _restore(mrt, before)
    mrt.stage_chunk(2, long[16:16 + C].clone(), 16)
    mixed = mrt.decode_slots(3, sampled=False, chunk=True).clone()
    torch.testing.assert_close(mrt.last_logits(3)[:2], plain_logits, rtol=1e-5, atol=1e-5)
    assert torch.equal(mixed[:, :2], plain[:, :2])
    for c, (k, v) in zip(mrt.kv_caches, want):
        torch.testing.assert_close(c.k.float(), k.float(), rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(c.v.float(), v.float(), rtol=1e-5, atol=1e-5)

    _restore(mrt, before)                                            # n = 0: the capture's staging
    mrt.mixed.buf.zero_()
    mrt.mixed._staged = True
    empty = mrt.decode_slots(3, sampled=False, chunk=True).clone()
    assert torch.equal(empty[:, :2], plain[:, :2]) and torch.isfinite(mrt.last_logits(3)).all()
    for c, (k, v) in zip(mrt.kv_caches, after_plain):        # a padding row's write would be O(1) off;
        torch.testing.assert_close(c.k.float(), k.float(), rtol=1e-5, atol=1e-5)   # CPU BLAS rounds a
        torch.testing.assert_close(c.v.float(), v.float(), rtol=1e-5, atol=1e-5)   # B + C row GEMM apart


def test_a_short_chunk_pads_and_writes_only_its_tokens():
    mrt = _runtime(_hf())
    gen = torch.Generator().manual_seed(4)
    a, long = torch.randint(0, 160, (12,), generator=gen), torch.randint(0, 160, (40,), generator=gen)
    table = torch.tensor([[1, 2, 3, 4], [5, 6, 7, 8]], dtype=torch.int32)
    mrt.prefill([a[:-1], long[:16]], table)
    mrt.slots.load(1, a[-1:].clone(), table[:1], torch.tensor([12], dtype=torch.int32), None)
    mrt.slots.block_table[1, :4].copy_(table[1])
    before = [(c.k.clone(), c.v.clone()) for c in mrt.kv_caches]
    mrt.stage_chunk(1, long[16:21].clone(), 16)                      # 5 real tokens of C = 16
    mrt.decode_slots(1, sampled=False, chunk=True)
    for c, (k0, _) in zip(mrt.kv_caches, before):
        changed = (c.k != k0).reshape(POOL, PAGE, -1).any(-1).nonzero().tolist()
        want = {(1, 11), (1, 12)} | {(6, s) for s in range(0, 5)}   # row 0's K steps; the chunk's 5
        assert set(map(tuple, changed)) == want


def test_each_staging_runs_once_and_bad_input_names_the_field():
    mrt = _runtime(_hf())
    with pytest.raises(RuntimeError, match="nothing staged"):
        mrt.decode_slots(1, sampled=False, chunk=True)
    ok = torch.arange(4, dtype=torch.int64)
    for kw, field in ((dict(slot=4), "slot"), (dict(slot=-1), "slot"), (dict(tokens=torch.arange(17)), "tokens"),
                      (dict(tokens=ok.int()), "tokens"), (dict(tokens=torch.tensor([0, 160])), "tokens"),
                      (dict(start=126), "start"), (dict(start=-1), "start"),
                      (dict(table_row=[1]), "table_row"), (dict(table_row=[1, POOL + 5]), "table_row")):
        args = dict(slot=0, tokens=ok, start=16, table_row=[1, 2]) | kw
        with pytest.raises(ValueError, match=field):
            mrt.stage_chunk(args.pop("slot"), args.pop("tokens"), args.pop("start"), **args)
    for bad in (-1, 4096, True, "8", 1.5):
        with pytest.raises(ValueError, match="mixed_prefill_tokens"):
            check_mixed_tokens(bad)
    plain = _runtime(_hf(), mixed=0)
    assert plain.mixed is None
    with pytest.raises(ValueError, match="mixed_prefill_tokens"):
        plain.stage_chunk(0, ok, 0)
    with pytest.raises(ValueError, match="chunk"):
        plain.decode_slots(1, sampled=False, chunk=True)
    with pytest.raises(ValueError, match="mixed_prefill_tokens"):
        MixedChunk(plain.model, plain.config, "cpu", max_tokens=129)  # beyond max_context_len
