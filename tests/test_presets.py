"""Every preset in configs/ runs through graphrt-capture on a CPU: capture + verify, --out, --check.

The pipeline is the real one (prepare kernel under TRITON_INTERPRET with the device planner,
torch-splitkv executor, float32 reference check); only the verified buckets and lengths are
reduced, through the CLI's own --verify-buckets / --verify-lengths, to keep each preset to
seconds. The default CPU choice for every preset is checked against its budget separately.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch
import yaml

from capture.cli import main
from graphrt import load_config
from graphrt.attention.verify import (CPU_BUDGET, CPU_MAX_LEN, TOLERANCE, VerifyPlan, cpu_plan,
                            cpu_step_cost)

ROOT = Path(__file__).resolve().parent.parent
PRESETS = sorted((ROOT / "configs").glob("*.yaml"))
ENV = ("FLASHINFER_WORKSPACE_BASE", "TRITON_CACHE_DIR")  # --out points the compilers at the cache

pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU path (GPU: test_gpu.py)")


@pytest.fixture
def clean_env(monkeypatch):
    for name in ENV:
        monkeypatch.delenv(name, raising=False)  # restored after the test


def test_presets_found():
    names = {p.stem for p in PRESETS}
    assert {"tiny", "llama-3.1-8b", "llama-3.2-1b", "qwen2.5-7b"} <= names


def _test_choice(config) -> tuple[list[int], list[int]]:
    """Smallest bucket with >= 4 rows (every length used once) and lengths spanning pages and
    several planner tiles, kept short so a preset takes seconds on the interpreter."""
    bucket = next((b for b in config.buckets if b >= 4), config.buckets[-1])
    p = config.page_size
    long = min(config.max_context_len, 8 * p + 5)  # > min chunk (128 tokens at page 16): 2 tiles
    return [bucket], sorted({1, min(p, long), min(p + 1, long), long})


@pytest.mark.parametrize("preset", PRESETS, ids=[p.stem for p in PRESETS])
def test_preset_capture_out_check_on_cpu(preset, tmp_path, capsys, clean_env):
    config = load_config(preset)
    buckets, lengths = _test_choice(config)
    cache, report = tmp_path / "cache", tmp_path / "r.json"
    rc = main(["--config", str(preset), "--out", str(cache), "--json", str(report), "--no-progress",
               "--verify-buckets", ",".join(map(str, buckets)),
               "--verify-lengths", ",".join(map(str, lengths))])
    text = capsys.readouterr()
    assert rc == 0, text.err
    rows = {r["bucket"]: r for r in json.loads(report.read_text())["rows"]}
    assert list(rows) == list(config.buckets)
    for b, r in rows.items():
        assert r["backend"] == "torch-splitkv"
        if b in buckets:
            assert math.isfinite(r["rel_err"]) and r["rel_err"] <= TOLERANCE[config.dtype], r
            assert r["verify_lengths"] == lengths and r["host_us"] > 0
        else:
            assert r["rel_err"] is None and r["verify_lengths"] is None
    manifest = json.loads((cache / "manifest.json").read_text())
    assert manifest["config_digest"] == config.digest() and manifest["mode"] == "eager"
    if not VerifyPlan(tuple(buckets), tuple(lengths)).is_full(config):
        assert f"CPU: verified buckets {buckets} with lengths {lengths}" in text.out
        assert "full verification needs a GPU" in text.out
        assert "all buckets verified" not in text.out
    assert main(["--check", str(cache)]) == 0
    assert "OK" in capsys.readouterr().out


@pytest.mark.parametrize("preset", PRESETS, ids=[p.stem for p in PRESETS])
def test_default_cpu_plan_fits_the_budget(preset):
    """What a plain `graphrt-capture --config X` verifies on a CPU: bounded, never empty."""
    config = load_config(preset)
    plan = cpu_plan(config)
    assert plan is not None, f"{preset.name}: bucket {config.buckets[0]} alone exceeds the CPU budget"
    assert config.buckets[0] in plan.buckets and set(plan.buckets) <= set(config.buckets)
    assert sum(cpu_step_cost(config, b) for b in plan.buckets) <= CPU_BUDGET
    assert max(plan.lengths) == min(config.max_context_len, CPU_MAX_LEN) and min(plan.lengths) == 1


def _write(tmp_path, preset: str, **changes) -> str:
    data = yaml.safe_load((ROOT / "configs" / preset).read_text())
    data.update(changes)
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(data))
    return str(path)


def _refused(capsys, argv, *words) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "Traceback" not in err, err
    for w in words:
        assert w in err, err


def test_cuda_device_without_cuda_is_refused(capsys, tmp_path):
    _refused(capsys, ["--config", str(ROOT / "configs/llama-3.1-8b.yaml"), "--device", "cuda",
                      "--out", str(tmp_path / "c")], "no CUDA device", "--device cpu")
    assert not (tmp_path / "c").exists()


def test_gpu_only_backend_is_refused_on_cpu(capsys):
    _refused(capsys, ["--config", str(ROOT / "configs/tiny.yaml"), "--backend", "xqa"],
             "--backend xqa needs a CUDA GPU")


def test_kv_pool_too_large_for_memory_is_refused(capsys, tmp_path):
    cfg = _write(tmp_path, "llama-3.1-8b.yaml", kv_pool_pages=2**26)  # 2 TiB of bf16 K/V
    _refused(capsys, ["--config", cfg, "--out", str(tmp_path / "c")], "kv_pool_pages", "GiB")
    assert not (tmp_path / "c").exists()  # stopped before writing anything


def test_context_too_long_to_verify_on_cpu_is_refused(capsys, tmp_path):
    cfg = _write(tmp_path, "tiny.yaml", max_context_len=2**23, kv_pool_pages=64)  # 512k-page tables
    _refused(capsys, ["--config", cfg], "too slow to verify on a CPU", "--verify-buckets")


@pytest.mark.parametrize("flag, value, words", [
    ("--verify-buckets", "3", "must be among the config's buckets [1, 2, 4, 8]"),
    ("--verify-lengths", "0,16", "[1, max_context_len=512]")])
def test_bad_verify_choice_is_refused(capsys, flag, value, words):
    _refused(capsys, ["--config", str(ROOT / "configs/tiny.yaml"), flag, value], flag, words)
