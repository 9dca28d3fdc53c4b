"""tools/train_tiny.py and tools/eval_ppl.py: the micro family trains on CPU, its checkpoints load
in HF transformers and graphrt.LLM and generate alike, eval_ppl scores them. The GPU test checks
the quality gates on the full family (trained here, or reused from GRAPHRT_TRAINED_DIR)."""
from __future__ import annotations

import importlib.util
import json
import math
import os
import sys
import time
from pathlib import Path

import pytest
import torch

TOOLS = Path(__file__).resolve().parent.parent / "tools"
MODELS = ("draft", "target", "target-qwen3")


def _tool(name: str):
    if str(TOOLS) not in sys.path:
        sys.path.insert(0, str(TOOLS))     # eval_ppl imports train_tiny as a sibling
    if name in sys.modules and Path(sys.modules[name].__file__) == TOOLS / f"{name}.py":
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, TOOLS / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod                 # dataclasses look their module up while it executes
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def micro(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("trained")
    assert _tool("train_tiny").main(["--out", str(out), "--size", "micro", "--device", "cpu", "--steps", "8"]) == 0
    return out


def test_split_is_fixed_and_disjoint():
    tt = _tool("train_tiny")
    files = tt.stdlib_files()
    held = [f for f in files if tt.is_heldout(f)]
    assert 0.02 < len(held) / len(files) < 0.09, (len(held), len(files))
    assert all(tt.is_heldout(f) for f in held) and not any("site-packages" in f.parts for f in files)
    train_names = {n for n, _ in tt.read_split(False, max_bytes=1 << 18)}
    held_names = {n for n, _ in tt.read_split(True, max_bytes=1 << 16)}
    assert train_names and held_names and not train_names & held_names


def test_micro_family_summary(micro):
    from transformers import AutoModelForCausalLM
    summary = json.loads((micro / "train.json").read_text())
    assert [m["name"] for m in summary["models"]] == list(MODELS)
    for m in summary["models"]:
        hf = AutoModelForCausalLM.from_pretrained(str(micro / m["name"]))
        assert m["params"] == sum(p.numel() for p in hf.parameters())
        assert m["steps"] == 8 and m["tokens"] == 8 * summary["batch"] * summary["seq_len"]
        # a model that learned nothing scores ln(vocab) nats/token
        assert m["heldout_loss"] < math.log(summary["vocab"]) - 0.1, m
        for f in ("config.json", "generation_config.json", "model.safetensors", "tokenizer.json"):
            assert (micro / m["name"] / f).is_file()
        tok_cfg = json.loads((micro / m["name"] / "tokenizer_config.json").read_text())
        assert "<|assistant|>" in tok_cfg["chat_template"]
    cfg = {n: json.loads((micro / n / "config.json").read_text()) for n in MODELS}
    assert cfg["target-qwen3"]["architectures"] == ["Qwen3ForCausalLM"]
    assert cfg["target"]["architectures"] == cfg["draft"]["architectures"] == ["LlamaForCausalLM"]
    assert len({c["vocab_size"] for c in cfg.values()}) == 1


@pytest.mark.parametrize("name", MODELS)
def test_llm_generates_like_hf(micro, name):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from graphrt import LLM, SamplingParams
    path = micro / name
    tok = AutoTokenizer.from_pretrained(str(path))
    prompt = tok("def read_file(path):\n    with open(", add_special_tokens=False)["input_ids"]
    llm = LLM(str(path), device="cpu", max_batch=2, steps_per_graph=2, max_model_len=64)
    try:
        out = llm.generate([prompt], SamplingParams(max_tokens=5, temperature=0.0, ignore_eos=True))[0]
        if name == "target":                # the chat template: once is enough
            chat = llm.chat([{"role": "user", "content": "import os"}], SamplingParams(max_tokens=2, ignore_eos=True))
            assert len(chat.token_ids) == 2
    finally:
        llm.engine.shutdown()
    hf = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32).eval()
    seq = list(prompt)
    with torch.no_grad():
        for _ in range(5):                  # HF greedy, not stopping at eos (like ignore_eos)
            seq.append(int(hf(torch.tensor([seq])).logits[0, -1].argmax()))
    want = seq[len(prompt):]
    assert list(out.token_ids) == want


