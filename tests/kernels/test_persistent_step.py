"""The persistent decode step (graphrt/kernels/persistent/step.py) with one program under
TRITON_INTERPRET=1: against a float32 torch reference of the decoder step written here (no
graphrt kernel), for Llama (GQA, 2 layers), Qwen2 (qkv bias) and Qwen3 (q / k norm), bs 1
and 3 with a padding row, float32 and bfloat16 weights, NHD and HND pages; the K/V it
appends, its greedy tokens, the counters left at zero, and bad input refused. The units in
the orders a many-program grid may interleave them (schedule.linearize) give the same bits:
the dependency counters are sufficient, not just deadlock-free. The shared-memory weight ring
(stages > 0, gemv_ring.py) gives the register form's bits (its pipelining is the sm_90 build's,
tests/kernels/test_persistent_compile.py)."""
from __future__ import annotations

import pytest
import torch

from graphrt.attention.kvcache import PagedKVCache
from graphrt.kernels.persistent import PersistentStep, Tiles, unsupported
from graphrt.kernels.persistent.schedule import build_schedule, linearize
from graphrt.model import LlamaDecoder
from _persistent_models import geometry
from _persistent_reference import PAGE, PAGES, assert_bf16_step, kv_at as _kv_at, paged_caches as _caches, reference_step

transformers = pytest.importorskip("transformers")
V = 160


def _model(kind="llama", dtype=torch.float32):
    torch.manual_seed(0)
    common = dict(vocab_size=V, hidden_size=128, intermediate_size=200, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=32, max_position_embeddings=256,
                  tie_word_embeddings=False)
    cls = {"llama": "Llama", "qwen2": "Qwen2", "qwen3": "Qwen3"}[kind]
    hf = getattr(transformers, cls + "ForCausalLM")(getattr(transformers, cls + "Config")(**common)).eval()
    if kind == "qwen3":                                     # non-trivial q / k norm weights
        for layer in hf.model.layers:
            layer.self_attn.q_norm.weight.data.uniform_(0.5, 1.5)
            layer.self_attn.k_norm.weight.data.uniform_(0.5, 1.5)
    return LlamaDecoder.from_hf(hf, dtype=dtype)


def _run(model, caches, lens, tokens, tiles=Tiles(splits=2, min_keys=64), gemv="auto", schedule=None, stages=0):
    b = len(lens)
    step = PersistentStep(model.weights, caches, model.cos_sin, geometry=geometry(model), rows=b,
                          eps=model.spec.rms_norm_eps, tiles=tiles, gemv=gemv, schedule=schedule, stages=stages)
    table = torch.arange(PAGES, dtype=torch.int32)[torch.randperm(PAGES, generator=torch.Generator().manual_seed(2))]
    table = table[: 4 * b].view(b, 4).contiguous()
    out = torch.full((b,), -1, dtype=torch.int64)
    err = torch.zeros(1, dtype=torch.int32)
    step.launch(tokens, lens, table, out, err)
    return step, table, out, err


CASES = [("llama", torch.float32, "NHD", [37], "fma"), ("llama", torch.float32, "HND", [5, 40, 0], "dot"),
         ("qwen2", torch.float32, "NHD", [1, 17, 0], "fma"), ("qwen3", torch.float32, "NHD", [9, 33, 0], "dot")]


