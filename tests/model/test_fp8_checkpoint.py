"""FP8 checkpoints through graphrt/checkpoint/loader.py (graphrt/checkpoint/fp8_loader.py): compressed-tensors
per-tensor / per-channel, transformers fp8 with block scales, `quantization="fp8"` on a float
checkpoint. A test helper rewrites a random float checkpoint into each format's on-disk layout
(F8_E4M3 weights, scale tensors, shards that split a weight from its scale, an `ignore` list);
the loaded model's logits are compared with an independent float32 reference over the
independently dequantized weights (block scales, weight-only: graphrt's float32 decoder over
them, exact up to float32 rounding; per-tensor / per-channel, W8A8: HF transformers over them
with every quantized linear layer's input rounded to e4m3 per row by a forward pre-hook) and with
the original weights (close).
Unsupported configs are refused naming the field."""
from __future__ import annotations

import json

import pytest
import torch

from _checkpoints import write
from _fp8_checkpoints import FP8_MAX, write_fp8
from graphrt import RuntimeConfig
from graphrt.checkpoint.loader import CheckpointError, load_checkpoint
from graphrt.checkpoint.decoder import build_model
from graphrt.model import LlamaDecoder
from graphrt.model.quant import Fp8Weight
from graphrt.model.runtime import ModelRuntime

pytest.importorskip("transformers")


def _logits(model, steps=2):
    cfg = RuntimeConfig(num_qo_heads=2, num_kv_heads=1, head_dim=64, page_size=16, max_context_len=64,
                        buckets=[2], dtype="float32", backend="torch", kv_pool_pages=8)
    mrt = ModelRuntime(model, cfg, "cpu", keep_logits=True)
    prompts = [torch.arange(6) * 5 % 300, torch.arange(13) * 7 % 300]
    table = torch.arange(8, dtype=torch.int32).view(2, 4)
    out = [mrt.prefill(prompts, table)]
    lens = torch.tensor([6, 13], dtype=torch.int32)
    for s in range(steps):
        lens += 1
        mrt.decode(torch.tensor([3 + s, 50 + s]), table, lens)
        out.append(mrt.last_logits(2).clone())
    return torch.stack(out)


def _hf_w8a8_logits(src, truth, quantized_head: bool, steps=2, *, f64=False):
    """HF float32 over `truth` with W8A8 activation rounding, at the positions _logits reads.
    f64: the activation's scale and x / scale in float64 (the same rounding rule a few ulps away:
    where that moves the logits, the reference sits on an e4m3 rounding boundary)."""
    import transformers
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(src), dtype=torch.float32).eval()
    hf.load_state_dict(truth, strict=False)

    def fake_quant(mod, args):
        x = args[0].double() if f64 else args[0]
        sc = (x.abs().amax(-1, keepdim=True) / FP8_MAX).clamp(min=1e-12)
        q = (x / sc).clamp(-FP8_MAX, FP8_MAX).float().to(torch.float8_e4m3fn).to(x.dtype) * sc
        return (q.float(),)
    for name, mod in hf.named_modules():
        if isinstance(mod, torch.nn.Linear) and (name != "lm_head" or quantized_head):
            mod.register_forward_pre_hook(fake_quant)
    prompts = [torch.arange(6) * 5 % 300, torch.arange(13) * 7 % 300]
    fed = [torch.tensor([3 + s for s in range(steps)]), torch.tensor([50 + s for s in range(steps)])]
    with torch.no_grad():
        rows = [hf(torch.cat([p, f])[None]).logits[0, len(p) - 1:] for p, f in zip(prompts, fed)]
    return torch.stack(rows, 1)                                      # [steps + 1, 2, V]


@pytest.fixture(scope="module")
def src(tmp_path_factory):
    return write(tmp_path_factory, "fp8src", arch="qwen3", dtype="bfloat16")


@pytest.mark.slow
@pytest.mark.parametrize("kind,strategy,ignore,scale_dtype", [
    ("compressed-tensors", "channel", ("lm_head",), torch.bfloat16),
    ("compressed-tensors", "tensor", (), torch.float32),
    ("fp8", "block", ("lm_head",), torch.float32)])
