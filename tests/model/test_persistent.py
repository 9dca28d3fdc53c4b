"""The persistent decode step inside ModelRuntime (graphrt/model/persistent.py): the setting
(argument; GRAPHRT_DECODE_BACKEND overrides it through RuntimeOptions), where it applies, the pure decision, and whole greedy
decode blocks of a small random model (GQA, 2 layers) through ModelRuntime with
decode_backend="persistent" against the kernel sequence ("sequence"): the same tokens and
logits within float32 rounding (float32) or bf16 rounding (bf16), K = 2 steps a block; also
with the GEMV weights through a shared-memory ring (RuntimeOptions.persistent_stages); with int4
and FP8 weights (the FP8 step is W8A16, the sequence W8A8: tokens equal at a clear margin).
CPU, TRITON_INTERPRET=1 (one program)."""
from __future__ import annotations

import pytest
import torch

from graphrt import RuntimeConfig
from graphrt.model import LlamaDecoder
from graphrt.model.persistent import PersistentPlan, choose, resolve_setting, unsupported
from graphrt.model.runtime import ModelRuntime

transformers = pytest.importorskip("transformers")
V = 160


def _hf(kind="llama", inter=200):
    torch.manual_seed(0)
    common = dict(vocab_size=V, hidden_size=128, intermediate_size=inter, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=64, max_position_embeddings=256,
                  tie_word_embeddings=False)
    cls = {"llama": "Llama", "qwen2": "Qwen2"}[kind]
    return getattr(transformers, cls + "ForCausalLM")(getattr(transformers, cls + "Config")(**common)).eval()


def _config(dtype, buckets):
    return RuntimeConfig(num_qo_heads=4, num_kv_heads=2, head_dim=64, page_size=16, max_context_len=64,
                         buckets=buckets, dtype=dtype, backend="torch-splitkv", kv_pool_pages=16)


def test_settings(monkeypatch):
    monkeypatch.setenv("GRAPHRT_DECODE_BACKEND", "sequence")               # read by RuntimeOptions only
    assert resolve_setting("auto") == "auto" and resolve_setting("Persistent") == "persistent"
    for bad in ("on", 1, None):
        with pytest.raises(ValueError, match="decode_backend"):
            resolve_setting(bad)
    monkeypatch.delenv("GRAPHRT_DECODE_BACKEND")
    with pytest.raises(ValueError, match="decode_backend"):
        ModelRuntime(LlamaDecoder.from_hf(_hf()), _config("float32", [1]), "cpu", decode_backend="fused")


def test_choose_keeps_the_sequence_on_a_tie():
    t = {(1, "persistent"): 90.0, (1, "sequence"): 130.0, (4, "persistent"): 129.0, (4, "sequence"): 130.0}
    assert choose(t, 1) and not choose(t, 4)


def test_plan_where_it_applies(monkeypatch):
    monkeypatch.delenv("GRAPHRT_DECODE_BACKEND", raising=False)
    model = LlamaDecoder.from_hf(_hf())
    mrt = ModelRuntime(model, _config("float32", [1, 3, 32]), "cpu")
    caches = mrt.kv_caches
    assert PersistentPlan.build(model, caches, [1, 3, 32], "sequence", max_context_len=64).table == {}
    assert PersistentPlan.build(model, caches, [1, 3, 32], "auto", max_context_len=64).table == {}          # CPU: the sequence
    plan = PersistentPlan.build(model, caches, [1, 3, 32], "persistent", max_context_len=64)
    assert sorted(plan.table) == [1, 3] and plan.source == "fixed" and plan.get(32) is None
    from graphrt.model.fp8_weights import quantize_weights
    block = LlamaDecoder(model.spec, quantize_weights(model.weights, model.spec, "block", block=(64, 64)))
    assert "block scales" in unsupported(block, caches, 1)                 # FP8 block scales: the sequence
    plan = PersistentPlan.build(block, caches, [1], "persistent", max_context_len=64)
    assert plan.table == {} and "block scales" in plan.skipped[1]
    fp8 = LlamaDecoder(model.spec, quantize_weights(model.weights, model.spec, "channel"))
    assert unsupported(fp8, caches, 1) is None                             # per-channel FP8: the step


def _decode(model, dtype, backend, steps=3, k=2, stages=0):
    """Prefill 3 prompts, then `steps` greedy blocks of K steps: tokens [steps, K, 3] and the last
    step's float32 logits [steps, 3, V]."""
    mrt = ModelRuntime(model, _config(dtype, [1, 3]), "cpu", keep_logits=True, steps_per_graph=k,
                       decode_backend=backend, persistent_stages=stages)
    prompts = [torch.arange(5) * 7 % V, torch.arange(11) * 3 % V, torch.arange(3) + 9]
    table = torch.arange(12, dtype=torch.int32).view(3, 4)
    mrt.prefill(prompts, table)
    lens = torch.tensor([len(p) for p in prompts], dtype=torch.int32)
    tok = torch.tensor([1, 2, 3])
    toks, logits = [], []
    for _ in range(steps):
        lens += 1
        out = mrt.decode(tok, table, lens).clone()                  # [K, 3]
        toks.append(out)
        logits.append(mrt.last_logits(3).clone())
        tok, lens = out[-1], lens + (k - 1)
    mrt.check_device_errors()
    return torch.stack(toks), torch.stack(logits), mrt