def test_eval_ppl_on_micro(micro, tmp_path):
    ev = _tool("eval_ppl")
    js = tmp_path / "eval.json"
    rc = ev.main([str(micro / "draft"), "--device", "cpu", "--max-files", "2", "--window", "24",
                  "--decode-tokens", "4", "--prompts", "1", "--prompt-tokens", "8", "--gen-tokens", "4",
                  "--agree-with", str(micro / "target"), "--json", str(js)])
    assert rc == 0
    r = json.loads(js.read_text())
    assert r["files"] == 2 and r["tokens_scored"] > 0
    # graphrt float32 on CPU against HF float32: the same numbers up to rounding
    assert abs(r["prefill_ratio"] - 1) < 1e-4 and abs(r["decode"]["ratio"] - 1) < 1e-4, r
    assert r["decode"]["tokens"] == 4 and 1 < r["hf_fp32_ppl"] < r["params"]
    g = r["greedy"]
    assert g["prompts"] == 1 and g["identical"] + len(g["divergences"]) == 1
    h = g["hf_bf16"]                               # HF bfloat16's own greedy output, scored the same way
    assert h["identical"] + len(h["divergences"]) == 1 and 0 <= h["mean_prefix"] <= 4
    assert 0 <= g["mean_prefix"] <= 4 and (g["mean_prefix"] == 4) == (g["identical"] == 1)
    a = r["agree_with"]
    assert 0 <= a["top1_agreement"] <= 1 and a["positions"] == r["tokens_scored"] + r["files"]


def test_prompt_windows_take_several_per_file_when_files_are_few():
    ev = _tool("eval_ppl")
    seqs = [list(range(100 * f, 100 * f + 80)) for f in range(3)] + [list(range(5))]   # the last: too short
    ps = ev.prompt_windows(seqs, prompts=8, prompt_tokens=10)
    assert len(ps) == 8 and all(len(p) == 10 for p in ps)
    assert len({tuple(p) for p in ps}) == 8                      # distinct windows
    per_file = [sum(p[0] // 100 == f for p in ps) for f in range(3)]
    assert per_file == [3, 3, 2]                                 # round-robin over the files
    one_each = ev.prompt_windows(seqs, prompts=2, prompt_tokens=10)
    assert one_each == [seqs[0][35:45], seqs[1][35:45]]          # enough files: the middle of each


def test_bad_arguments_exit_2(micro, tmp_path, capsys):
    assert _tool("train_tiny").main(["--out", str(tmp_path), "--models", "huge"]) == 2
    assert "--models" in capsys.readouterr().err
    ev = _tool("eval_ppl")
    assert ev.main([str(tmp_path), "--device", "cpu"]) == 2
    assert "config.json" in capsys.readouterr().err
    assert ev.main([str(micro / "target"), "--device", "cpu", "--window", "20"]) == 2
    assert "--prompt-tokens" in capsys.readouterr().err
    assert ev.main([str(micro / "target"), "--device", "cpu", "--max-files", "0"]) == 2


@pytest.mark.gpu
def test_trained_family_quality_gates(tmp_path_factory):
    """The family's gates: bf16 perplexity within 1% of HF float32 (prefill and decode); over 64
    held-out prompts (several per file: the GPU image's stdlib holds few held-out files), graphrt
    bf16's greedy sequences identical to HF float32's at least as often as HF bf16's own minus 4,
    and its mean identical prefix at least HF bf16's minus 2 tokens (both counts measured in this
    run: a bf16 engine is held to bf16 arithmetic, not to float32); the draft at least 1.5x worse
    than the target. Trains the draft and the Llama target (about 2 min on an H200) unless
    GRAPHRT_TRAINED_DIR names a directory train_tiny.py already wrote (tools/device/trained.sh
    leaves one in /tmp/trained)."""
    root = os.environ.get("GRAPHRT_TRAINED_DIR")
    if root is None or not (Path(root) / "train.json").is_file():
        root = root or str(tmp_path_factory.mktemp("trained_full"))
        t0 = time.perf_counter()
        assert _tool("train_tiny").main(["--out", root, "--device", "cuda", "--models", "draft,target"]) == 0
        print(f"trained the family in {time.perf_counter() - t0:.0f} s into {root}")
    ev = _tool("eval_ppl")
    js = tmp_path_factory.mktemp("eval") / "target.json"
    assert ev.main([str(Path(root) / "target"), "--device", "cuda", "--prompts", "64", "--json", str(js)]) == 0
    r = json.loads(js.read_text())
    assert abs(r["prefill_ratio"] - 1) <= 0.01 and abs(r["decode"]["ratio"] - 1) <= 0.01, r
    g = r["greedy"]
    h = g["hf_bf16"]
    summary = {k: g[k] for k in ("prompts", "files", "identical", "mean_prefix", "graphrt_vs_hf_bf16_identical")}
    summary["hf_bf16"] = {k: h[k] for k in ("identical", "mean_prefix")}
    print(f"greedy gate: {summary}")
    assert g["prompts"] >= 64 and g["gen_tokens"] >= 48, summary
    assert g["identical"] >= h["identical"] - 4, summary
    assert g["mean_prefix"] >= h["mean_prefix"] - 2, summary
    js_d = js.with_name("draft.json")
    assert ev.main([str(Path(root) / "draft"), "--device", "cuda", "--prompts", "0", "--decode-tokens", "0",
                    "--agree-with", str(Path(root) / "target"), "--json", str(js_d)]) == 0
    d = json.loads(js_d.read_text())["agree_with"]
    assert d["ppl_ratio_self_over_target"] >= 1.5, d
