"""Poison and surplus in checkpoint tensors (graphrt/checkpoint/files.py, loader.py, quant_loader.py):
non-finite weights (float and FP8, checked on the device the weights land on), NaN / Inf / zero /
negative FP8 scales, scale shapes per strategy, unreadable FP8 shards and malformed
quantization_config fields are one CheckpointError line naming the file and the tensor or field;
tensors config.json does not use are dropped with one warning line, and a tied checkpoint that
also stores lm_head.weight loads as transformers 5 loads it (compared with HF's own greedy tokens)."""
from __future__ import annotations

import json
import shutil
import warnings

import pytest
import torch

from _checkpoints import write
from _fp8_checkpoints import write_fp8
from graphrt.checkpoint.loader import CheckpointError, load_checkpoint

pytest.importorskip("transformers")
SHARD = "model-00001-of-00001.safetensors"


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    return write(tmp_path_factory, "poison", arch="llama", dtype="float32", seed=3)


@pytest.fixture(scope="module")
def fp8_src(tmp_path_factory):
    return write(tmp_path_factory, "poison_fp8src", arch="llama", dtype="bfloat16", seed=4)


def _copy(src, tmp_path, name="ck"):
    d = tmp_path / name
    shutil.copytree(src, d)
    return d


def _edit_tensors(file, fn):
    from safetensors.torch import load_file, save_file
    sd = load_file(str(file))
    fn(sd)
    save_file(sd, str(file), metadata={"format": "pt"})


def _one_line(e, *texts):
    msg = str(e.value)
    assert "\n" not in msg and len(msg) < 600, msg
    for t in texts:
        assert str(t) in msg, (t, msg)
    return msg


# ---- non-finite weights ------------------------------------------------------------------------
@pytest.mark.parametrize("tensor,value", [("model.layers.1.mlp.down_proj.weight", float("nan")),
                                          ("model.embed_tokens.weight", float("inf")),
                                          ("model.norm.weight", -float("inf"))])
def test_non_finite_weight_is_named(base, tmp_path, tensor, value):
    d = _copy(base, tmp_path)

    def poison(sd):
        sd[tensor].view(-1)[7] = value
    _edit_tensors(d / "model.safetensors", poison)
    with pytest.raises(CheckpointError) as e:
        load_checkpoint(d)
    _one_line(e, d / "model.safetensors", repr(tensor), "non-finite")
    with pytest.raises(CheckpointError) as e:                  # quantized while loading: the same
        load_checkpoint(d, quantization="fp8")
    _one_line(e, d / "model.safetensors", repr(tensor), "non-finite")


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_non_finite_check_reads_each_tensor_once_on_its_device(base, tmp_path, monkeypatch, device):
    """One reduction per tensor on the weights' device and one host sync: the flags are
    gathered, not read one by one (a .item() per tensor would be a sync per tensor)."""
    from graphrt.checkpoint import files as checkpoint_files
    calls = []
    real = torch.aminmax
    monkeypatch.setattr(checkpoint_files.torch, "aminmax", lambda t: calls.append(t.device) or real(t))
    syncs = []
    real_raise = checkpoint_files.FiniteCheck.raise_bad
    monkeypatch.setattr(checkpoint_files.FiniteCheck, "raise_bad",
                        lambda self: syncs.append(len(self._flags)) or real_raise(self))
    ck = load_checkpoint(base, device=device)
    n = len(checkpoint_files.expected_tensors(ck.spec, ck.arch))
    assert len(calls) == n and {d.type for d in calls} == {device} and ck.device.type == device
    assert syncs == [n]
    d = _copy(base, tmp_path)
    _edit_tensors(d / "model.safetensors", lambda sd: sd["model.layers.0.self_attn.o_proj.weight"].view(-1).__setitem__(
        0, float("nan")))
    with pytest.raises(CheckpointError) as e:
        load_checkpoint(d, device=device)
    _one_line(e, "'model.layers.0.self_attn.o_proj.weight'", "non-finite")


# ---- unused tensors and tied embeddings --------------------------------------------------------
def _hf_greedy(path, prompt, n):
    from transformers import AutoModelForCausalLM
    hf = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32).eval()
    seq = list(prompt)
    with torch.no_grad():
        for _ in range(n):
            seq.append(int(hf(torch.tensor([seq])).logits[0, -1].argmax()))
    return seq[len(prompt):]


