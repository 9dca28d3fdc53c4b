"""FP8 KV cache through the engine: EngineConfig's kv_cache_dtype and the pool it sizes (one byte
per KV element: twice the pages from the same memory), a compressed-tensors checkpoint's
per-layer k_scale / v_scale into the runtime's caches (bad scales refused naming the tensor),
and LLM(kv_cache_dtype="fp8") on a tiny float32 checkpoint: the scales calibrated on the first
prefill equal an independent computation from HF's k_proj / v_proj outputs (layer 0 exactly;
later layers within 3%: their inputs already went through FP8 attention), and greedy tokens
agree with HF's float32 greedy (a float KV cache; graphrt's float run equals it, test_llm.py) on
most positions (agreement printed, not asserted exact)."""
from __future__ import annotations

import json
import logging

import pytest
import torch

from _checkpoints import write
from _fp8_checkpoints import write_fp8
from graphrt import LLM, SamplingParams
from graphrt.engine import EngineConfig
from graphrt.checkpoint.loader import CheckpointError, load_checkpoint
from graphrt.model.spec import LlamaSpec

transformers = pytest.importorskip("transformers")
PROMPTS = [[3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20], [42, 7, 99], "Hello world"]


@pytest.fixture(scope="module")
def src(tmp_path_factory):
    return write(tmp_path_factory, "fp8kv", arch="llama", dtype="float32", seed=4)


def test_engine_config_kv_dtype_and_pool_bytes():
    with pytest.raises(ValueError, match="kv_cache_dtype: 'int4' is not one of"):
        EngineConfig(kv_cache_dtype="int4")
    with pytest.raises(ValueError, match="kv_cache_dtype: 'float16' differs from dtype 'bfloat16'"):
        EngineConfig(kv_cache_dtype="float16", dtype="bfloat16")
    spec = LlamaSpec(vocab_size=1000, hidden_size=4096, intermediate_size=14336, num_layers=32,
                     num_heads=32, num_kv_heads=8, head_dim=128, rms_norm_eps=1e-5, rope_theta=5e5,
                     max_position_embeddings=8192, tie_word_embeddings=False,
                     attention_bias=False)
    mem = dict(max_model_len=8192, dtype_bytes=2, free_bytes=20 << 30, total_bytes=20 << 30)
    bf16, fp8 = EngineConfig(max_batch=64), EngineConfig(max_batch=64, kv_cache_dtype="fp8")
    p16, p8 = bf16.pool_pages_from_memory(spec, **mem), fp8.pool_pages_from_memory(spec, **mem)
    assert p8 + 1 - 2 * (p16 + 1) in (0, 1) and p8 < 64 * fp8.pages_per_seq(8192)   # 2x the pages (+ null page)
    n16 = bf16.memory_needed(spec, max_model_len=8192, dtype_bytes=2, pool_pages=1000)
    n8 = fp8.memory_needed(spec, max_model_len=8192, dtype_bytes=2, pool_pages=1000)
    assert 2 * n8["kv_pool"] == n16["kv_pool"] and n8["activations"] == n16["activations"]
    rc = fp8.runtime_config(spec, device_type="cpu", dtype="float32", max_model_len=64)
    assert rc.kv_fp8 and rc.kv_torch_dtype == torch.float8_e4m3fn


def _flat(pairs):
    return [float(x) for p in pairs for x in p]


def _with_kv_scales(src, dst, scales):
    write_fp8(src, dst, "compressed-tensors", strategy="channel", shards=2, kv_scales=scales)
    return dst


def test_checkpoint_kv_scales_load_and_refusals(src, tmp_path):
    scales = [(0.011, 0.022), (0.033, 0.044)]
    ck = load_checkpoint(_with_kv_scales(src, tmp_path / "ok", scales))
    assert _flat(ck.kv_scales) == pytest.approx(_flat(scales), rel=1e-6)
    for bad, tag in ((0.0, "zero"), (float("nan"), "nan"), (-1.0, "neg")):
        path = _with_kv_scales(src, tmp_path / tag, [(0.01, 0.02), (0.01, bad)])
        with pytest.raises(CheckpointError, match=r"model.layers.1.self_attn.v_scale'.*finite and > 0"):
            load_checkpoint(path)
    path = _with_kv_scales(src, tmp_path / "short", [(0.01, 0.02)])        # layer 1 has none
    with pytest.raises(CheckpointError, match="kv_cache_scheme is set but layer 1 has no tensors"):
        load_checkpoint(path)
    cfg = json.loads((path / "config.json").read_text())
    cfg["quantization_config"]["kv_cache_scheme"]["strategy"] = "head"
    (path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(ValueError, match="quantization_config.kv_cache_scheme.strategy: 'head'"):
        load_checkpoint(path)


def test_llm_uses_the_checkpoint_kv_scales(src, tmp_path):
    scales = [(0.011, 0.022), (0.033, 0.044)]
    llm = LLM(_with_kv_scales(src, tmp_path / "ck", scales), device="cpu", max_batch=2, steps_per_graph=2,
              kv_cache_dtype="fp8")
    mrt = llm.runtime.runtime
    assert mrt.kv_scale_source == "checkpoint"
    assert _flat(c.scale.tolist() for c in mrt.kv_caches) == pytest.approx(_flat(scales), rel=1e-6)
    out = llm.generate([[5, 6, 7]], SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True),
                       use_tqdm=False)
    assert len(out[0].token_ids) == 1 and mrt.kv_scale_source == "checkpoint"   # never recalibrated
    assert _flat(c.scale.tolist() for c in mrt.kv_caches) == pytest.approx(_flat(scales), rel=1e-6)


