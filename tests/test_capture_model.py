"""graphrt-capture --model (capture/model.py) on a tiny random checkpoint, eager on CPU: the cache
it writes passes --check and records what it was built for; `graphrt serve --graph-cache` with the
same flags loads from it and writes nothing into it (every file's listing and sha256 unchanged,
also after requests); another engine config or another model is refused in one line naming the
field (exit 2); bad input to graphrt-capture --model exits 2."""
from __future__ import annotations

import hashlib
import json
import os
from contextlib import ExitStack
from pathlib import Path

import pytest
import torch

from _checkpoints import write
from capture.cli import main as capture_main

pytest.importorskip("transformers")
pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU (eager) cache path")
ENV = ("FLASHINFER_WORKSPACE_BASE", "TRITON_CACHE_DIR")
FLAGS = ["--max-num-seqs", "2", "--max-model-len", "48"]


def _tree(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    saved = {k: os.environ.pop(k, None) for k in ENV}
    try:
        ckpt = write(tmp_path_factory, "gqa", shape="tiny-gqa", arch="llama", dtype="float32", seed=3)
        engine = tmp_path_factory.mktemp("eng") / "engine.yaml"
        engine.write_text("steps_per_graph: 1\n")            # fewer interpreted steps per warm request
        out = tmp_path_factory.mktemp("cap") / "cache"
        rc = capture_main(["--model", str(ckpt), "--out", str(out), "--device", "cpu",
                           "--engine-config", str(engine), *FLAGS])
        for k in ENV:
            assert os.environ.get(k) is None, k                # the compiler variables were restored
    finally:
        for k, v in saved.items():
            if v is not None:
                os.environ[k] = v
    assert rc == 0
    return ckpt, engine, out


def test_capture_writes_a_checked_cache_recording_what_it_was_built_for(built, capsys):
    ckpt, _, out = built
    data = json.loads((out / "manifest.json").read_text())
    engine = data["built_for"]["engine"]
    assert engine["max_batch"] == 2 and engine["max_model_len"] == 48 and engine["steps_per_graph"] == 1
    assert engine["dtype"] == "float32" and engine["kv_cache_dtype"] == "auto" and engine["quantization"] is None
    assert data["built_for"]["model"]["config_sha256"] == hashlib.sha256((ckpt / "config.json").read_bytes()).hexdigest()
    assert data["config"]["num_qo_heads"] == 4 and data["mode"] == "eager"
    assert {"graphrt", "torch", "triton"} <= set(data["environment"])
    assert capture_main(["--check", str(out)]) == 0


def _serve_args(ckpt, engine, out, *extra):
    from graphrt.serve.cli import build_parser
    return build_parser().parse_args(["--model", str(ckpt), "--device", "cpu", "--graph-cache", str(out),
                                      "--config", str(engine), *FLAGS, *extra])


def test_serve_warm_start_writes_nothing_into_the_cache(built, tmp_path, monkeypatch):
    from graphrt.cache.triton_cache import active
    from graphrt.engine.params import SamplingParams
    from graphrt.serve.cli import load
    ckpt, engine, out = built
    for k in ENV:
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "private"))   # where misses would go
    before = _tree(out)
    with ExitStack() as scope:
        llm, _ = load(_serve_args(ckpt, engine, out), keep=scope)
        assert active() is not None and active().private == (tmp_path / "private").resolve()
        assert os.environ["TRITON_CACHE_DIR"] == str((tmp_path / "private").resolve())
        outs = llm.generate([[3, 4, 5], [6, 7]], [SamplingParams(temperature=0.0, max_tokens=3),
                                                 SamplingParams(temperature=0.8, seed=1, max_tokens=3)],
                            use_tqdm=False)
        assert all(o.token_ids for o in outs)
        assert llm.startup.kernels_loaded == 0 and llm.startup.kernels_compiled == 0   # eager: interpreted
    assert active() is None and os.environ["TRITON_CACHE_DIR"] == str(tmp_path / "private")
    assert _tree(out) == before
    assert capture_main(["--check", str(out)]) == 0


def _serve_error(argv, capsys) -> str:
    from graphrt.serve.cli import main
    with pytest.raises(SystemExit) as e:
        main(argv)
    lines = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 2 and len(lines) == 1, lines
    return lines[0]


