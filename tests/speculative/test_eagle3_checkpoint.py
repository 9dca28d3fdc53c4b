"""EAGLE-3 head directories: both public layouts load to the same fused weights, the converter
round-trips (tensors bit for bit, configs equivalent), and every inconsistency is one
CheckpointError line naming the tensor or field."""
from __future__ import annotations

import json

import pytest
import torch

from _eagle3_ref import H, V, original_config, random_tensors, target_spec
from graphrt.checkpoint.hf_files import CheckpointError
from graphrt.speculative.eagle3 import convert_head, default_layer_ids, load_eagle3, parse_config
from graphrt.speculative.eagle3.checkpoint import read_head, write_head
from graphrt.speculative.eagle3.convert import speculators_config

VD = 40


def _head(tmp_path, name="orig", *, cfg=None, tensors=None, layout="original", drop=(), bin_file=False):
    cfg = cfg or original_config(draft_vocab=VD)
    tensors = dict(tensors or random_tensors(draft_vocab=VD))
    for n in drop:
        tensors.pop(n)
    path = tmp_path / name
    if bin_file:
        path.mkdir()
        (path / "config.json").write_text(json.dumps(cfg))
        torch.save(tensors, path / "pytorch_model.bin")
        return path
    return write_head(path, cfg, tensors, layout)


def _same(a, b):
    for f in ("fc", "qkv", "o", "gate_up", "down", "lm_head", "norm", "input_norm", "hidden_norm",
              "post_attn_norm", "draft_ids"):
        assert torch.equal(getattr(a, f), getattr(b, f)), f


def test_original_loads_and_fuses(tmp_path):
    t = random_tensors(draft_vocab=VD)
    ck = load_eagle3(_head(tmp_path, tensors=t), target_spec())
    m = "midlayer.self_attn."
    assert ck.config.layout == "original" and ck.layer_ids == default_layer_ids(8) == (2, 4, 5)
    assert torch.equal(ck.weights.qkv, torch.cat([t[m + "q_proj.weight"], t[m + "k_proj.weight"],
                                                  t[m + "v_proj.weight"]]))
    assert torch.equal(ck.weights.draft_ids, torch.arange(0, 2 * VD, 2)) and ck.weights.embed is None


def test_pytorch_bin_and_bf16(tmp_path):
    ck = load_eagle3(_head(tmp_path, bin_file=True), target_spec(), dtype=torch.bfloat16)
    assert ck.weights.fc.dtype == torch.bfloat16 and ck.weights.draft_ids.dtype == torch.int64


def test_converter_round_trip(tmp_path):
    src = _head(tmp_path, cfg=original_config(draft_vocab=VD, eagle_config={"eagle_aux_hidden_state_layer_ids": [1, 3, 6]}))
    spec_dir = convert_head(src, tmp_path / "spec", "speculators", verifier="tiny-target")
    raw = json.loads((spec_dir / "config.json").read_text())
    assert raw["speculators_model_type"] == "eagle3" and raw["eagle_aux_hidden_state_layer_ids"] == [1, 3, 6]
    assert raw["speculators_config"]["verifier"]["name_or_path"] == "tiny-target"
    from safetensors import safe_open
    with safe_open(str(spec_dir / "model.safetensors"), "pt") as f:
        names = set(f.keys())
    assert "layers.0.self_attn.q_proj.weight" in names and not any(n.startswith("midlayer.") for n in names)
    back = convert_head(spec_dir, tmp_path / "back", "original")
    a, b, c = (load_eagle3(p, target_spec()) for p in (src, spec_dir, back))
    assert a.layer_ids == b.layer_ids == c.layer_ids == (1, 3, 6)
    _same(a.weights, b.weights)
    _same(a.weights, c.weights)
    _, ca, ta = read_head(src)
    _, cc, tc = read_head(back)
    assert set(ta) == set(tc) and all(torch.equal(ta[n], tc[n]) for n in ta)
    assert ca == cc
    again = convert_head(back, tmp_path / "spec2", "speculators", verifier="tiny-target")
    assert json.loads((again / "config.json").read_text()) == raw
    with pytest.raises(CheckpointError, match="already in the original layout"):
        convert_head(back, tmp_path / "x", "original")
    with pytest.raises(ValueError, match="layout"):
        convert_head(back, tmp_path / "x", "medusa")


def test_speculators_diff_dict_and_own_embeddings(tmp_path):
    """A transformer_layer_config without fields equal to LlamaConfig's defaults; an
    embed_tokens tensor inside the head is kept as the head's own table."""
    cfg = speculators_config(parse_config(original_config(draft_vocab=VD)), verifier="t")
    del cfg["transformer_layer_config"]["rms_norm_eps"]
    t = random_tensors(draft_vocab=VD)
    t["embed_tokens.weight"] = torch.randn(V, H)
    ck = load_eagle3(_head(tmp_path, cfg=cfg, tensors=t, layout="speculators"), target_spec())
    assert ck.config.rms_norm_eps == 1e-6 and torch.equal(ck.weights.embed, t["embed_tokens.weight"])


def test_identity_vocabulary_without_maps(tmp_path):
    ck = load_eagle3(_head(tmp_path, cfg=original_config(draft_vocab=V), tensors=random_tensors(draft_vocab=V),
                           drop=("d2t", "t2d")), target_spec())
    assert torch.equal(ck.weights.draft_ids, torch.arange(V))


