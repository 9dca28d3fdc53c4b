"""GGUF files (graphrt/checkpoint/gguf_file.py, gguf_tensors.py, gguf_tokenizer.py): tiny random
Llama (Llama 3 RoPE as rope_freqs), Qwen2 (biases) and Qwen3 (q/k norms) checkpoints written as
GGUF by the `gguf` package's GGUFWriter (tests/_gguf_files.py) in F32 / F16 / Q8_0 / Q4_0 / Q4_1
load into the same fused tensors as the safetensors checkpoint they came from (after the same
quantization round trip), generate the same tokens through LLM, tokenize as transformers' GGUF
reader does; bad files are one CheckpointError line naming the problem."""
from __future__ import annotations

import dataclasses
import json
import math
import shutil

import numpy as np
import pytest
import torch

from _checkpoints import write
from _gguf_files import hf_tensors, llama_cpp_permute, roundtrip, write_gguf
from graphrt.checkpoint.files import CheckpointError
from graphrt.checkpoint.gguf_tensors import unpermute_rope_rows
from graphrt.checkpoint.hub import resolve_model
from graphrt.checkpoint.loader import file_dtype, load_checkpoint, load_tokenizer

TEXTS = ["Hello world", "the graph token ka lo mi", "  two  spaces\nand a line", "<|user|>Hi<|end|>",
         "naïve café 日本 🤖", "don't 12345 x**2", ""]


@pytest.fixture(scope="module")
def hf_dirs(tmp_path_factory):
    """arch -> a tiny float32 HF checkpoint (llama: Llama 3.1 RoPE with llama.cpp's presets)."""
    out = {}
    for arch in ("llama", "qwen2", "qwen3"):
        path = write(tmp_path_factory, f"hf_{arch}", arch=arch, dtype="float32", seed=3)
        cfg = json.loads((path / "config.json").read_text())
        if arch == "llama":
            cfg["rope_scaling"]["original_max_position_embeddings"] = 8192
        (path / "config.json").write_text(json.dumps(cfg))
        out[arch] = path
    return out


def _roundtripped_dir(src, dst, qtype):
    """A copy of HF checkpoint `src` whose 2-D weights went through qtype's round trip."""
    from safetensors.torch import save_file
    shutil.copytree(src, dst)
    for f in dst.glob("*.safetensors"):
        f.unlink()
    save_file({n: roundtrip(t, qtype).contiguous() for n, t in hf_tensors(src).items()},
              str(dst / "model.safetensors"))
    return dst


def _fused(ck):
    w = ck.weights
    yield "embed", w["embed"]
    yield "final_norm", w["final_norm"]
    yield "lm_head", w["lm_head"]
    for i, layer in enumerate(w["layers"]):
        for k, v in layer.items():
            if v is not None:
                yield f"{i}.{k}", v


@pytest.mark.parametrize("arch,qtype", [("llama", "F32"), ("llama", "Q8_0"), ("qwen2", "F16"), ("qwen2", "Q4_0"),
                                        ("qwen3", "Q4_1"), ("qwen3", "F32")])
def test_gguf_loads_the_safetensors_weights(hf_dirs, tmp_path, arch, qtype):
    src = hf_dirs[arch]
    gguf = write_gguf(src, tmp_path / f"{arch}.{qtype}.gguf", qtype=qtype)
    ref_dir = src if qtype == "F32" else _roundtripped_dir(src, tmp_path / "ref", qtype)
    ck, ref = load_checkpoint(gguf, dtype=torch.float32), load_checkpoint(ref_dir, dtype=torch.float32)
    assert ck.arch == ref.arch == arch and ck.qk_norm == (arch == "qwen3")
    assert math.isclose(ck.spec.rms_norm_eps, ref.spec.rms_norm_eps, rel_tol=1e-6)   # stored as float32
    assert dataclasses.replace(ck.spec, rms_norm_eps=ref.spec.rms_norm_eps) == ref.spec
    if arch == "llama":
        assert ck.spec.rope_scaling["rope_type"] == "llama3" and ck.spec.rope_scaling["factor"] == 8.0
    assert ck.eos_token_ids == ref.eos_token_ids and ck.max_position_embeddings == ref.max_position_embeddings
    pairs = dict(_fused(ref))
    for name, t in _fused(ck):
        assert torch.equal(t, pairs[name]), name
    assert file_dtype(gguf) == {"F16": torch.float16}.get(qtype, torch.float32)
    assert load_checkpoint(gguf).dtype == file_dtype(gguf)


