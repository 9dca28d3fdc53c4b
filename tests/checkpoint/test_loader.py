"""graphrt/checkpoint/loader.py: HF checkpoints (single file and sharded; Llama, Qwen2, Qwen3) into the fused
layout, compared tensor by tensor with transformers' own load; every bad checkpoint a clear error."""
from __future__ import annotations

import json

import pytest
import torch

from _checkpoints import write
from graphrt.checkpoint.loader import CheckpointError, load_checkpoint, load_tokenizer

transformers = pytest.importorskip("transformers")


@pytest.mark.parametrize("arch,shard", [("llama", None), ("qwen2", 0.2), ("qwen3", 0.3)])
def test_fused_weights_equal_hf_state_dict(tmp_path_factory, arch, shard):
    path = write(tmp_path_factory, arch, arch=arch, dtype="float32", max_shard_mb=shard)
    assert (path / "model.safetensors.index.json").is_file() == (shard is not None)
    ck = load_checkpoint(path)
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32)
    sd = hf.state_dict()
    w, s = ck.weights, ck.spec
    assert ck.arch == arch and ck.qk_norm == (arch == "qwen3") and ck.eos_token_ids == (1,)
    torch.testing.assert_close(w["embed"], sd["model.embed_tokens.weight"], rtol=0, atol=0)
    torch.testing.assert_close(w["lm_head"], sd["lm_head.weight"], rtol=0, atol=0)
    for i, layer in enumerate(w["layers"]):
        p = f"model.layers.{i}."
        qkv = torch.cat([sd[p + f"self_attn.{n}_proj.weight"] for n in "qkv"])
        torch.testing.assert_close(layer["qkv"], qkv, rtol=0, atol=0)
        gu = torch.cat([sd[p + "mlp.gate_proj.weight"], sd[p + "mlp.up_proj.weight"]])
        torch.testing.assert_close(layer["gate_up"], gu, rtol=0, atol=0)
        torch.testing.assert_close(layer["down"], sd[p + "mlp.down_proj.weight"], rtol=0, atol=0)
        torch.testing.assert_close(layer["o"], sd[p + "self_attn.o_proj.weight"], rtol=0, atol=0)
        torch.testing.assert_close(layer["input_norm"], sd[p + "input_layernorm.weight"], rtol=0, atol=0)
        if arch == "qwen2":
            bias = torch.cat([sd[p + f"self_attn.{n}_proj.bias"] for n in "qkv"])
            torch.testing.assert_close(layer["qkv_bias"], bias, rtol=0, atol=0)
        else:
            assert layer["qkv_bias"] is None
        if arch == "qwen3":
            torch.testing.assert_close(layer["k_norm"], sd[p + "self_attn.k_norm.weight"], rtol=0, atol=0)
        assert layer["qkv"].shape == ((s.num_heads + 2 * s.num_kv_heads) * s.head_dim, s.hidden_size)
    tok = load_tokenizer(path)
    assert len(tok) == s.vocab_size and tok.chat_template


def test_tied_embeddings_share_one_tensor_and_dtype_follows_file(tmp_path_factory):
    path = write(tmp_path_factory, "tied", arch="llama", dtype="bfloat16")
    cfg = json.loads((path / "config.json").read_text())
    cfg["tie_word_embeddings"] = True
    (path / "config.json").write_text(json.dumps(cfg))
    from safetensors.torch import load_file, save_file
    sd = load_file(str(path / "model.safetensors"))
    del sd["lm_head.weight"]                       # a tied checkpoint stores the embedding once
    save_file(sd, str(path / "model.safetensors"), metadata={"format": "pt"})
    ck = load_checkpoint(path)
    assert ck.weights["lm_head"] is ck.weights["embed"] and ck.dtype == torch.bfloat16
    assert load_checkpoint(path, dtype=torch.float32).weights["embed"].dtype == torch.float32


@pytest.fixture(scope="module")
def good(tmp_path_factory):
    return write(tmp_path_factory, "good", arch="llama", dtype="float32", max_shard_mb=0.3)


def _copy(good, tmp_path):
    import shutil
    dst = tmp_path / "ck"
    shutil.copytree(good, dst)
    return dst