def test_serve_refuses_another_engine_config_or_model_naming_the_field(built, tmp_path_factory, capsys,
                                                                        monkeypatch):
    ckpt, engine, out = built
    for k in ENV:
        monkeypatch.delenv(k, raising=False)
    import socket
    with socket.socket() as s:                                 # a free port: bound before the checks
        s.bind(("127.0.0.1", 0))
        port = str(s.getsockname()[1])
    base = ["--device", "cpu", "--graph-cache", str(out), "--config", str(engine), "--port", port]
    line = _serve_error(["--model", str(ckpt), *base, "--max-num-seqs", "4", "--max-model-len", "48"], capsys)
    assert "built for another model or engine config" in line and "engine.max_batch: cache 2, this server 4" in line
    line = _serve_error(["--model", str(ckpt), *base, "--max-num-seqs", "2"], capsys)
    assert "engine.max_model_len: cache 48, this server 256" in line
    other = write(tmp_path_factory, "gqa2", shape="tiny-gqa", arch="qwen3", dtype="float32", seed=3)
    line = _serve_error(["--model", str(other), *base, *FLAGS], capsys)
    assert "model.config_sha256: cache" in line


@pytest.mark.parametrize("extra, words", [
    ([], "--model: needs --out DIR"),
    (["--out", "X", "--backend", "torch-splitkv"], "--backend: not with --model"),
])
def test_bad_model_arguments_exit_2(extra, words, capsys, tmp_path):
    with pytest.raises(SystemExit) as e:
        capture_main(["--model", str(tmp_path), *extra])
    assert e.value.code == 2 and words in capsys.readouterr().err


def test_engine_flags_need_model(capsys):
    with pytest.raises(SystemExit) as e:
        capture_main(["--config", "configs/tiny.yaml", "--max-num-seqs", "4"])
    assert e.value.code == 2 and "--max-num-seqs: only with --model" in capsys.readouterr().err


def test_steps_per_graph_is_pinned_as_given(built, tmp_path, capsys):
    """A cache records steps_per_graph as given ("auto" or K; cache_pin.py says why): "auto" serves
    "auto" whatever K it picks; a cache of K = 1 is refused by an "auto" server, naming the field."""
    from graphrt.cache.load import CacheMismatchError
    from graphrt.engine.config import EngineConfig
    from graphrt.serve.cache_pin import built_for, check_built_for
    ckpt, _, out = built
    auto = built_for(ckpt, EngineConfig(max_batch=2, max_model_len=48), "cpu")
    assert auto["engine"]["steps_per_graph"] == "auto"
    check_built_for(out, {"built_for": auto}, auto)
    k1 = json.loads((out / "manifest.json").read_text())                 # built with steps_per_graph: 1
    with pytest.raises(CacheMismatchError, match="engine.steps_per_graph: cache 1, this server 'auto'"):
        check_built_for(out, k1, auto)
    assert capture_main(["--model", str(ckpt), "--out", str(tmp_path / "c"), "--device", "cpu",
                         "--steps-per-graph", "fast"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("graphrt-capture: steps_per_graph: must be 'auto' or an int"), err


def test_model_errors_are_one_line(built, tmp_path, capsys):
    _, _, out = built
    assert capture_main(["--model", str(tmp_path / "none"), "--out", str(tmp_path / "c"), "--device", "cpu"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("graphrt-capture: ") and "Traceback" not in err[0], err
    assert capture_main(["--model", str(tmp_path), "--out", str(out), "--device", "cpu"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [f"graphrt-capture: --out {out} exists and is not empty"]


def test_serve_passes_the_caches_plans_to_the_engine(built, tmp_path, monkeypatch):
    """A cache whose manifest keeps decode plans (a GPU capture writes them: graphrt/model/plans.py)
    hands them to the engine it serves (LLM(plans=)); a CPU capture measures none and writes none."""
    import shutil

    import graphrt.engine
    from graphrt.serve.cli import load
    ckpt, engine, out = built
    assert "plans" not in json.loads((out / "manifest.json").read_text())
    copy = tmp_path / "cache"
    shutil.copytree(out, copy)
    (copy / "manifest.json").chmod(0o644)
    data = json.loads((copy / "manifest.json").read_text())
    data["plans"] = {"splitk": {"1": [1, 2], "2": [1, 1]}, "steps": {"k": 4, "step_us": 812.5}}
    (copy / "manifest.json").write_text(json.dumps(data))
    (copy / "manifest.json").chmod(0o444)
    for k in ENV:
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "private"))
    seen, real = [], graphrt.engine.LLM

    def spy(*a, plans=None, **kw):
        seen.append(plans)
        return real(*a, plans=plans, **kw)
    monkeypatch.setattr(graphrt.engine, "LLM", spy)
    llm, _ = load(_serve_args(ckpt, engine, copy))
    llm.shutdown()
    assert seen == [data["plans"]]
