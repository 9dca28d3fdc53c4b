"""Corrupt or inconsistent checkpoint files (graphrt/checkpoint/loader.py, graphrt/checkpoint/hf_files.py): each is one
CheckpointError line (a ValueError) naming the file and the field or tensor; `graphrt serve`
prints that line and exits 2."""
from __future__ import annotations

import json
import shutil
import time

import pytest

from _checkpoints import write
from graphrt import LLM
from graphrt.checkpoint.loader import CheckpointError

pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    return write(tmp_path_factory, "corrupt", arch="llama", dtype="float32", seed=1)


@pytest.fixture(scope="module")
def sharded(tmp_path_factory):
    return write(tmp_path_factory, "corrupt_sh", arch="llama", dtype="float32", seed=1, max_shard_mb=0.3)


def _edit_json(name, **changes):
    def f(d):
        raw = json.loads((d / name).read_text())
        raw.update(changes)
        (d / name).write_text(json.dumps(raw))
    return f


def _write(name, data: bytes):
    def f(d):
        (d / name).write_bytes(data)
    return f


def _truncate(name, keep):
    def f(d):
        b = (d / name).read_bytes()
        (d / name).write_bytes(b[:keep(len(b))])
    return f


def _dir_instead(name):
    def f(d):
        (d / name).unlink()
        (d / name).mkdir()
    return f


def _huge(name, size):
    """`name` made a sparse file of `size` bytes (its first bytes valid JSON): no disk, no time to write."""
    def f(d):
        with open(d / name, "r+b") as fh:
            fh.truncate(size)
    return f


def _loop(name):
    """`name` a symlink to itself (Path.exists / is_file say False: a loop looked missing)."""
    def f(d):
        (d / name).unlink()
        (d / name).symlink_to(d / name)
    return f