@pytest.mark.parametrize("kind,stages", [("llama", 0), ("qwen2", 0), ("llama", 4)])
def test_persistent_equals_sequence_float32(kind, stages, monkeypatch):
    monkeypatch.delenv("GRAPHRT_DECODE_BACKEND", raising=False)
    monkeypatch.delenv("GRAPHRT_PERSISTENT_STAGES", raising=False)
    model = LlamaDecoder.from_hf(_hf(kind))
    ref_tok, ref, seq = _decode(model, "float32", "sequence", steps=2)
    tok, got, mrt = _decode(model, "float32", "persistent", steps=2, stages=stages)
    assert seq.persistent.table == {} and sorted(mrt.persistent.table) == [1, 3]
    assert all(p.stages == stages for p in mrt.persistent.table.values())
    torch.testing.assert_close(got, ref, rtol=1e-4, atol=1e-4)
    assert torch.equal(tok, ref_tok)
    assert all(int(p.counters.abs().sum()) == 0 for p in mrt.persistent.table.values())


def test_persistent_equals_sequence_bf16(monkeypatch):
    monkeypatch.delenv("GRAPHRT_DECODE_BACKEND", raising=False)
    model = LlamaDecoder.from_hf(_hf(), dtype=torch.bfloat16, kernels="triton")   # the Triton kernel sequence: same bf16 roundings
    ref_tok, ref, _ = _decode(model, "bfloat16", "sequence", steps=2)
    tok, got, _ = _decode(model, "bfloat16", "persistent", steps=2)
    torch.testing.assert_close(got, ref, rtol=0, atol=0.06)
    top2 = ref.topk(2, dim=-1).values
    clear = (top2[..., 0] - top2[..., 1]) > 0.1                      # blocks' last steps without a near tie
    assert torch.equal(tok[:, -1][clear], ref_tok[:, -1][clear])
    assert torch.equal(tok[:, 0], ref_tok[:, 0]) or not bool(clear.all())


def _lockstep(model, blocks=3):
    """The sequence and the persistent step (K = 1) on the same prompts, both fed the sequence's
    tokens (teacher-forced): tokens [blocks, 3] of each and float32 logits [blocks, 3, V] of each."""
    runs = [ModelRuntime(model, _config("float32", [1, 3]), "cpu", keep_logits=True, steps_per_graph=1,
                         decode_backend=b) for b in ("sequence", "persistent")]
    prompts = [torch.arange(5) * 7 % V, torch.arange(11) * 3 % V, torch.arange(3) + 9]
    table = torch.arange(12, dtype=torch.int32).view(3, 4)
    for m in runs:
        m.prefill(prompts, table)
    lens = torch.tensor([len(p) for p in prompts], dtype=torch.int32)
    tok = torch.tensor([1, 2, 3])
    toks, logits = ([], []), ([], [])
    for _ in range(blocks):
        lens += 1
        for i, m in enumerate(runs):
            toks[i].append(m.decode(tok, table, lens)[0].clone())
            logits[i].append(m.last_logits(3).clone())
        tok = toks[0][-1]
    for m in runs:
        m.check_device_errors()
    assert sorted(runs[1].persistent.table) == [1, 3]
    assert all(int(p.counters.abs().sum()) == 0 for p in runs[1].persistent.table.values())
    return [torch.stack(t) for t in toks], [torch.stack(x) for x in logits]


@pytest.mark.parametrize("kind", ["int4", "fp8"])
def test_persistent_quantized_against_sequence(kind, monkeypatch):
    """float32 activations, quantized weights, the two paths fed the same tokens. int4: the kernel
    sequence runs the same arithmetic on a CPU (the dequantized weight), so logits within float32
    rounding and the same tokens. FP8: the sequence is W8A8 (each GEMM's input rounded to e4m3 per
    row), the persistent step W8A16 (model-dtype activations: the dequantized model's own
    arithmetic), so the logits differ by the activations' rounding (printed; a few % of the
    largest logit) and the tokens agree where the sequence's top-2 margin exceeds twice that."""
    monkeypatch.delenv("GRAPHRT_DECODE_BACKEND", raising=False)
    from graphrt.model.fp8_weights import quantize_weights
    from graphrt.model.int4_weights import quantize_weights_int4
    base = LlamaDecoder.from_hf(_hf(inter=192))                     # int4 groups of 64 divide every K
    w = quantize_weights_int4(base.weights, group_size=64) if kind == "int4" else \
        quantize_weights(base.weights, base.spec, "channel")
    (ref_tok, tok), (ref, got) = _lockstep(LlamaDecoder(base.spec, w))
    if kind == "int4":
        torch.testing.assert_close(got, ref, rtol=1e-4, atol=1e-4)
        assert torch.equal(tok, ref_tok)
        return
    diff = (got - ref).abs().amax(dim=-1)                               # [blocks, 3]
    top2 = ref.topk(2, dim=-1).values
    clear = (top2[..., 0] - top2[..., 1]) > 2 * diff
    print(f"FP8 W8A16 persistent vs W8A8 sequence: max |logit diff| {float(diff.max()):.4f} of max |logit| "
          f"{float(ref.abs().max()):.3f}; {int(clear.sum())} of {clear.numel()} tokens at a clear margin")
    assert float(diff.max()) <= 0.1 * float(ref.abs().max())
    assert int(clear.sum()) > 0 and torch.equal(tok[clear], ref_tok[clear])