def _bad_tensor(name, value):
    t = random_tensors(draft_vocab=VD)
    t[name] = value
    return t


BAD = [  # (config edits, tensors, target spec kwargs, message fragment)
    ({"architectures": ["LlamaForCausalLM"]}, None, {}, "architectures"),
    ({"num_hidden_layers": 2}, None, {}, "num_hidden_layers"),
    ({"vocab_size": V + 1}, None, {}, "vocab_size"),
    ({}, None, {"hidden": 2 * H}, "hidden_size"),
    ({}, None, {"vocab": V + 8}, "vocab_size"),
    ({"target_hidden_size": 2 * H}, None, {}, "target_hidden_size"),
    ({}, None, {"layers": 4}, r"eagle_aux_hidden_state_layer_ids \(default"),
    ({"eagle_config": {"eagle_aux_hidden_state_layer_ids": [2, 4, 9]}}, None, {}, "out of range"),
    ({"eagle_config": {"eagle_aux_hidden_state_layer_ids": [4, 2, 6]}}, None, {}, "ascending"),
    ({"eagle_aux_hidden_state_layer_ids": "2,4"}, None, {}, "list of ints"),
    ({"draft_vocab_size": 0}, None, {}, "draft_vocab_size"),
    ({"hidden_act": "gelu"}, None, {}, "hidden_act"),
    ({"rope_scaling": {"rope_type": "yarn"}}, None, {}, "rope_scaling"),
    ({}, _bad_tensor("fc.weight", torch.zeros(H, 2 * H)), {}, "'fc.weight' has shape"),
    ({}, _bad_tensor("lm_head.weight", torch.zeros(VD + 1, H)), {}, "'lm_head.weight' has shape"),
    ({}, _bad_tensor("norm.weight", torch.zeros(H, dtype=torch.int64)), {}, "'norm.weight' has dtype"),
    ({}, _bad_tensor("midlayer.extra.weight", torch.zeros(1)), {}, "'midlayer.extra.weight' is not part"),
    ({}, _bad_tensor("d2t", torch.full((VD,), 1000)), {}, "'d2t' maps draft ids"),
    ({}, _bad_tensor("d2t", torch.zeros(VD)), {}, "'d2t' is torch.float32"),
    ({}, _bad_tensor("d2t", torch.zeros(VD, dtype=torch.int64)), {}, "disagree"),
    ({}, _bad_tensor("t2d", torch.ones(V, dtype=torch.bool)), {}, "'t2d' marks 80"),
]


@pytest.mark.parametrize("edits, tensors, spec_kw, match", BAD)
def test_bad_head_is_one_line(tmp_path, edits, tensors, spec_kw, match):
    cfg = original_config(draft_vocab=VD)
    cfg.update(edits)
    path = _head(tmp_path, cfg=cfg, tensors=tensors)
    with pytest.raises(CheckpointError, match=match) as e:
        load_eagle3(path, target_spec(**spec_kw))
    assert "\n" not in str(e.value)


def test_missing_tensor_files_and_layout_mixups(tmp_path):
    with pytest.raises(CheckpointError, match="'midlayer.hidden_norm.weight' missing"):
        load_eagle3(_head(tmp_path, "a", drop=("midlayer.hidden_norm.weight",)), target_spec())
    with pytest.raises(CheckpointError, match="'d2t' missing"):
        load_eagle3(_head(tmp_path, "b", drop=("d2t", "t2d")), target_spec())
    with pytest.raises(CheckpointError, match="not a directory"):
        load_eagle3(tmp_path / "nope", target_spec())
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "config.json").write_text(json.dumps(original_config()))
    with pytest.raises(CheckpointError, match="no model.safetensors and no pytorch_model.bin"):
        load_eagle3(tmp_path / "c", target_spec())
    (tmp_path / "c" / "config.json").write_text("{")
    with pytest.raises(CheckpointError, match="invalid JSON"):
        load_eagle3(tmp_path / "c", target_spec())
    with pytest.raises(CheckpointError, match="speculators-layout name"):
        load_eagle3(_head(tmp_path, "d", cfg=original_config(draft_vocab=VD), layout="speculators"), target_spec())
    spec = speculators_config(parse_config(original_config(draft_vocab=VD)))
    with pytest.raises(CheckpointError, match="original-layout name"):
        load_eagle3(_head(tmp_path, "e", cfg=spec, layout="original"), target_spec())
    bad = dict(spec, speculators_model_type="eagle")
    with pytest.raises(CheckpointError, match="speculators_model_type"):
        load_eagle3(_head(tmp_path, "f", cfg=bad, layout="speculators"), target_spec())
    bad = dict(spec, speculators_config={"algorithm": "medusa"})
    with pytest.raises(CheckpointError, match="speculators_config.algorithm"):
        load_eagle3(_head(tmp_path, "g", cfg=bad, layout="speculators"), target_spec())
    bad = dict(spec, transformer_layer_config="llama")
    with pytest.raises(CheckpointError, match="transformer_layer_config"):
        load_eagle3(_head(tmp_path, "h", cfg=bad, layout="speculators"), target_spec())
    (tmp_path / "i").mkdir()
    (tmp_path / "i" / "config.json").write_text(json.dumps(original_config()))
    (tmp_path / "i" / "model.safetensors").write_bytes(b"not a safetensors file")
    with pytest.raises(CheckpointError, match="model.safetensors: reading tensors"):
        load_eagle3(tmp_path / "i", target_spec())