def test_missing_files_are_named(good, tmp_path):
    with pytest.raises(CheckpointError, match="not a directory"):
        load_checkpoint(tmp_path / "nowhere")
    d = _copy(good, tmp_path)
    shard = sorted(d.glob("model-*.safetensors"))[1]
    shard.unlink()
    with pytest.raises(CheckpointError, match=f"{shard.name}: listed in"):
        load_checkpoint(d)
    (d / "config.json").unlink()
    with pytest.raises(CheckpointError, match="config.json: missing"):
        load_checkpoint(d)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        (d / f).unlink()
    with pytest.raises(CheckpointError, match="no tokenizer files"):
        load_tokenizer(d)


def test_unknown_architecture_is_refused(good, tmp_path):
    d = _copy(good, tmp_path)
    cfg = json.loads((d / "config.json").read_text())
    cfg["architectures"] = ["MistralForCausalLM"]
    (d / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match=r"architectures \['MistralForCausalLM'\] not supported"):
        load_checkpoint(d)


def _rewrite_tensor(d, name, tensor):
    from safetensors.torch import load_file, save_file
    index = json.loads((d / "model.safetensors.index.json").read_text())
    f = d / index["weight_map"][name]
    tensors = load_file(str(f))
    tensors[name] = tensor
    save_file(tensors, str(f), metadata={"format": "pt"})
    return f.name


def test_bad_shape_and_dtype_name_file_and_tensor(good, tmp_path):
    d = _copy(good, tmp_path)
    name = "model.layers.1.self_attn.k_proj.weight"
    fname = _rewrite_tensor(d, name, torch.zeros(65, 128))
    with pytest.raises(CheckpointError, match=rf"{fname}: tensor '{name}' has shape \[65, 128\], "
                                              r"config.json implies \[64, 128\]"):
        load_checkpoint(d)
    fname = _rewrite_tensor(d, name, torch.zeros(64, 128, dtype=torch.int8))
    with pytest.raises(CheckpointError, match=rf"{fname}: tensor '{name}' has dtype I8"):
        load_checkpoint(d)
    index = json.loads((d / "model.safetensors.index.json").read_text())
    del index["weight_map"]["model.norm.weight"]
    (d / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(CheckpointError, match="tensor 'model.norm.weight' missing"):
        load_checkpoint(d)


def _graphrt_imports(rel: str) -> list[tuple[str, str]]:
    """(module, name) of every `from graphrt... import name` in graphrt/<rel>, lazy ones included."""
    import ast
    from pathlib import Path
    src = (Path(__file__).resolve().parents[2] / "graphrt" / rel).read_text()
    return [(n.module, a.name) for n in ast.walk(ast.parse(src))
            if isinstance(n, ast.ImportFrom) and (n.module or "").startswith("graphrt") for a in n.names]


def test_loaders_share_one_public_checkpoint_files_module():
    """The float and FP8 loaders both read checkpoint/files.py: no private name crosses a module,
    and fp8_loader never imports loader (loader reaches fp8_loader lazily, one way)."""
    for rel in ("checkpoint/loader.py", "checkpoint/fp8_loader.py", "checkpoint/files.py", "checkpoint/decoder.py"):
        imports = _graphrt_imports(rel)
        assert not [x for x in imports if x[1].startswith("_")], (rel, imports)
    assert all(m != "graphrt.checkpoint.loader" for m, _ in _graphrt_imports("checkpoint/fp8_loader.py"))
    assert all(not m.startswith("graphrt.engine") for m, _ in _graphrt_imports("checkpoint/files.py"))


def test_model_quant_imports_nothing_from_the_model():
    """model/quant/ reads only itself and the kernels below it (no import circle with model/)."""
    from pathlib import Path
    quant = Path(__file__).resolve().parents[2] / "graphrt" / "model" / "quant"
    for f in sorted(quant.glob("*.py")):
        mods = {m for m, _ in _graphrt_imports(f"model/quant/{f.name}")}
        assert all(m.startswith(("graphrt.model.quant", "graphrt.kernels")) for m in mods), (f.name, mods)
