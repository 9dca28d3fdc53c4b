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
