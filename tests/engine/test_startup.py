"""Start-up (graphrt/engine/startup.py and what LLM() pays before it is ready): the heavy modules
a path does not need are not imported, the start-up line names every phase and its parts sum
within the total, the tokenizer's byte table and tokenizer.json are not worked over twice."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from _checkpoints import write
from graphrt.attention.graphs import CaptureStats, GraphKey
from graphrt.engine.startup import StartupTimes

ROOT = Path(__file__).resolve().parents[2]
HEAVY = ("transformers", "tokenizers", "triton", "flashinfer", "fastapi", "uvicorn", "safetensors")


def _imported_after(stmt: str) -> list[str]:
    code = f"import sys, json; {stmt}; print(json.dumps(sorted({{m.split('.')[0] for m in sys.modules}})))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, check=True,
                         timeout=300)
    return [m for m in json.loads(out.stdout.splitlines()[-1]) if m in HEAVY]


@pytest.mark.parametrize("stmt", ["import graphrt", "from graphrt import LLM, SamplingParams",
                                  "import graphrt.engine.llm", "import graphrt.serve.cli"])
def test_importing_the_entry_points_loads_no_heavy_module(stmt):
    # transformers (seconds: its lazy-module scan and config classes), Triton and the kernels,
    # FlashInfer, fastapi / uvicorn: imported only inside the calls that use them
    assert _imported_after(stmt) == []


def test_line_and_dict_name_every_phase():
    s = StartupTimes(t0=0.0, setup_s=0.5, weights_s=2.0, read_s=1.0, config_s=0.75, runtime_s=0.5,
                     capture_s=4.0, engine_s=1.0, tokenizer_s=0.5, total_s=9.0)
    s.from_capture([CaptureStats(4, 500.0, 2000.0, 0, GraphKey("decode", 4, steps=4)),
                    CaptureStats(1, 250.0, 1000.0, 0, GraphKey("decode", 1, steps=4)),
                    CaptureStats(1, 250.0, 500.0, 0, GraphKey("prefill", 1, query_len=16))])
    line = s.line(pages=8, pool_bytes=2**30)
    for part in ("ready in 9.00 s", "imports + checks 0.50 s", "weights read 2.00 s (config 0.75 s, tensors 1.00 s)",
                 "runtime + KV pool 0.50 s (8 pages, 1.00 GiB)", "kernels 3.50 s", "graphs 1.00 s (3 captured: "
                 "decode 2, prefill 1)", "engine 1.00 s (tokenizer 0.50 s)", "other 1.00 s"):
        assert part in line, (part, line)
    d = s.as_dict()
    assert d["graphs_by_phase"] == {"decode": 2, "prefill": 1} and d["other_s"] == pytest.approx(1.0)
    assert "t0" not in d and json.loads(json.dumps(d)) == d


def test_line_names_the_measured_plans_and_other_excludes_them():
    """The plans ModelRuntime measures inside its capture call (split-K, the decode backend, steps per
    graph) are named in the line and no longer count as "other"."""
    s = StartupTimes(t0=0.0, setup_s=0.5, weights_s=2.0, runtime_s=0.5, capture_s=4.0, engine_s=1.0, total_s=9.0,
                     plans={"split-K": 0.45, "decode backend": 0.05, "steps": 0.25})
    s.from_capture([CaptureStats(4, 500.0, 2000.0, 0, GraphKey("decode", 4, steps=4))])
    line = s.line(pages=8, pool_bytes=2**30)
    assert "plans 0.75 s (split-K 0.45 s, decode backend 0.05 s, steps 0.25 s)" in line, line
    assert "other 1.75 s" in line, line          # 1.0 outside the phases + (4.0 - 2.0 - 0.5 - 0.75) in capture
    d = s.as_dict()
    assert d["plans_s"] == pytest.approx(0.75) and d["other_s"] == pytest.approx(1.75)
    assert "plans" not in StartupTimes(t0=0.0).line(pages=1, pool_bytes=0)   # nothing measured: not named


@pytest.fixture(scope="module")
def llm(tmp_path_factory):
    from graphrt import LLM
    path = write(tmp_path_factory, "startup", shape="tiny", dtype="float32")
    return LLM(path, device="cpu", max_batch=2, max_model_len=64)


def test_llm_startup_parts_sum_within_the_total(llm):
    t = llm.startup
    assert 0 < t.config_s + t.read_s <= t.weights_s
    assert 0 < t.tokenizer_s <= t.engine_s
    assert t.setup_s + t.weights_s + t.runtime_s + t.capture_s + t.engine_s <= t.total_s + 1e-6
    assert t.num_graphs == 0 and t.graphs_by_phase == {}          # CPU: eager, nothing captured
    assert llm.checkpoint.config_s == t.config_s


def test_valid_tokenizer_json_is_parsed_once(llm, monkeypatch):
    # tokenizer.json is read by the tokenizers library only; graphrt's own JSON check (a second
    # full parse, over a second for Llama 3's 9 MB) runs when the tokenizer fails to load
    import graphrt.checkpoint.loader as loader
    import graphrt.checkpoint.tokenizer as tokenizer
    seen = []
    real = tokenizer.read_json
    monkeypatch.setattr(tokenizer, "read_json", lambda f, **kw: seen.append(f.name) or real(f, **kw))
    loader.load_tokenizer(llm.checkpoint.path)
    assert "tokenizer.json" not in seen and "tokenizer_config.json" in seen
    (bad := llm.checkpoint.path.parent / "badtok").mkdir()
    for f in llm.checkpoint.path.iterdir():
        (bad / f.name).write_bytes(f.read_bytes())
    (bad / "tokenizer.json").write_text('{"model": {"type": "BPE", "vocab": {"a": 0}, ')
    with pytest.raises(loader.CheckpointError, match="tokenizer.json: invalid JSON at line 1"):
        loader.load_tokenizer(bad)


def test_token_bytes_table_matches_the_per_character_rule(llm):
    from graphrt.engine.token_bytes import _byte_chars, token_bytes
    tok = llm.tokenizer
    tok.add_tokens(["two words", "caf\u00e9\u4e2d"])                  # not byte-level spelled: UTF-8
    table = token_bytes(tok, len(tok))
    assert table is not None
    inv, backend = _byte_chars(), tok.backend_tokenizer
    added = backend.get_added_tokens_decoder()
    for s, i in backend.get_vocab(with_added_tokens=True).items():
        want = b"" if i in added and added[i].special else (
            bytes(inv[c] for c in s) if all(c in inv for c in s) else s.encode())
        assert table[i] == want, (s, i)


def test_serve_without_fastapi_says_so_before_loading(monkeypatch):
    import importlib.util
    from types import SimpleNamespace

    from graphrt.engine import EngineConfig
    from graphrt.serve.flags import preflight
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "uvicorn" else real(name, *a))
    with pytest.raises(ValueError, match=r"needs uvicorn, which is not installed: pip install 'graphrt\[serve\]'"):
        preflight(SimpleNamespace(device="cpu"), EngineConfig())


def test_llm_start_imports_no_transformers(tmp_path_factory):
    # config.json (LlamaSpec.from_config) and tokenizer.json (graphrt/checkpoint/tokenizer.py) are read
    # without transformers: its import alone was 13 s of a 1B model's 22-25 s start on the GPU host
    path = write(tmp_path_factory, "no-transformers", shape="tiny", dtype="float32")
    stmt = (f"from graphrt import LLM; llm = LLM({str(path)!r}, device='cpu', max_batch=2, max_model_len=64); "
            "assert type(llm.tokenizer).__name__ == 'Tokenizer'; "
            "llm.tokenizer.apply_chat_template([{'role': 'user', 'content': 'hi'}], add_generation_prompt=True)")
    assert "transformers" not in _imported_after(stmt)
