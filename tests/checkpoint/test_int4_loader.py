"""int4 checkpoints through graphrt/checkpoint/loader.py (int4_loader.py and the GPTQ / AWQ /
compressed-tensors readers). tests/_int4_checkpoints.py writes each layout from a float model by
the published packing (explicit bit arithmetic), with the float32 truth; the loaded Int4Weights
dequantize to exactly that truth, compressed-tensors' own decompressor reads the written file the
same (when the package is installed), greedy tokens of LLM equal HF transformers float32 over the
truth, and every unsupported variant is one line naming the field."""
from __future__ import annotations

import json
import warnings

import pytest
import torch

from _checkpoints import write
from _int4_checkpoints import write_int4
from graphrt.checkpoint.loader import CheckpointError, load_checkpoint
from graphrt.model.quant.int4 import Int4Weight

PARTS = {"qkv": ("self_attn", ("q_proj", "k_proj", "v_proj")), "o": ("self_attn", ("o_proj",)),
         "gate_up": ("mlp", ("gate_proj", "up_proj")), "down": ("mlp", ("down_proj",))}


@pytest.fixture(scope="module")
def src(tmp_path_factory):
    return write(tmp_path_factory, "int4src", arch="llama", dtype="bfloat16")


def _assert_truth(ck, truth):
    for i, layer in enumerate(ck.weights["layers"]):
        for field, (block, names) in PARTS.items():
            w = layer[field]
            assert isinstance(w, Int4Weight), field
            ref = torch.cat([truth[f"model.layers.{i}.{block}.{n}.weight"] for n in names])
            assert torch.equal(w.dequantize(torch.float32), ref), (i, field)
    assert not isinstance(ck.weights["lm_head"], Int4Weight)
    assert torch.equal(ck.weights["embed"], truth["model.embed_tokens.weight"])


@pytest.mark.parametrize("kind,kw", [
    ("gptq", dict(sym=True)),                                    # v1: zeros stored as 7
    ("gptq", dict(sym=False, act_order=True)),                   # v1 asymmetric, desc_act g_idx
    ("gptq_v2", dict(sym=False, group_size=64)),
    ("gptq_v2", dict(sym=True, group_size=-1, act_order=True)),  # per channel: g_idx all 0
    ("awq", dict(sym=False, group_size=128)),
    ("awq", dict(sym=True, group_size=32)),
    ("compressed-tensors", dict(sym=True, group_size=64)),
    ("compressed-tensors", dict(sym=False, group_size=32, act_order=True)),
    ("compressed-tensors", dict(sym=False, group_size=-1)),
])
def test_loaded_weights_equal_the_independent_truth(src, tmp_path, kind, kw):
    truth = write_int4(src, tmp_path / "q", kind, **kw)
    ck = load_checkpoint(tmp_path / "q", dtype=torch.float32)
    _assert_truth(ck, truth)
    qkv = ck.weights["layers"][0]["qkv"]
    assert (qkv.perm is not None) == (kw.get("act_order", False) and kw.get("group_size", 32) != -1)
    assert (qkv.zero is None) == kw["sym"]


def test_mislabelled_gptq_v2_is_detected_from_its_zeros(src, tmp_path):
    truth = write_int4(src, tmp_path / "q", "gptq_v2", sym=True, label="gptq")
    with pytest.warns(UserWarning, match="checkpoint_format is 'gptq'.*stored as 8"):
        ck = load_checkpoint(tmp_path / "q", dtype=torch.float32)
    _assert_truth(ck, truth)


def test_compressed_tensors_decompressor_reads_the_same(src, tmp_path):
    pytest.importorskip("compressed_tensors")
    try:
        from compressed_tensors.compressors.pack_quantized.base import PackedQuantizationCompressor
        from compressed_tensors.quantization import QuantizationArgs, QuantizationScheme
    except ImportError as e:                                   # another package layout
        pytest.skip(f"compressed_tensors API: {e}")
    from safetensors.torch import load_file
    for sym, g in ((False, 32), (True, 64)):
        d = tmp_path / f"q{sym}"
        truth = write_int4(src, d, "compressed-tensors", sym=sym, group_size=g)
        sd = load_file(str(d / "model.safetensors"))
        scheme = QuantizationScheme(targets=["Linear"], weights=QuantizationArgs(
            num_bits=4, type="int", symmetric=sym, strategy="group", group_size=g))
        ck = load_checkpoint(d, dtype=torch.float32)
        m = "model.layers.1.mlp.down_proj"
        part = {s: sd[f"{m}.{s}"] for s in ("weight_packed", "weight_scale", "weight_shape", "weight_zero_point")
                if f"{m}.{s}" in sd}
        theirs = PackedQuantizationCompressor.decompress(part, scheme)["weight"].float()
        torch.testing.assert_close(theirs, truth[f"{m}.weight"], rtol=1e-3, atol=1e-3)
        torch.testing.assert_close(ck.weights["layers"][1]["down"].dequantize(), theirs, rtol=1e-3, atol=1e-3)


