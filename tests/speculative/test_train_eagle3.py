"""tools/train_eagle3.py --smoke (CPU, micro sizes): trains a head, saves the original layout, the
head loads through graphrt's loader in both layouts (converter CLI), and the offline acceptance
length is measured; tools/eagle3_accept.py's round replay on scripted proposers; bad arguments."""
from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("transformers")
TOOLS = Path(__file__).resolve().parents[2] / "tools"


def _tool(name):
    if str(TOOLS) not in sys.path:
        sys.path.insert(0, str(TOOLS))
    return importlib.import_module(name)


def test_replay_counts_accepted_prefix_plus_one():
    acc = _tool("eagle3_accept")
    seq = list(range(100, 140))
    k = 4
    perfect = acc.replay(lambda: seq[11:15], lambda n, a: seq[n + a + 2: n + a + 2 + k], seq, 10, k)
    rounds, emitted = perfect
    assert emitted == (k + 1) * rounds and rounds == (len(seq) - 1 - 10 - 1) // (k + 1)
    wrong = acc.replay(lambda: [0] * k, lambda n, a: [0] * k, seq, 10, k)
    assert wrong[1] == wrong[0] == len(seq) - 1 - 10 - k             # one token a round
    # first two right, then wrong: 3 tokens a round
    two = acc.replay(lambda: seq[11:13] + [0, 0], lambda n, a: seq[n + a + 2: n + a + 4] + [0, 0], seq, 10, k)
    assert two[1] == 3 * two[0]


def test_smoke_trains_saves_loads_and_measures(tmp_path):
    train = _tool("train_eagle3")
    assert train.main(["--smoke", "--out", str(tmp_path), "--steps", "3", "--smoke-target-steps", "4",
                       "--eval-prompts", "1", "--eval-tokens", "12"]) == 0
    head = tmp_path / "eagle3"
    summary = json.loads((head / "train_eagle3.json").read_text())
    assert summary["steps"] == 3 and summary["ttt"] == 3 and summary["layer_ids"] == [2, 4, 5]
    a = summary["accept"]["head"]
    assert a["rounds"] >= 1 and 1.0 <= a["acceptance_length"] <= 5.0
    assert a["emitted"] == round(a["acceptance_length"] * a["rounds"]) or a["emitted"] / a["rounds"] == pytest.approx(
        a["acceptance_length"], abs=1e-3)
    import transformers
    from graphrt.model.spec import LlamaSpec
    from graphrt.speculative.eagle3 import load_eagle3
    spec = LlamaSpec.from_hf(transformers.AutoConfig.from_pretrained(str(tmp_path / "target")))
    ck = load_eagle3(head, spec)
    assert ck.config.layout == "original" and ck.layer_ids == (2, 4, 5)
    assert torch.equal(ck.weights.draft_ids, torch.arange(spec.vocab_size))
    conv = _tool("eagle3_convert")
    assert conv.main([str(head), str(tmp_path / "spec"), "--to", "speculators", "--verifier", "target"]) == 0
    ck2 = load_eagle3(tmp_path / "spec", spec)
    assert ck2.config.layout == "speculators" and torch.equal(ck2.weights.qkv, ck.weights.qkv)
    assert conv.main([str(tmp_path / "spec"), "--check", str(tmp_path / "target")]) == 0


def test_bad_arguments_exit_2(tmp_path, capsys):
    train = _tool("train_eagle3")
    assert train.main(["--out", str(tmp_path)]) == 2
    assert "--target is required" in capsys.readouterr().err
    assert train.main(["--smoke", "--out", str(tmp_path), "--ttt", "2"]) == 2
    assert "--ttt must be >= 3" in capsys.readouterr().err
    conv = _tool("eagle3_convert")
    assert conv.main([str(tmp_path / "missing"), str(tmp_path / "x"), "--to", "original"]) == 2
    assert "not a directory" in capsys.readouterr().err
    acc = _tool("eagle3_accept")
    assert acc.main(["--target", "x", "--head", "y", "--k", "0"]) == 2


def test_bench_head_writer_loads_in_public_layout(tmp_path):
    """tools/bench_eagle3_step.py's random head (the 8B shape on the GPU) at a small shape on CPU."""
    bench = _tool("bench_eagle3_step")
    shape = dict(hidden=64, intermediate=96, heads=2, kv_heads=1, head_dim=32, vocab=300, draft_vocab=120, layers=8)
    bench.write_random_head(tmp_path / "h", shape=shape, device="cpu")
    from graphrt.speculative.eagle3 import load_eagle3
    ck = load_eagle3(tmp_path / "h", bench.target_spec(shape), dtype=torch.bfloat16)
    assert ck.layer_ids == (2, 4, 5) and ck.weights.lm_head.shape == (120, 64)
    ids = ck.weights.draft_ids
    assert ids.shape == (120,) and bool((ids[1:] > ids[:-1]).all()) and int(ids.max()) < 300
    assert bench.main(["--batch", "x"]) == 2
