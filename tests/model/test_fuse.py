"""Fused GEMV layers of the decode step (graphrt/model/fuse.py): the plan's settings (argument,
GRAPHRT_FUSE) and where it applies (`fusable`: plain model-dtype weights, one rank; buckets
<= 16 rows), the pure decision, decode_step's checks of `fuse=`, and whole decode steps of a
small random model through ModelRuntime with the fused path forced on vs off: the same logits
within float32 rounding (float32 weights) or bf16 rounding with the same greedy tokens (bf16).
CPU, TRITON_INTERPRET=1."""
from __future__ import annotations

import pytest
import torch

from graphrt import RuntimeConfig
from graphrt.kernels.gemv import CANDIDATES
from graphrt.model import LlamaDecoder
from graphrt.model.fuse import ENV, FusePlan, LayerGemvs, choose_fused, fusable, plan_fuse, resolve_setting
from graphrt.model.runtime import ModelRuntime

transformers = pytest.importorskip("transformers")
V = 160


def _hf(kind="llama"):
    torch.manual_seed(0)
    common = dict(vocab_size=V, hidden_size=128, intermediate_size=200, num_hidden_layers=2,
                  num_attention_heads=2, num_key_value_heads=1, head_dim=64, max_position_embeddings=256,
                  tie_word_embeddings=False)
    cls = {"llama": "Llama", "qwen2": "Qwen2"}[kind]
    return getattr(transformers, cls + "ForCausalLM")(getattr(transformers, cls + "Config")(**common)).eval()


def test_settings_and_environment(monkeypatch):
    monkeypatch.delenv(ENV, raising=False)
    assert resolve_setting("auto") == "auto" and resolve_setting("on") == "on" and resolve_setting(0) == "off"
    assert resolve_setting("1") == "on" and resolve_setting(True) == "on" and resolve_setting("OFF") == "off"
    monkeypatch.setenv(ENV, "on")
    assert resolve_setting("auto") == "on" and resolve_setting("off") == "off"     # the argument wins
    monkeypatch.setenv(ENV, "2")
    with pytest.raises(ValueError, match=ENV):
        resolve_setting("auto")
    for bad in (2, "yes", None, 1.0j):
        with pytest.raises(ValueError, match="fuse"):
            resolve_setting(bad)


def test_plan_where_it_applies(monkeypatch):
    monkeypatch.delenv(ENV, raising=False)
    model = LlamaDecoder.from_hf(_hf())
    assert fusable(model)
    assert plan_fuse(model, [1, 4, 32]) == FusePlan()                    # CPU "auto": off
    assert plan_fuse(model, [1, 4, 32], "off") == FusePlan()
    on = plan_fuse(model, [1, 4, 16, 17, 32], "on")
    assert on.source == "fixed" and on.table == {1: LayerGemvs(), 4: LayerGemvs(), 16: LayerGemvs()}
    assert on.get(17) is None and on.get(2) is None
    monkeypatch.setenv(ENV, "1")
    assert plan_fuse(model, [8]).table == {8: LayerGemvs()}
    from graphrt.model.fp8_weights import quantize_weights
    fp8 = LlamaDecoder(model.spec, quantize_weights(model.weights, model.spec, "channel"))
    assert not fusable(fp8) and plan_fuse(fp8, [1], "on") == FusePlan()   # W8A8 keeps its path
    assert not fusable(object())


def test_choose_fused_keeps_unfused_on_a_tie():
    t = {(1, "fused"): 90.0, (1, "unfused"): 130.0, (16, "fused"): 129.0, (16, "unfused"): 130.0}
    assert choose_fused(t, 1) and not choose_fused(t, 16)                 # 129 > 0.97 x 130


def test_layer_gemvs_names():
    c = LayerGemvs(o=CANDIDATES[0])
    assert c.names["o"] == CANDIDATES[0].name and c.names["qkv"] == CANDIDATES[1].name


def test_decode_step_refuses_bad_fuse():
    model = LlamaDecoder.from_hf(_hf())
    tok = torch.zeros(1, dtype=torch.long)
    with pytest.raises(ValueError, match="fuse: expected"):
        model.decode_step(None, tok, fuse="on")
    with pytest.raises(ValueError, match="got 17"):
        model.decode_step(None, torch.zeros(17, dtype=torch.long), fuse=LayerGemvs())
    with pytest.raises(ValueError, match="splitk"):
        model.decode_step(None, tok, fuse=LayerGemvs(), splitk=(2, 1))
    from graphrt.model.fp8_weights import quantize_weights
    fp8 = LlamaDecoder(model.spec, quantize_weights(model.weights, model.spec, "channel"))
    with pytest.raises(ValueError, match="fusable: False"):
        fp8.decode_step(None, tok, fuse=LayerGemvs())
    with pytest.raises(ValueError, match="fuse"):
        ModelRuntime(model, _config("float32", [1]), "cpu", fuse="sometimes")


