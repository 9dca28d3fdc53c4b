"""graphrt-capture (capture.cli) on the tiny preset: eager on CPU, verified against the reference."""
from __future__ import annotations

import json
import math
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from capture.cli import main
from graphrt import load_config

ROOT = Path(__file__).resolve().parent.parent
TINY = ROOT / "configs" / "tiny.yaml"


def test_tiny_capture_and_verify(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(ROOT)  # the documented invocation: a config path relative to the repo root
    out = tmp_path / "r.json"
    assert main(["--config", "configs/tiny.yaml", "--no-progress", "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    cfg = load_config(TINY)
    rows = report["rows"]
    assert [r["bucket"] for r in rows] == list(cfg.buckets) == [1, 2, 4, 8]
    for r in rows:
        assert math.isfinite(r["rel_err"]) and 0 <= r["rel_err"] < 1e-4, r
        assert r["buffer_bytes"] > 0
        assert r["backend"] == "torch-splitkv"
    assert report["config"]["name"] == "tiny" and report["config"]["buckets"] == [1, 2, 4, 8]
    assert report["mode"] == "eager"  # torch-splitkv is never captured (it reads the plan back)
    text = capsys.readouterr().out
    assert "all buckets verified" in text and "config tiny" in text


def test_unknown_key_is_one_line_not_a_traceback(tmp_path, capsys):
    data = yaml.safe_load(TINY.read_text())
    data["bogus_option"] = 3
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(data))
    out = tmp_path / "r.json"
    assert main(["--config", str(bad), "--no-progress", "--json", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and re.search(r"unknown key.*bogus_option", err[0])
    assert not out.exists()  # failed before writing a report


def test_missing_config_file_is_one_line_not_a_traceback(tmp_path, capsys):
    assert main(["--config", str(tmp_path / "none.yaml"), "--no-progress"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no such file" in err[0] and "Traceback" not in err[0]


def test_config_flag_required(capsys):
    with pytest.raises(SystemExit) as info:
        main([])
    assert info.value.code == 2
    assert "--config" in capsys.readouterr().err


def test_module_help():
    proc = subprocess.run([sys.executable, "-m", "capture", "--help"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "graphrt-capture" in proc.stdout and "--config" in proc.stdout


def test_auto_backend_skips_candidates_that_cannot_run(capsys):
    from capture.build import candidate_backends, pick_backends
    from graphrt import PagedKVCache, RuntimeConfig
    cfg = RuntimeConfig(num_qo_heads=4, num_kv_heads=2, head_dim=64, page_size=16, max_context_len=64,
                        buckets=[1, 2], dtype="float32", backend="auto", kv_pool_pages=16)
    assert candidate_backends(cfg, torch.device("cpu")) == ["torch-splitkv"]
    kv = PagedKVCache.allocate(cfg, 16, "cpu")
    choice = pick_backends(cfg, kv, torch.device("cpu"), ["xqa", "torch-splitkv"], progress=False)
    assert choice == {1: "torch-splitkv", 2: "torch-splitkv"}
    assert "backend 'xqa' skipped" in capsys.readouterr().out


@pytest.mark.parametrize("extra, words", [(["--steps", "0"], "--steps"), (["--device", "tpu"], "--device")])
def test_bad_cli_arguments_are_refused(extra, words, capsys):
    with pytest.raises(SystemExit) as info:
        main(["--config", str(TINY), *extra])
    assert info.value.code == 2 and words in capsys.readouterr().err


def test_version_and_help_with_defaults(capsys):
    import graphrt
    from capture.cli import build_parser
    with pytest.raises(SystemExit) as info:
        main(["--version"])                            # no --config needed
    assert info.value.code == 0
    assert capsys.readouterr().out.strip() == f"graphrt-capture (graphrt) {graphrt.__version__}"
    p = build_parser()
    flat = " ".join(p.format_help().split())
    for shown in ("--device auto|cpu|cuda|cuda:N", "(default: auto)", "(default: 1)",
                  "override the config's backend (default: the config's)",
                  "--json FILE write the per-bucket report here (default: none"):
        assert shown in flat, shown
    for a in p._actions:
        if a.option_strings == ["-h", "--help"] or a.option_strings == ["--version"]:
            continue
        assert a.help and len(a.help) > 10, a.option_strings
        if a.default not in (None, False):
            assert f"(default: {a.default})" in flat, a.option_strings
    assert "README:" not in flat
    # the doc section the help points at exists
    ref = re.search(r"\((docs/[\w.-]+\.md): ([^)]+)\)", flat)
    assert ref, flat
    assert f"## {ref.group(2)}" in (ROOT / ref.group(1)).read_text()


def test_bad_backend_is_an_argparse_error(capsys):
    with pytest.raises(SystemExit) as info:
        main(["--config", str(TINY), "--backend", "flashinfr"])
    err = capsys.readouterr().err
    assert info.value.code == 2 and "--backend: invalid choice: 'flashinfr'" in err


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a host without CUDA")
def test_cuda_without_cuda_is_one_line(capsys):
    assert main(["--config", str(TINY), "--device", "cuda", "--no-progress"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("graphrt-capture: --device cuda: torch ") \
        and "use --device cpu" in err[0]


@pytest.mark.parametrize("backend", ["flashinfer", "xqa", "auto", None])
def test_flashinfer_missing_on_cuda_is_one_line_with_the_install(monkeypatch, capsys, tmp_path, backend):
    # a CUDA host without FlashInfer, simulated: CUDA "available", the module hidden
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setitem(sys.modules, "flashinfer", None)
    cfg = tmp_path / "fi.yaml"
    data = yaml.safe_load(TINY.read_text()) | {"dtype": "bfloat16", "backend": "flashinfer"}
    cfg.write_text(yaml.safe_dump(data))
    extra = [] if backend is None else ["--backend", backend]
    assert main(["--config", str(cfg), "--device", "cuda", "--no-progress", *extra]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "needs FlashInfer, which is not installed" in err[0], err
    assert 'pip install "graphrt[gpu]"' in err[0] and "flashinfer-python==0.7.4" in err[0]
