"""Graph caches on CPU: build with graphrt-capture --out, check, load, and refuse what does not fit."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from capture.cli import main as capture_main
from graphrt import DecodeRuntime, PagedKVCache, load_config
from graphrt.cache import CacheMismatchError, check_cache, sha256
from graphrt.verify import verify_bucket

ROOT = Path(__file__).resolve().parents[1]
TINY = str(ROOT / "configs" / "tiny.yaml")


@pytest.fixture
def clean_env(monkeypatch):
    for name in ("FLASHINFER_WORKSPACE_BASE", "TRITON_CACHE_DIR"):
        monkeypatch.delenv(name, raising=False)  # restored after the test


@pytest.fixture(scope="module")
def built_cache(tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp:
        for name in ("FLASHINFER_WORKSPACE_BASE", "TRITON_CACHE_DIR"):
            mp.delenv(name, raising=False)
        out = tmp_path_factory.mktemp("built") / "gc"
        assert capture_main(["--config", TINY, "--out", str(out), "--no-progress"]) == 0
    return out


@pytest.fixture
def cache_dir(built_cache, tmp_path, clean_env):
    """A private copy of the once-built cache (tests edit it)."""
    out = tmp_path / "gc"
    shutil.copytree(built_cache, out)
    return out


def _edit_manifest(cache: Path, fn) -> None:
    path = cache / "manifest.json"
    data = json.loads(path.read_text())
    fn(data)
    path.write_text(json.dumps(data))


def test_cache_has_manifest_with_everything_a_server_needs(cache_dir):
    m = check_cache(cache_dir).data
    cfg = load_config(TINY)
    assert m["config_digest"] == cfg.digest() and m["buckets"] == list(cfg.buckets)
    assert set(m["bucket_backends"]) == {str(b) for b in cfg.buckets}
    for key in ("graphrt", "torch", "triton", "flashinfer", "cuda", "gpu", "compute_capability"):
        assert key in m["environment"]
    for row in m["rows"]:
        assert row["rel_err"] < 1e-4 and row["host_us"] > 0 and row["buffer_bytes"] > 0
    assert capture_main(["--check", str(cache_dir)]) == 0


def test_from_cache_loads_and_decodes(cache_dir):
    cfg = load_config(TINY)
    kv = PagedKVCache.allocate(cfg, 64, "cpu")
    rt = DecodeRuntime.from_cache(cache_dir, kv_cache=kv, device="cpu")
    assert rt.config.digest() == cfg.digest()
    assert verify_bucket(rt, 4, seed=3) < 1e-4


@pytest.mark.parametrize("key, value, words", [
    ("torch", "1.0.0", "torch"), ("gpu", "NVIDIA B200", "gpu"), ("flashinfer", "0.6.0", "flashinfer"),
    ("triton", "2.0.0", "triton"), ("compute_capability", "10.0", "compute_capability"),
])
def test_cache_for_another_machine_is_refused(cache_dir, key, value, words):
    _edit_manifest(cache_dir, lambda d: d["environment"].__setitem__(key, value))
    with pytest.raises(CacheMismatchError, match=f"(?s){words}.*rebuild"):
        check_cache(cache_dir)
    kv = PagedKVCache.allocate(load_config(TINY), 64, "cpu")
    with pytest.raises(CacheMismatchError):
        DecodeRuntime.from_cache(cache_dir, kv_cache=kv, device="cpu")
    assert capture_main(["--check", str(cache_dir)]) == 1


def test_cache_for_another_config_is_refused(cache_dir):
    other = load_config(TINY).replace(page_size=32)
    with pytest.raises(CacheMismatchError, match="config"):
        check_cache(cache_dir, config=other)
    _edit_manifest(cache_dir, lambda d: d["config"].__setitem__("head_dim", 128))
    with pytest.raises(CacheMismatchError, match="digest"):
        check_cache(cache_dir)


def test_missing_or_corrupt_artifact_is_refused(cache_dir):
    art = cache_dir / "triton" / "k" / "kernel.cubin"
    art.parent.mkdir(parents=True)
    art.write_bytes(b"\x01\x02compiled")
    _edit_manifest(cache_dir, lambda d: d["artifacts"].__setitem__("triton/k/kernel.cubin", sha256(art)))
    check_cache(cache_dir)
    art.write_bytes(b"\x01\x02tampered")
    with pytest.raises(CacheMismatchError, match="checksum mismatch: triton/k/kernel.cubin"):
        check_cache(cache_dir)
    art.unlink()
    with pytest.raises(CacheMismatchError, match="artifact missing"):
        check_cache(cache_dir)


def test_not_a_cache_and_nonempty_out_are_refused(tmp_path, clean_env):
    with pytest.raises(CacheMismatchError, match="not a graph cache"):
        check_cache(tmp_path)
    (tmp_path / "junk").write_text("x")
    assert capture_main(["--config", TINY, "--out", str(tmp_path), "--no-progress"]) == 2


def test_eager_cache_is_refused_on_a_gpu(cache_dir):
    cfg = load_config(TINY)
    kv = PagedKVCache.allocate(cfg, 64, "cpu")
    with pytest.raises(CacheMismatchError, match="without CUDA"):
        from graphrt.cache import open_cache
        open_cache(DecodeRuntime, cache_dir, kv_cache=kv, device="cuda", lazy=False, progress=False)