def _config(dtype, buckets):
    return RuntimeConfig(num_qo_heads=2, num_kv_heads=1, head_dim=64, page_size=16, max_context_len=64,
                         buckets=buckets, dtype=dtype, backend="torch", kv_pool_pages=16)


def _logits(model, dtype, fuse, steps=3):
    """Prefill then `steps` decode steps' float32 logits [steps, B, V] and greedy tokens (fixed
    token feed), and the runtime's plan."""
    mrt = ModelRuntime(model, _config(dtype, [1, 3]), "cpu", keep_logits=True, fuse=fuse)
    prompts = [torch.arange(5) * 7 % V, torch.arange(11) * 3 % V, torch.arange(3) + 9]
    table = torch.arange(12, dtype=torch.int32).view(3, 4)
    mrt.prefill(prompts, table)
    lens = torch.tensor([len(p) for p in prompts], dtype=torch.int32)
    gen, out, toks = torch.Generator().manual_seed(1), [], []
    for _ in range(steps):
        lens += 1
        toks.append(mrt.decode(torch.randint(0, V, (3,), generator=gen), table, lens)[0].clone())
        out.append(mrt.last_logits(3).clone())
    return torch.stack(out), torch.stack(toks), mrt.fuse


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["llama", "qwen2"])                    # qwen2: qkv bias
def test_decode_step_fused_equals_unfused_float32(kind, monkeypatch):
    monkeypatch.delenv(ENV, raising=False)
    model = LlamaDecoder.from_hf(_hf(kind))
    ref, ref_tok, off = _logits(model, "float32", "off")
    got, tok, on = _logits(model, "float32", "on")
    assert off.table == {} and on.table == {1: LayerGemvs(), 3: LayerGemvs()}
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)
    assert torch.equal(tok, ref_tok)


@pytest.mark.slow
def test_decode_step_fused_equals_unfused_bf16(monkeypatch):
    monkeypatch.delenv(ENV, raising=False)
    model = LlamaDecoder.from_hf(_hf(), dtype=torch.bfloat16)
    ref, ref_tok, _ = _logits(model, "bfloat16", "off")
    got, tok, on = _logits(model, "bfloat16", "on")
    assert on.table == {1: LayerGemvs(), 3: LayerGemvs()}
    exact, _, _ = _logits(LlamaDecoder.from_hf(_hf()), "float32", "off")
    err_fused, err_unfused = (float((x - exact).abs().max()) for x in (got, ref))
    print(f"bf16 vs float32 logits: fused {err_fused:.4f}, unfused {err_unfused:.4f}")
    assert err_fused <= 2 * err_unfused + 1e-3, (err_fused, err_unfused)     # bf16 rounding, not a bug
    torch.testing.assert_close(got, ref, rtol=5e-2, atol=5e-2)
    top2 = ref.topk(2, dim=-1).values
    clear = (top2[..., 0] - top2[..., 1]) > 0.1                          # rows without a near tie
    assert torch.equal(tok[clear], ref_tok[clear])


@pytest.mark.slow
@pytest.mark.parametrize("split", [(1, 1), (2, 1)])          # down K = 200: S = 1 only
def test_measurement_runs_every_candidate_and_both_passes(split, monkeypatch):
    """plan_fuse's CUDA measurement (fuse.measure) with a stand-in timer that runs each timed
    function once on CPU: every (GEMM, config) GEMV pass and both layer passes run, and the
    fastest config per GEMM is kept."""
    import graphrt.model.fuse as fuse
    model = LlamaDecoder.from_hf(_hf())
    calls = []

    def timer(fn):
        calls.append(fn)
        fn()                                                             # runs on CPU (interpreter)
        return 1.0 + len(calls)
    monkeypatch.setattr(fuse, "_graph_us", timer)
    timings = {}
    best = fuse.measure(model, 2, timings, compare=True, split=split)
    assert len(calls) == 4 * len(CANDIDATES) + 2
    assert set(timings) == {(2, (g, c.name)) for g in fuse.GEMMS for c in CANDIDATES} | {(2, "fused"), (2, "unfused")}
    assert best == LayerGemvs(*[CANDIDATES[0]] * 4)                      # the earliest call timed fastest
    assert timings[(2, "fused")] < timings[(2, "unfused")] and choose_fused(timings, 2)     # 18 < 0.97 x 19