def test_quantize_while_loading(src):
    ck = load_checkpoint(src, dtype=torch.float32, quantization="int4")
    f = load_checkpoint(src, dtype=torch.float32)
    for field in ("qkv", "o", "gate_up", "down"):
        w4, w = ck.weights["layers"][1][field], f.weights["layers"][1][field]
        assert isinstance(w4, Int4Weight) and w4.group_size == 128 and w4.zero is not None
        step = w4.scale.float().repeat_interleave(128, 1)
        err = (w4.dequantize() - w).abs()       # RTN: half a step inside the range, one at its clipped edge
        assert bool((err <= step * 1.001).all()) and float((err / step).mean()) < 0.3
    assert not isinstance(ck.weights["lm_head"], Int4Weight)
    write_int4(src, src.parent / "qq", "awq")
    for q in ("int4", "fp8", "int8"):
        with pytest.raises(CheckpointError, match=f"quantization: '{q}' quantizes a float checkpoint, but "
                                                  f"config.json has a quantization_config \\(quant_method 'awq'"):
            load_checkpoint(src.parent / "qq", quantization=q)


def test_rtn_group_falls_back_where_128_does_not_divide_k():
    from graphrt.checkpoint.int4_loader import rtn_group
    assert rtn_group(128, 4096) == 128 and rtn_group(128, 576) == 64 and rtn_group(128, 96) == 32
    assert rtn_group(128, 200) == -1 and rtn_group(32, 576) == 32


def test_llm_greedy_equals_hf_over_dequantized_weights(src, tmp_path):
    """LLM over a GPTQ act-order checkpoint (plain, and with n-gram speculation: its verify step
    reads the same weights) and over quantization="int4": greedy tokens equal HF transformers'
    generate (float32, CPU) with the dequantized weights loaded."""
    import transformers
    from graphrt import LLM, SamplingParams
    truth = write_int4(src, tmp_path / "q", "gptq", sym=False, act_order=True)
    params = SamplingParams(max_tokens=5, temperature=0.0, ignore_eos=True)
    prompts = ["Hello world", [5, 6, 7, 5, 6, 7, 5, 6]]
    rtn = LLM(src, device="cpu", max_batch=2, quantization="int4")
    rtn_truth = {}
    for i, layer in enumerate(rtn.checkpoint.weights["layers"]):
        for field, (block, names) in PARTS.items():
            rows = torch.split(layer[field].dequantize(), [truth[f"model.layers.{i}.{block}.{n}.weight"].shape[0]
                                                           for n in names])
            rtn_truth |= {f"model.layers.{i}.{block}.{n}.weight": r for n, r in zip(names, rows)}
    spec = LLM(tmp_path / "q", device="cpu", max_batch=2, speculative={"method": "ngram", "num_tokens": 3})
    for llm, weights in ((spec, truth), (rtn, rtn_truth)):
        hf = transformers.AutoModelForCausalLM.from_pretrained(str(src), dtype=torch.float32).eval()
        hf.load_state_dict(weights, strict=False)
        hf.generation_config.eos_token_id = None
        assert isinstance(llm.checkpoint.weights["layers"][0]["down"], Int4Weight)
        for o in llm.generate(prompts, params):
            ref = hf.generate(torch.tensor([o.prompt_token_ids]), max_new_tokens=5, do_sample=False,
                              pad_token_id=0)[0, len(o.prompt_token_ids):].tolist()
            assert o.token_ids == ref


def _edit(path, fn):
    cfg = json.loads((path / "config.json").read_text())
    fn(cfg["quantization_config"])
    (path / "config.json").write_text(json.dumps(cfg))


def _w(q):
    return q["config_groups"]["group_0"]["weights"]