def test_fp8_checkpoint_logits(src, tmp_path, kind, strategy, ignore, scale_dtype):
    truth = write_fp8(src, tmp_path / "q", kind, strategy=strategy, ignore=ignore, scale_dtype=scale_dtype)
    ck = load_checkpoint(tmp_path / "q", dtype=torch.float32)
    layer = ck.weights["layers"][0]
    assert isinstance(layer["qkv"], Fp8Weight) and isinstance(layer["down"], Fp8Weight)
    assert isinstance(ck.weights["lm_head"], Fp8Weight) == ("lm_head" not in ignore)
    assert layer["qkv"].block == ((64, 64) if strategy == "block" else None)
    assert ck.weights["embed"].dtype == torch.float32
    got = _logits(build_model(ck))
    if strategy == "block":                                          # weight-only
        ref = _logits(LlamaDecoder.from_state_dict(ck.spec, truth))
        torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)
    else:                                                            # W8A8
        ref = _hf_w8a8_logits(src, truth, "lm_head" not in ignore)
        alt = _hf_w8a8_logits(src, truth, "lm_head" not in ignore, f64=True)
        rel = lambda a, b: (a - b).norm(dim=-1) / b.norm(dim=-1)  # noqa: E731  [steps + 1, 2]
        # a position where the float64 quantizer moves HF's own logits sits on an e4m3 rounding
        # boundary (one activation rounds the other way, ~3% of the logits: seen with one
        # random model); elsewhere graphrt must match HF's W8A8 arithmetic to 2e-3
        stable = rel(alt, ref) < 1e-4
        assert int(stable.sum()) >= stable.numel() - 1, rel(alt, ref)
        assert float(rel(got, ref)[stable].max()) < 2e-3, rel(got, ref)
        assert bool((rel(got, ref)[~stable] <= 2 * rel(alt, ref)[~stable] + 2e-3).all())
    full = _logits(build_model(load_checkpoint(src, dtype=torch.float32)))
    rel = float((got - full).norm() / full.norm())
    assert 0 < rel < 0.1


@pytest.mark.slow
def test_quantize_while_loading_per_channel(src):
    ck = load_checkpoint(src, dtype=torch.float32, quantization="fp8")
    qkv = ck.weights["layers"][1]["qkv"]
    assert isinstance(qkv, Fp8Weight) and qkv.block is None and qkv.scale.shape == (256,)
    assert not isinstance(ck.weights["lm_head"], Fp8Weight)           # lm_head stays in float
    f = load_checkpoint(src, dtype=torch.float32)
    err = (qkv.dequantize() - f.weights["layers"][1]["qkv"]).abs()
    assert float(err.max()) <= float(f.weights["layers"][1]["qkv"].abs().max()) * 2 ** -4
    got, full = _logits(build_model(ck)), _logits(build_model(f))
    assert 0 < float((got - full).norm() / full.norm()) < 0.1


def _edit(path, fn):
    cfg = json.loads((path / "config.json").read_text())
    fn(cfg["quantization_config"])
    (path / "config.json").write_text(json.dumps(cfg))


@pytest.mark.parametrize("edit,match", [
    (lambda q: q.update(quant_method="bitsandbytes"), r"quantization_config.quant_method: 'bitsandbytes'"),
    (lambda q: q.update(format="int-quantized"), r"quantization_config.format: 'int-quantized'"),
    (lambda q: q.update(format="pack-quantized"), r"config_groups.group_0.weights.num_bits: 8"),   # int4 reader
    (lambda q: q["config_groups"]["group_0"]["weights"].update(num_bits=4),
     r"config_groups.group_0.weights.num_bits: 4"),
    (lambda q: q["config_groups"]["group_0"]["weights"].update(type="int"),
     r"config_groups.group_0.weights.type: 'int'"),
    (lambda q: q["config_groups"]["group_0"]["weights"].update(strategy="group"),
     r"config_groups.group_0.weights.strategy: 'group'"),
    (lambda q: q.update(kv_cache_scheme={"num_bits": 8}), r"quantization_config.kv_cache_scheme"),
    (lambda q: q.update(ignore=["model.layers.0.self_attn.k_proj", "lm_head"]), r"quantization_config.ignore"),
])
def test_unsupported_compressed_tensors_configs_are_refused(src, tmp_path, edit, match):
    write_fp8(src, tmp_path / "q", "compressed-tensors", shards=1)
    _edit(tmp_path / "q", edit)
    with pytest.raises(ValueError, match=match):
        load_checkpoint(tmp_path / "q")