def _hf_kv_bounds(path, prompt_ids):
    """Independent calibration: per layer, max rotary-pair norm of k_proj's output and amax of
    v_proj's output over all prompt tokens, / 448 (the same rule; HF computes the projections)."""
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32).eval()
    d = hf.config.head_dim if getattr(hf.config, "head_dim", None) else hf.config.hidden_size // hf.config.num_attention_heads
    got = {}
    hooks = []
    for i, layer in enumerate(hf.model.layers):
        for name in ("k_proj", "v_proj"):
            hooks.append(getattr(layer.self_attn, name).register_forward_hook(
                lambda m, a, o, key=(i, name): got.setdefault(key, []).append(o.detach().reshape(-1, o.shape[-1]))))
    with torch.no_grad():
        for ids in prompt_ids:
            hf(torch.tensor([ids]))
    for h in hooks:
        h.remove()
    out = []
    for i in range(len(hf.model.layers)):
        k = torch.cat(got[(i, "k_proj")]).view(-1, d)
        v = torch.cat(got[(i, "v_proj")])
        pair = (k[:, : d // 2] ** 2 + k[:, d // 2:] ** 2).sqrt().max()
        out.append((float(pair) / 448, float(v.abs().max()) / 448))
    return out


def _hf_greedy(path, prompt_ids, n):
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32).eval()
    hf.generation_config.eos_token_id = None
    return [hf.generate(torch.tensor([ids]), max_new_tokens=n, do_sample=False, pad_token_id=0)[0, len(ids):].tolist()
            for ids in prompt_ids]


def test_llm_fp8_kv_calibrates_and_agrees_with_float_kv(src, caplog):
    params = SamplingParams(max_tokens=5, temperature=0.0, ignore_eos=True)
    with caplog.at_level(logging.INFO, logger="graphrt.model"):
        llm = LLM(src, device="cpu", max_batch=4, steps_per_graph=4, kv_cache_dtype="fp8")
        outs = llm.generate(PROMPTS, params, use_tqdm=False)
    mrt = llm.runtime.runtime
    assert all(c.k.dtype == torch.float8_e4m3fn for c in mrt.kv_caches)
    assert mrt.kv_scale_source == "calibrated"
    assert any("FP8 KV scales calibrated on the first prefill" in r.message for r in caplog.records)
    ids = [o.prompt_token_ids for o in outs]
    want = _hf_kv_bounds(src, ids)
    got = [c.scale.tolist() for c in mrt.kv_caches]
    assert got[0] == pytest.approx(list(want[0]), rel=1e-4)                 # layer 0: the same values
    assert _flat(got[1:]) == pytest.approx(_flat(want[1:]), rel=3e-2)       # after FP8 attention
    ref = _hf_greedy(src, ids, 5)
    same = sum(a == b for o, r in zip(outs, ref) for a, b in zip(o.token_ids, r))
    total = sum(len(r) for r in ref)
    print(f"FP8 KV vs float KV greedy agreement: {same}/{total} tokens")
    assert [o.token_ids[0] for o in outs] == [r[0] for r in ref]           # prefill logits: same argmax
    assert same >= total // 2


def test_serve_kv_cache_dtype_flag_and_yaml(tmp_path, capsys):
    pytest.importorskip("fastapi")
    from graphrt.serve import cli as serve_cli
    args = serve_cli.build_parser().parse_args
    assert serve_cli.resolve_configs(args(["/m", "--kv-cache-dtype", "fp8"]))[0].kv_cache_dtype == "fp8"
    y = tmp_path / "s.yaml"
    y.write_text("kv_cache_dtype: fp8\n")
    assert serve_cli.resolve_configs(args(["/m", "--config", str(y)]))[0].kv_cache_dtype == "fp8"
    assert serve_cli.resolve_configs(args(["/m", "--config", str(y), "--kv-cache-dtype", "auto"]))[0].kv_cache_dtype == "auto"
    y.write_text("kv_cache_dtype: int4\n")
    with pytest.raises(ValueError, match="kv_cache_dtype: 'int4' is not one of"):
        serve_cli.resolve_configs(args(["/m", "--config", str(y)]))
    with pytest.raises(SystemExit) as e:
        serve_cli.main(["/a", "--kv-cache-dtype", "int4"])
    assert e.value.code == 2 and "--kv-cache-dtype: invalid choice: 'int4'" in capsys.readouterr().err