@pytest.mark.parametrize("kind,edit,match", [
    ("gptq", lambda q: q.update(bits=8), r"quantization_config.bits: 8 is not supported; graphrt reads 4"),
    ("gptq", lambda q: q.update(bits=3), r"quantization_config.bits: 3"),
    ("gptq", lambda q: q.update(bits=2), r"quantization_config.bits: 2"),
    ("gptq", lambda q: q.update(group_size=16), r"quantization_config.group_size: 16"),
    ("gptq", lambda q: q.update(checkpoint_format="marlin"), r"quantization_config.checkpoint_format: 'marlin'"),
    ("gptq", lambda q: q.update(lm_head=True), r"quantization_config.lm_head: True"),
    ("awq", lambda q: q.update(version="gemv"), r"quantization_config.version: 'gemv'"),
    ("awq", lambda q: q.update(version="marlin"), r"quantization_config.version: 'marlin'"),
    ("awq", lambda q: (q.pop("bits"), q.update(w_bit=8)), r"quantization_config.w_bit: 8"),
    ("compressed-tensors", lambda q: _w(q).update(num_bits=8), r"config_groups.group_0.weights.num_bits: 8"),
    ("compressed-tensors", lambda q: _w(q).update(strategy="tensor"), r"weights.strategy: 'tensor'"),
    ("compressed-tensors", lambda q: _w(q).update(type="float"), r"weights.type: 'float'"),
    ("compressed-tensors", lambda q: q["config_groups"]["group_0"].update(
        input_activations={"num_bits": 8}), r"config_groups.group_0.input_activations"),
])
def test_unsupported_variants_are_one_line(src, tmp_path, kind, edit, match):
    write_int4(src, tmp_path / "q", kind)
    _edit(tmp_path / "q", edit)
    with pytest.raises(CheckpointError, match=match) as e:
        load_checkpoint(tmp_path / "q")
    assert "\n" not in str(e.value) and "config.json" in str(e.value)


def test_bad_files_are_one_line(src, tmp_path):
    from safetensors.torch import load_file, save_file
    write_int4(src, tmp_path / "q", "gptq", sym=True)
    f = tmp_path / "q" / "model.safetensors"
    t = load_file(str(f))
    good = dict(t)
    t["model.layers.0.mlp.down_proj.qweight"] = t["model.layers.0.mlp.down_proj.qweight"][:-1].contiguous()
    save_file(t, str(f))
    with pytest.raises(CheckpointError, match=r"down_proj.qweight' is I32 \[31, 128\]; GPTQ implies I32 \[32, 128\]"):
        load_checkpoint(tmp_path / "q")
    t = dict(good)
    t["model.layers.0.mlp.down_proj.qzeros"] = torch.full_like(t["model.layers.0.mlp.down_proj.qzeros"], 0x55555555)
    save_file(t, str(f))
    with pytest.raises(CheckpointError, match=r"down_proj.qzeros': a symmetric.*all 7 \(gptq\) or all 8"):
        load_checkpoint(tmp_path / "q")
    t = dict(good)
    del t["model.layers.0.mlp.down_proj.scales"]
    save_file(t, str(f))
    with pytest.raises(CheckpointError, match=r"down_proj.scales' missing"):
        load_checkpoint(tmp_path / "q")
    t = dict(good)
    t["model.layers.0.mlp.down_proj.scales"] = torch.full_like(t["model.layers.0.mlp.down_proj.scales"], float("nan"))
    save_file(t, str(f))
    with pytest.raises(CheckpointError, match=r"down_proj \(int4 scales\)' holds non-finite"):
        load_checkpoint(tmp_path / "q")


def test_act_order_groups_and_tensor_parallel_refused(src, tmp_path):
    from safetensors.torch import load_file, save_file
    write_int4(src, tmp_path / "q", "gptq", sym=False, act_order=True)
    with pytest.raises(CheckpointError, match=r"quantization_config.quant_method 'gptq': int4 weights load on "
                                              r"one device; tensor_parallel=2"):
        load_checkpoint(tmp_path / "q", world_size=2, rank=0)
    with pytest.raises(CheckpointError, match=r"quantization='int4': int4 weights load on one device"):
        load_checkpoint(src, world_size=2, rank=0, quantization="int4")
    f = tmp_path / "q" / "model.safetensors"
    t = load_file(str(f))
    g = t["model.layers.0.mlp.down_proj.g_idx"]
    t["model.layers.0.mlp.down_proj.g_idx"] = torch.where(g == 0, 1, g).to(torch.int32)   # group 0 empty
    save_file(t, str(f))
    with pytest.raises(CheckpointError, match=r"down_proj': g_idx: groups must each hold group_size=32"):
        load_checkpoint(tmp_path / "q")
    t["model.layers.0.mlp.down_proj.g_idx"] = g
    t["model.layers.0.self_attn.k_proj.g_idx"] = torch.roll(t["model.layers.0.self_attn.k_proj.g_idx"], 1)
    save_file(t, str(f))
    with pytest.raises(CheckpointError, match=r"fused 0.qkv .*perm: parts with different act-order"):
        load_checkpoint(tmp_path / "q")


def test_serve_cli_takes_int4():
    from graphrt.serve.cli import build_parser
    assert build_parser().parse_args(["--model", "m", "--quantization", "int4"]).quantization == "int4"