def test_unpermute_inverts_llama_cpp_permutation():
    g = torch.Generator().manual_seed(0)
    for heads, d, cols in ((3, 64, 5), (2, 8, 1), (4, 16, 0)):
        w = torch.randn(heads * d, cols, generator=g) if cols else torch.randn(heads * d, generator=g)
        permuted = torch.from_numpy(llama_cpp_permute(w.numpy(), heads))
        assert not torch.equal(permuted, w)
        assert torch.equal(unpermute_rope_rows(permuted, heads), w)
    with pytest.raises(ValueError, match="heads"):
        unpermute_rope_rows(torch.zeros(6, 2), 4)


@pytest.fixture(scope="module")
def llama_gguf(hf_dirs, tmp_path_factory):
    d = tmp_path_factory.mktemp("one_gguf")
    return write_gguf(hf_dirs["llama"], d / "tiny-llama.F32.gguf")


def test_llm_from_gguf_generates_as_from_safetensors(hf_dirs, llama_gguf):
    from graphrt import LLM, SamplingParams
    params = SamplingParams(max_tokens=5, temperature=0.0, ignore_eos=True)
    prompts = ["Hello world", [5, 6, 7, 8, 9, 10]]
    msgs = [{"role": "user", "content": "Hi there"}]
    outs = {}
    for key, model in (("hf", hf_dirs["llama"]), ("gguf", str(llama_gguf)), ("dir", llama_gguf.parent)):
        llm = LLM(model, device="cpu", max_batch=2, steps_per_graph=2, max_model_len=64)
        outs[key] = ([o.token_ids for o in llm.generate(prompts, params)], llm.chat(msgs, params).prompt_token_ids,
                     llm.checkpoint.eos_token_ids)
        llm.shutdown()
    assert outs["gguf"] == outs["hf"] and outs["dir"] == outs["hf"]
    assert all(len(t) == 5 for t in outs["hf"][0])


@pytest.mark.parametrize("pre", ["default", "qwen2", "llama-bpe"])
def test_tokenizer_matches_transformers_gguf_reader(hf_dirs, tmp_path, pre):
    transformers = pytest.importorskip("transformers")
    gguf = write_gguf(hf_dirs["qwen2"], tmp_path / "tok.gguf", qtype="F16", pre=pre)
    hf = transformers.AutoTokenizer.from_pretrained(str(tmp_path), gguf_file=gguf.name)
    tok = load_tokenizer(gguf)
    for text in TEXTS:
        ids = tok(text).input_ids
        assert ids == hf(text).input_ids, text
        assert tok.decode(ids) == hf.decode(ids)
        assert tok.decode(ids, skip_special_tokens=True) == hf.decode(ids, skip_special_tokens=True)
    if pre == "default":                              # the tokenizer.json it was written from
        src = load_tokenizer(hf_dirs["qwen2"])
        assert [tok(t).input_ids for t in TEXTS] == [src(t).input_ids for t in TEXTS]
    msgs = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}]
    want = hf.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)
    assert tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False) == want
    got_ids = hf.apply_chat_template(msgs, add_generation_prompt=True)
    got_ids = got_ids if isinstance(got_ids, list) else list(got_ids["input_ids"])
    assert tok.apply_chat_template(msgs, add_generation_prompt=True) == got_ids
    assert (tok.bos_token, tok.eos_token, tok.pad_token, tok.eos_token_id) == \
        (hf.bos_token, hf.eos_token, hf.pad_token, hf.eos_token_id)
    assert len(tok) == len(hf)


def test_resolve_model_takes_a_gguf_file(llama_gguf, tmp_path):
    assert resolve_model(str(llama_gguf)) == llama_gguf
    with pytest.raises(ValueError, match="revision: .*GGUF file"):
        resolve_model(str(llama_gguf), revision="main")
    with pytest.raises(CheckpointError, match="no such GGUF file"):
        load_checkpoint(resolve_model(str(tmp_path / "missing.gguf")))


def _replace(writer, key, add, value):
    """Overwrite metadata `key` already added to a GGUFWriter."""
    del writer.kv_data[0][key]
    add(key, value)


def _one_line(e) -> str:
    msg = str(e.value)
    assert "\n" not in msg
    return msg