ST = "model.safetensors"
MB = 2**20
CASES = {  # id: (mutation, file named, text in the message)
    "truncated_header": (_truncate(ST, lambda n: 100), ST, "safetensors header"),
    "truncated_data": (_truncate(ST, lambda n: n - 1000), ST, ""),
    "empty": (_write(ST, b""), ST, "safetensors header"),
    "garbage": (_write(ST, b"\x07garbage" * 64), ST, "safetensors header"),
    "directory": (_dir_instead(ST), ST, "not a regular file"),
    "config_list": (_write("config.json", b"[1, 2]"), "config.json", "expected a JSON object"),
    "config_bad_json": (_write("config.json", b'{"a": 1,,}'), "config.json", "invalid JSON at line 1"),
    "zero_heads": (_edit_json("config.json", num_attention_heads=0), "config.json", "num_attention_heads"),
    "str_hidden": (_edit_json("config.json", hidden_size="128"), "config.json", "hidden_size"),
    "no_vocab": (_edit_json("config.json", vocab_size=None), "config.json", "vocab_size"),
    "bad_eps": (_edit_json("config.json", rms_norm_eps=-1), "config.json", "rms_norm_eps"),
    "kv_heads": (_edit_json("config.json", num_key_value_heads=3), "config.json", "num_key_value_heads"),
    "tie_str": (_edit_json("config.json", tie_word_embeddings="no"), "config.json", "tie_word_embeddings"),
    "archs_str": (_edit_json("config.json", architectures="LlamaForCausalLM"), "config.json", "architectures"),
    "eos_str": (_edit_json("generation_config.json", eos_token_id="x"), "generation_config.json", "eos_token_id"),
    "eos_big": (_edit_json("generation_config.json", eos_token_id=[1, 10**9]), "generation_config.json",
                "eos_token_id"),
    "gen_bad_json": (_write("generation_config.json", b"{"), "generation_config.json", "invalid JSON"),
    "tok_bad_json": (_write("tokenizer.json", b'{"version": '), "tokenizer.json", "invalid JSON"),
    "tok_cfg_bad_json": (_write("tokenizer_config.json", b"nope"), "tokenizer_config.json", "invalid JSON"),
    "tok_garbage": (_write("tokenizer.json", b'{"version": "1.0"}'), "tokenizer.json", "tokenizer"),
    "config_deep": (_write("config.json", b'{"a": ' * 5000 + b"1" + b"}" * 5000), "config.json",
                    "nested 5000 levels deep"),
    "gen_deep": (_write("generation_config.json", b"[" * 3000 + b"]" * 3000), "generation_config.json",
                 "nested 3000 levels deep"),
    "config_50mb": (_huge("config.json", 50 * MB), "config.json", "over graphrt's cap of 4194304 bytes"),
    "gen_50mb": (_huge("generation_config.json", 50 * MB), "generation_config.json", "cap of 4194304 bytes"),
    "tok_cfg_50mb": (_huge("tokenizer_config.json", 50 * MB), "tokenizer_config.json", "cap of 16777216 bytes"),
    "tok_200mb": (_huge("tokenizer.json", 200 * MB), "tokenizer.json", "cap of 134217728 bytes"),
    "config_loop": (_loop("config.json"), "config.json", "a symlink loop"),
    "gen_loop": (_loop("generation_config.json"), "generation_config.json", "a symlink loop"),
    "tok_loop": (_loop("tokenizer.json"), "tokenizer.json", "a symlink loop"),
    "tok_cfg_loop": (_loop("tokenizer_config.json"), "tokenizer_config.json", "a symlink loop"),
    "gelu": (_edit_json("config.json", hidden_act="gelu"), "config.json", "hidden_act: 'gelu'"),
    "rope_tiny": (_edit_json("config.json", rope_theta=1e-300), "config.json", "rope_theta"),
    "rope_one": (_edit_json("config.json", rope_theta=1), "config.json", "rope_theta"),
    "rope_params_tiny": (_edit_json("config.json", rope_parameters={"rope_type": "default", "rope_theta": 1e-300}),
                         "config.json", "rope_parameters.rope_theta"),
    "rope_yarn": (_edit_json("config.json", rope_scaling={"rope_type": "yarn", "factor": 4.0}), "config.json",
                  "rope_scaling.rope_type: 'yarn'"),
    "rope_llama3_partial": (_edit_json("config.json", rope_scaling={"rope_type": "llama3", "factor": 8.0}),
                            "config.json", "rope_scaling.low_freq_factor"),
    "rope_llama3_factor": (_edit_json("config.json", rope_scaling={
        "rope_type": "llama3", "factor": float("nan"), "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 64}), "config.json", "rope_scaling.factor"),
}


def _copy(src, tmp_path):
    d = tmp_path / "ck"
    shutil.copytree(src, d)
    return d


@pytest.mark.parametrize("case", sorted(CASES))
def test_corrupt_file_is_one_line_naming_it(base, tmp_path, case):
    mutate, fname, text = CASES[case]
    d = _copy(base, tmp_path)
    mutate(d)
    t0 = time.monotonic()
    with pytest.raises(CheckpointError) as e:
        LLM(d, device="cpu", backend="reference", max_batch=1, max_model_len=32)
    if case.endswith("mb"):                              # refused before parsing: no time spent on it
        assert time.monotonic() - t0 < 5.0
    msg = str(e.value)
    assert "\n" not in msg and str(d / fname) in msg and text in msg, msg
    assert isinstance(e.value, ValueError) and len(msg) < 600


@pytest.mark.parametrize("case", ["index_bad_json", "index_list", "index_map_values", "shard_truncated"])
def test_corrupt_sharded_checkpoint(sharded, tmp_path, case):
    d = _copy(sharded, tmp_path)
    idx = d / "model.safetensors.index.json"
    shard = sorted(d.glob("*.safetensors"))[0]
    if case == "index_bad_json":
        idx.write_text("{'weight_map': 1}")
        named = idx
    elif case == "index_list":
        idx.write_text("[]")
        named = idx
    elif case == "index_map_values":
        idx.write_text(json.dumps({"weight_map": {"model.norm.weight": 3}}))
        named = idx
    else:
        shard.write_bytes(shard.read_bytes()[:50])
        named = shard
    with pytest.raises(CheckpointError) as e:
        LLM(d, device="cpu", backend="reference", max_batch=1, max_model_len=32)
    assert "\n" not in str(e.value) and str(named) in str(e.value), str(e.value)


@pytest.mark.parametrize("case", ["garbage", "zero_heads", "eos_str", "config_50mb", "tok_loop"])
def test_serve_cli_exits_2_with_one_line(base, tmp_path, capsys, case):
    from graphrt.serve.cli import main
    d = _copy(base, tmp_path)
    CASES[case][0](d)
    with pytest.raises(SystemExit) as e:
        main(["--model", str(d), "--device", "cpu"])
    assert e.value.code == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and CASES[case][1] in lines[0], lines