def test_other_refusals(src, tmp_path):
    write_fp8(src, tmp_path / "b", "fp8", strategy="block", block=(128, 128), shards=1)
    with pytest.raises(CheckpointError, match="k_proj.weight': 64 rows is not a multiple of the scale block rows 128"):
        load_checkpoint(tmp_path / "b")
    _edit(tmp_path / "b", lambda q: q.update(activation_scheme="static"))
    with pytest.raises(ValueError, match="quantization_config.activation_scheme: 'static'"):
        load_checkpoint(tmp_path / "b")
    with pytest.raises(ValueError, match="quantization: 'int8' is not supported"):
        load_checkpoint(src, quantization="int8")
    write_fp8(src, tmp_path / "c", "compressed-tensors", shards=1)   # a weight stored in bf16
    from safetensors.torch import load_file, save_file
    f = tmp_path / "c" / "model-00001-of-00001.safetensors"
    t = load_file(str(f))
    t["model.layers.0.mlp.down_proj.weight"] = t["model.layers.0.mlp.down_proj.weight"].to(torch.bfloat16)
    save_file(t, str(f))
    with pytest.raises(CheckpointError, match="down_proj.weight' has dtype BF16; the quantization_config makes it F8_E4M3"):
        load_checkpoint(tmp_path / "c")
    del t["model.layers.0.mlp.down_proj.weight_scale"]
    t["model.layers.0.mlp.down_proj.weight"] = t["model.layers.0.mlp.down_proj.weight"].to(torch.float8_e4m3fn)
    save_file(t, str(f))
    with pytest.raises(CheckpointError, match="down_proj.weight_scale' missing"):
        load_checkpoint(tmp_path / "c")


@pytest.mark.slow
def test_llm_greedy_equals_hf_over_dequantized_weights(src, tmp_path):
    """graphrt.LLM over an FP8 checkpoint and over `quantization="fp8"`: greedy tokens equal HF
    transformers' generate with the dequantized weights loaded (float32, CPU)."""
    import transformers
    from graphrt import LLM, SamplingParams
    truth = write_fp8(src, tmp_path / "q", "compressed-tensors", strategy="channel", shards=2)
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(src), dtype=torch.float32).eval()
    hf.load_state_dict(truth, strict=False)
    hf.generation_config.eos_token_id = None
    params = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
    for llm in (LLM(tmp_path / "q", device="cpu", max_batch=2),
                LLM(src, device="cpu", max_batch=2, quantization="fp8")):
        assert isinstance(llm.checkpoint.weights["layers"][0]["gate_up"], Fp8Weight)
        outs = llm.generate(["Hello world", [5, 6, 7, 8, 9, 10, 11]], params)
        for o in outs:
            ref = hf.generate(torch.tensor([o.prompt_token_ids]), max_new_tokens=6, do_sample=False,
                              pad_token_id=0)[0, len(o.prompt_token_ids):].tolist()
            assert o.token_ids == ref


def test_serve_cli_quantization_flag():
    from graphrt.serve.cli import build_parser
    assert build_parser().parse_args(["--model", "m", "--quantization", "fp8"]).quantization == "fp8"
    assert build_parser().parse_args(["--model", "m"]).quantization is None
    with pytest.raises(SystemExit) as e:
        build_parser().parse_args(["--model", "m", "--quantization", "int8"])
    assert e.value.code == 2