def _graphrt_greedy(path, prompt, n):
    from graphrt import LLM, SamplingParams
    llm = LLM(path, device="cpu", backend="reference", max_batch=1, max_model_len=64)
    try:
        return list(llm.generate([prompt], SamplingParams(max_tokens=n, temperature=0.0,
                                                          ignore_eos=True))[0].token_ids), llm
    finally:
        llm.engine.shutdown()


PROMPT = [5, 17, 99, 3, 250, 41]


def test_extra_layer_is_dropped_with_one_warning_naming_every_tensor(base, tmp_path):
    d = _copy(base, tmp_path)
    cfg = json.loads((d / "config.json").read_text())
    cfg["num_hidden_layers"] = 1
    (d / "config.json").write_text(json.dumps(cfg))
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        ck = load_checkpoint(d)
    lines = [str(x.message) for x in w if "not used" in str(x.message)]
    assert len(lines) == 1 and "\n" not in lines[0], lines
    from safetensors import safe_open
    with safe_open(str(d / "model.safetensors"), framework="pt") as h:
        extra = [n for n in h.keys() if n.startswith("model.layers.1.")]
    assert len(extra) == 9 and all(n in lines[0] for n in extra) and "layers.0." not in lines[0]
    assert len(ck.weights["layers"]) == 1 and ck.spec.num_layers == 1
    got, _ = _graphrt_greedy(d, PROMPT, 6)                  # transformers drops them too
    assert got == _hf_greedy(d, PROMPT, 6)


def _tie(d, lm_head_same: bool):
    cfg = json.loads((d / "config.json").read_text())
    cfg["tie_word_embeddings"] = True
    (d / "config.json").write_text(json.dumps(cfg))
    if lm_head_same:
        _edit_tensors(d / "model.safetensors",
                      lambda sd: sd.__setitem__("lm_head.weight", sd["model.embed_tokens.weight"].clone()))


def test_tied_config_with_a_different_lm_head_loads_it_untied_like_transformers(base, tmp_path):
    d = _copy(base, tmp_path)
    _tie(d, lm_head_same=False)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        ck = load_checkpoint(d)
    lines = [str(x.message) for x in w if "lm_head.weight" in str(x.message)]
    assert len(lines) == 1 and "untied" in lines[0] and "\n" not in lines[0], lines
    assert ck.weights["lm_head"] is not ck.weights["embed"] and not ck.spec.tie_word_embeddings
    from safetensors.torch import load_file
    torch.testing.assert_close(ck.weights["lm_head"], load_file(str(d / "model.safetensors"))["lm_head.weight"],
                               rtol=0, atol=0)
    got, _ = _graphrt_greedy(d, PROMPT, 6)
    assert got == _hf_greedy(d, PROMPT, 6)                 # transformers 5 does not tie them either


def test_tied_config_with_an_equal_lm_head_stays_tied(base, tmp_path):
    d = _copy(base, tmp_path)
    _tie(d, lm_head_same=True)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        ck = load_checkpoint(d)
    assert not [x for x in w if "lm_head" in str(x.message)]
    assert ck.weights["lm_head"] is ck.weights["embed"] and ck.spec.tie_word_embeddings


# ---- FP8 checkpoints ---------------------------------------------------------------------------
def _fp8(fp8_src, tmp_path, strategy="channel", kind="compressed-tensors", name="q"):
    d = tmp_path / name
    write_fp8(fp8_src, d, kind, strategy=strategy, block=(64, 64), shards=1)
    return d


@pytest.mark.parametrize("value", [float("nan"), float("inf"), 0.0, -0.5])
def test_poison_fp8_scale_is_named(fp8_src, tmp_path, value):
    d = _fp8(fp8_src, tmp_path)
    scale = "model.layers.1.self_attn.v_proj.weight_scale"

    def poison(sd):
        sd[scale].view(-1)[3] = value
    _edit_tensors(d / SHARD, poison)
    with pytest.raises(CheckpointError) as e:
        load_checkpoint(d)
    _one_line(e, d / SHARD, repr(scale), "finite and > 0")