def test_bad_gguf_files_are_one_line(hf_dirs, llama_gguf, tmp_path):
    import gguf as gg
    data = llama_gguf.read_bytes()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(data[: len(data) - 1000])
    with pytest.raises(CheckpointError) as e:
        load_checkpoint(cut)
    assert "truncated" in _one_line(e) and str(cut.name) in _one_line(e)
    head = tmp_path / "head.gguf"
    head.write_bytes(data[:3000])                    # inside the metadata
    with pytest.raises(CheckpointError, match="truncated"):
        load_checkpoint(head)
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"not a gguf file at all" * 10)
    with pytest.raises(CheckpointError, match="junk.gguf"):
        load_checkpoint(junk)

    other = write_gguf(hf_dirs["llama"], tmp_path / "gemma.gguf", arch="gemma2", skip_tokenizer=True)
    with pytest.raises(CheckpointError) as e:
        load_checkpoint(other)
    assert "general.architecture" in _one_line(e) and "'gemma2' not supported" in _one_line(e)

    def q8_1(w):                                     # a type gguf 0.19 cannot dequantize
        block, size = gg.GGML_QUANT_SIZES[gg.GGMLQuantizationType.Q8_1]
        w.add_tensor("blk.0.ffn_up.weight", np.zeros((256, 128 // block * size), dtype=np.uint8),
                     raw_dtype=gg.GGMLQuantizationType.Q8_1)
    bad_type = write_gguf(hf_dirs["llama"], tmp_path / "q81.gguf", drop=("model.layers.0.mlp.up_proj.weight",),
                          extra=q8_1, skip_tokenizer=True)
    with pytest.raises(CheckpointError) as e:
        load_checkpoint(bad_type)
    assert "'blk.0.ffn_up.weight' has type Q8_1" in _one_line(e) and "cannot dequantize" in _one_line(e)

    missing = write_gguf(hf_dirs["qwen3"], tmp_path / "nonorm.gguf", skip_tokenizer=True,
                         drop=("model.layers.1.self_attn.k_norm.weight",))
    with pytest.raises(CheckpointError, match="k_norm.weight' missing"):
        load_checkpoint(missing)

    partial = write_gguf(hf_dirs["qwen2"], tmp_path / "rot.gguf", skip_tokenizer=True,
                         extra=lambda w: _replace(w, "qwen2.rope.dimension_count", w.add_uint32, 32))
    with pytest.raises(CheckpointError, match="rope.dimension_count"):
        load_checkpoint(partial)

    two = tmp_path / "two"
    two.mkdir()
    shutil.copy(llama_gguf, two / "a.gguf")
    shutil.copy(llama_gguf, two / "b.gguf")
    with pytest.raises(CheckpointError, match="2 GGUF files"):
        load_checkpoint(two)
    with pytest.raises(CheckpointError, match="2 GGUF files"):
        load_tokenizer(two)


def test_bad_metadata_names_the_key(hf_dirs, tmp_path):
    bad = write_gguf(hf_dirs["llama"], tmp_path / "meta.gguf", skip_tokenizer=True,
                     extra=lambda w: _replace(w, "llama.feed_forward_length", w.add_string, "many"))
    with pytest.raises(CheckpointError, match="'llama.feed_forward_length': expected int"):
        load_checkpoint(bad)


def _same(a, b) -> bool:
    """Equal tensors (dtype and values), equal dataclasses of them (Fp8Weight), or equal values."""
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a.float(), b.float())
    if dataclasses.is_dataclass(a):
        return type(a) is type(b) and all(_same(getattr(a, f.name), getattr(b, f.name)) for f in dataclasses.fields(a))
    return a == b


def test_gguf_tensor_parallel_shards_and_fp8_match_safetensors(tmp_path_factory, tmp_path):
    """The loader's tensor-parallel slices and FP8 quantization read a GGUF as a safetensors checkpoint."""
    src = write(tmp_path_factory, "hf_gqa", shape="tiny-gqa", arch="qwen2", dtype="float32", seed=4)
    gguf = write_gguf(src, tmp_path / "gqa.gguf")
    for kw in ({"rank": 0, "world_size": 2}, {"rank": 1, "world_size": 2}, {"quantization": "fp8"}):
        a, b = load_checkpoint(gguf, dtype=torch.float32, **kw), load_checkpoint(src, dtype=torch.float32, **kw)
        ref = dict(_fused(b))
        for name, t in _fused(a):
            assert _same(t, ref[name]), (kw, name)