@pytest.mark.parametrize("kind,dtype,layout,lens,gemv", CASES)
def test_against_float32_reference(kind, dtype, layout, lens, gemv):
    model = _model(kind, dtype)
    caches = _caches(model, layout)
    before = [(c.k.clone(), c.v.clone()) for c in caches]
    lens_t = torch.tensor(lens, dtype=torch.int32)
    tokens = torch.tensor([3, 150, 7][: len(lens)])
    step, table, out, err = _run(model, caches, lens_t, tokens, gemv=gemv)
    assert step.gemv == gemv
    ref = [(c.__class__(k, v, layout=layout)) for c, (k, v) in zip(caches, before)]
    logits, new_kv = reference_step(model, ref, table, lens_t, tokens)
    assert int(err) == 0 and int(step.counters.abs().sum()) == 0       # counters back at zero
    for b, n in enumerate(lens):
        if n == 0:
            continue
        torch.testing.assert_close(step.logits[b].float(), logits[b], rtol=1e-4, atol=1e-4)
        assert int(out[b]) == int(logits[b].argmax())
        for i, c in enumerate(caches):
            k, v = _kv_at(c, int(table[b, (n - 1) // PAGE]), (n - 1) % PAGE)
            torch.testing.assert_close(k.float(), new_kv[i][b][0], rtol=1e-4, atol=1e-4)
            torch.testing.assert_close(v.float(), new_kv[i][b][1], rtol=1e-4, atol=1e-4)
    # nothing else in the caches changed
    for c, (k0, _) in zip(caches, before):
        changed = (c.k != k0).flatten(0, -3).any(-1).any(-1) if layout == "NHD" else \
            (c.k != k0).transpose(1, 2).flatten(0, -3).any(-1).any(-1)
        assert int(changed.sum()) <= sum(1 for n in lens if n > 0)


def test_bf16_against_float32_reference():
    model = _model("llama", torch.bfloat16)
    caches = _caches(model)
    lens = torch.tensor([5, 40, 0], dtype=torch.int32)
    tokens = torch.tensor([3, 150, 7])
    before = [PagedKVCache(c.k.clone(), c.v.clone()) for c in caches]
    step, table, out, err = _run(model, caches, lens, tokens, gemv="dot")
    logits, _ = reference_step(model, before, table, lens, tokens)
    assert_bf16_step(step, out, err, logits, rows=(0, 1))


def test_splits_agree():
    """S = 1, 2 and 3 splits of the keys: the same logits (float32)."""
    model = _model()
    lens, tokens = torch.tensor([40, 21], dtype=torch.int32), torch.tensor([4, 99])
    got = []
    for splits in (1, 2, 3):
        step, _, out, _ = _run(model, _caches(model), lens, tokens, Tiles(splits=splits, min_keys=16, block_kv=16))
        got.append(step.logits.clone())
    torch.testing.assert_close(got[1], got[0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got[2], got[0], rtol=1e-5, atol=1e-5)


def test_interleavings_agree():
    """One program running the units of a 5-program schedule in the order its programs could
    interleave them on a GPU (later layers and phases as early as the counters allow; a random
    interleaving): the schedule order's logits, tokens and appended K/V, bit for bit. A missing
    dependency or a scratch buffer overwritten before its last read would change them."""
    model = _model("llama", torch.bfloat16)
    lens, tokens = torch.tensor([40, 21, 0], dtype=torch.int32), torch.tensor([4, 99, 7])
    tiles = Tiles(splits=2, min_keys=16, block_kv=16)
    five = build_schedule(geometry(model), 3, 5, tiles=tiles)
    got = []
    for schedule in (None, linearize(five, "eager"), linearize(five, "random", seed=1)):
        caches = _caches(model)
        step, _, out, err = _run(model, caches, lens, tokens, tiles, schedule=schedule)
        assert int(err) == 0 and int(step.counters.abs().sum()) == 0
        got.append((step.logits[:2].clone(), out[:2].clone(), [(c.k.clone(), c.v.clone()) for c in caches]))
    for logits, out, kv in got[1:]:
        assert torch.equal(logits, got[0][0]) and torch.equal(out, got[0][1])
        assert all(torch.equal(k, k0) and torch.equal(v, v0) for (k, v), (k0, v0) in zip(kv, got[0][2]))


@pytest.mark.parametrize("kind,lens,gemv,stages", [("llama", [5, 40, 0], "dot", 2), ("qwen2", [1, 17, 0], "fma", 5)])
def test_ring_equals_registers(kind, lens, gemv, stages):
    """stages > 0: the same float32 operations in the same order as the register form, with the
    wait, the RMSNorm factors and the first activation chunk inside the GEMV loop's first
    iteration: its logits, tokens and appended K/V bit for bit (bf16; layer 0's QKV normalises
    the embedding rows, later layers' the residual stream, through one ring loop)."""
    model = _model(kind, torch.bfloat16)
    lens_t, tokens = torch.tensor(lens, dtype=torch.int32), torch.tensor([3, 150, 7])
    got = []
    for st in (0, stages):
        caches = _caches(model)
        step, _, out, err = _run(model, caches, lens_t, tokens, gemv=gemv, stages=st)
        assert int(err) == 0 and int(step.counters.abs().sum()) == 0 and step.stages == st
        got.append((step.logits.clone(), out.clone(), [(c.k.clone(), c.v.clone()) for c in caches]))
    (logits, out, kv), (logits0, out0, kv0) = got[1], got[0]
    assert torch.equal(logits, logits0) and torch.equal(out, out0)
    assert all(torch.equal(k, k0) and torch.equal(v, v0) for (k, v), (k0, v0) in zip(kv, kv0))


def test_bad_input():
    model = _model()
    caches = _caches(model)
    g = geometry(model)
    with pytest.raises(ValueError, match="rows"):
        PersistentStep(model.weights, caches, model.cos_sin, geometry=g, rows=17, eps=1e-5)
    with pytest.raises(ValueError, match="programs"):
        PersistentStep(model.weights, caches, model.cos_sin, geometry=g, rows=1, eps=1e-5, programs=4)
    with pytest.raises(ValueError, match="num_warps"):
        PersistentStep(model.weights, caches, model.cos_sin, geometry=g, rows=1, eps=1e-5, num_warps=3)
    with pytest.raises(ValueError, match="gemv"):
        PersistentStep(model.weights, caches, model.cos_sin, geometry=g, rows=5, eps=1e-5, gemv="fma")
    with pytest.raises(ValueError, match="gemv"):
        PersistentStep(model.weights, caches, model.cos_sin, geometry=g, rows=1, eps=1e-5, gemv="mma")
    with pytest.raises(ValueError, match="spin_limit"):
        PersistentStep(model.weights, caches, model.cos_sin, geometry=g, rows=1, eps=1e-5, spin_limit=0)
    with pytest.raises(ValueError, match="prefetch"):
        PersistentStep(model.weights, caches, model.cos_sin, geometry=g, rows=1, eps=1e-5, prefetch=1)
    with pytest.raises(ValueError, match="prefetch_bytes"):
        PersistentStep(model.weights, caches, model.cos_sin, geometry=g, rows=1, eps=1e-5, prefetch_bytes=-1)
    for bad in (-1, 17, True, 2.0):
        with pytest.raises(ValueError, match="stages"):
            PersistentStep(model.weights, caches, model.cos_sin, geometry=g, rows=1, eps=1e-5, stages=bad)
    with pytest.raises(ValueError, match="stages: 16 chunks"):                   # 16 x 64 KB: above the ring's bound
        PersistentStep(model.weights, caches, model.cos_sin, geometry=g, rows=1, eps=1e-5, stages=16,
                       tiles=Tiles(block_k=1024))
    with pytest.raises(ValueError, match="timeline"):
        PersistentStep(model.weights, caches, model.cos_sin, geometry=g, rows=1, eps=1e-5, timeline=True)
    with pytest.raises(ValueError, match="schedule"):
        PersistentStep(model.weights, caches, model.cos_sin, geometry=g, rows=1, eps=1e-5,
                       schedule=build_schedule(g, 2, 1))
    step = PersistentStep(model.weights, caches, model.cos_sin, geometry=g, rows=2, eps=1e-5)
    ok = dict(tokens=torch.zeros(2, dtype=torch.int64), seq_lens=torch.ones(2, dtype=torch.int32),
              block_table=torch.zeros((2, 4), dtype=torch.int32), out=torch.zeros(2, dtype=torch.int64),
              device_error=torch.zeros(1, dtype=torch.int32))
    for name, bad in (("tokens", torch.zeros(3, dtype=torch.int64)), ("seq_lens", torch.ones(2, dtype=torch.int64)),
                      ("block_table", torch.zeros((1, 4), dtype=torch.int32)), ("out", torch.zeros(2, dtype=torch.int32)),
                      ("device_error", torch.zeros(1, dtype=torch.int64))):
        with pytest.raises(ValueError, match=name):
            step.launch(**(ok | {name: bad}))
    fp8 = [PagedKVCache(c.k.to(torch.float8_e4m3fn), c.v.to(torch.float8_e4m3fn), scale=torch.ones(2)) for c in caches]
    assert "kv_caches" in unsupported(model.weights, fp8, 1)
    assert "rows" in unsupported(model.weights, caches, 0)