def test_nan_fp8_weight_is_named(fp8_src, tmp_path):
    d = _fp8(fp8_src, tmp_path)
    name = "model.layers.0.mlp.up_proj.weight"

    def poison(sd):
        sd[name].view(torch.uint8).view(-1)[11] = 0x7F         # e4m3fn NaN
    _edit_tensors(d / SHARD, poison)
    with pytest.raises(CheckpointError) as e:
        load_checkpoint(d)
    _one_line(e, d / SHARD, repr(name), "non-finite")


@pytest.mark.parametrize("strategy,kind,bad_shape", [
    ("tensor", "compressed-tensors", (2,)),          # per tensor: [] or [1]
    ("channel", "compressed-tensors", (63, 1)),      # per channel: [N] or [N, 1] (k_proj: N = 64)
    ("channel", "compressed-tensors", (64, 2)),
    ("block", "fp8", (2, 2)),                        # 64 x 128 in 64 x 64 blocks: [1, 2]
])
def test_wrong_scale_shape_names_file_and_tensor(fp8_src, tmp_path, strategy, kind, bad_shape):
    d = _fp8(fp8_src, tmp_path, strategy, kind)
    suffix = "weight_scale" if kind == "compressed-tensors" else "weight_scale_inv"
    scale = f"model.layers.0.self_attn.k_proj.{suffix}"
    _edit_tensors(d / SHARD, lambda sd: sd.__setitem__(scale, torch.full(bad_shape, 0.01)))
    with pytest.raises(CheckpointError) as e:
        load_checkpoint(d)
    _one_line(e, d / SHARD, repr(scale), list(bad_shape))


@pytest.mark.parametrize("case", ["truncated", "garbage_header", "empty"])
def test_unreadable_fp8_shard_is_one_line(fp8_src, tmp_path, case):
    d = _fp8(fp8_src, tmp_path)
    f = d / SHARD
    data = f.read_bytes()
    f.write_bytes({"truncated": data[:len(data) // 2], "garbage_header": b"\x07garbage" * 64,
                   "empty": b""}[case])
    with pytest.raises(CheckpointError) as e:
        load_checkpoint(d)
    _one_line(e, f, "tensor 'model.")


@pytest.mark.parametrize("edit,field", [
    (lambda q: q["config_groups"]["group_0"].update(weights="x"), "config_groups.group_0.weights"),
    (lambda q: q["config_groups"]["group_0"].update(input_activations=[8]),
     "config_groups.group_0.input_activations"),
    (lambda q: q.update(ignore=["re:(["]), "quantization_config.ignore[0]"),
    (lambda q: q["config_groups"]["group_0"]["weights"].update(strategy="block", block_structure=[True, 64]),
     "block_structure"),
])
def test_malformed_quantization_config_names_file_and_field(fp8_src, tmp_path, edit, field):
    d = _fp8(fp8_src, tmp_path)
    cfg = json.loads((d / "config.json").read_text())
    edit(cfg["quantization_config"])
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError) as e:
        load_checkpoint(d)
    _one_line(e, d / "config.json", field)


def test_fp8_modules_to_not_convert_bad_regex(fp8_src, tmp_path):
    d = _fp8(fp8_src, tmp_path, "block", "fp8")
    cfg = json.loads((d / "config.json").read_text())
    cfg["quantization_config"]["modules_to_not_convert"] = ["lm_head", "re:model.layers.(0"]
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError) as e:
        load_checkpoint(d)
    _one_line(e, d / "config.json", "modules_to_not_convert[1]")


def test_fp8_extra_tensors_warned_scales_and_input_scales_not(fp8_src, tmp_path):
    d = _fp8(fp8_src, tmp_path)

    def add(sd):
        sd["model.layers.0.self_attn.q_proj.input_scale"] = torch.ones(1)   # static activation scale
        sd["model.layers.7.mlp.up_proj.weight"] = torch.zeros(4, 4)          # no such layer
    _edit_tensors(d / SHARD, add)
    idx = json.loads((d / "model.safetensors.index.json").read_text())
    idx["weight_map"] |= {"model.layers.0.self_attn.q_proj.input_scale": SHARD,
                          "model.layers.7.mlp.up_proj.weight": SHARD}
    (d / "model.safetensors.index.json").write_text(json.dumps(idx))
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        load_checkpoint(d)
    lines = [str(x.message) for x in w if "not used" in str(x.message)]
    assert len(lines) == 1 and "1 tensor(s)" in lines[0] and "model.layers.7.mlp.up_proj.weight" in lines[0]
