"""graphrt/cache/triton_cache.py: Triton reads a graph cache and writes only its private folder.

The manager class directly (reads from the pinned folder, writes to the private one, never to the
pinned one; a group resolves its files by name inside the pinned key folder; one warning per
missing name; counts), read_through's knob set and restored (nesting refused; a Triton without the
knob: one warning and the old behaviour), and end to end through Triton's compiler: graphrt
kernels compiled for sm_90 (no GPU needed) into a cache by compilers_at, hashed into a manifest,
then compiled again under reading_from: all loaded from the cache, nothing written into it, and a
kernel the cache lacks compiled into the private folder with the warning naming it."""
from __future__ import annotations

import hashlib
import json
import logging
import os
import types

import pytest
import triton

from _sm90 import compile_for_sm90
from graphrt.cache import triton_cache
from graphrt.cache.triton_cache import ReadThroughCache, active, read_through

SO = __import__("sysconfig").get_config_var("EXT_SUFFIX")


def _tree(root) -> dict[str, str]:
    """{relative path: sha256} of every file under root."""
    out = {}
    for d, _, files in os.walk(root):
        for f in files:
            p = os.path.join(d, f)
            out[os.path.relpath(p, root)] = hashlib.sha256(open(p, "rb").read()).hexdigest()
    return out


@pytest.fixture
def dirs(tmp_path):
    pinned, private = tmp_path / "cache" / "triton", tmp_path / "private"
    key = pinned / "KEY"
    key.mkdir(parents=True)
    for name in ("k.json", "k.cubin"):
        (key / name).write_text(name)
    # the group records absolute paths of the machine that built it: never followed
    (key / "__grp__k.json").write_text(json.dumps({"child_paths": {
        "k.json": "/elsewhere/KEY/k.json", "k.cubin": "/elsewhere/KEY/k.cubin"}}))
    (key / f"cuda_utils{SO}").write_bytes(b"\x7fELF")
    return pinned, private


def test_reads_pinned_writes_private_only(dirs, caplog):
    pinned, private = dirs
    before = _tree(pinned)
    cache = ReadThroughCache(pinned, private)
    m = cache.manager("KEY")
    assert m.get_group("k.json") == {"k.json": str(pinned.resolve() / "KEY" / "k.json"),
                                     "k.cubin": str(pinned.resolve() / "KEY" / "k.cubin")}
    assert m.get_file(f"cuda_utils{SO}") == str(pinned.resolve() / "KEY" / f"cuda_utils{SO}")
    assert cache.loaded == ["kernel k", "module cuda_utils"] and not caplog.records
    with caplog.at_level(logging.WARNING, logger="graphrt.cache"):
        assert m.get_group("new.json") is None                    # missing: Triton compiles it next
        stage = m.put("ttir text", "new.ttir", binary=False)
        meta = m.put(b"{}", "new.json")
        m.put_group("new.json", {"new.ttir": stage, "new.json": meta})
        assert m.get_file(f"__triton_launcher{SO}") is None
        m.put(b"\x7fELF", f"__triton_launcher{SO}")
    warned = [r.getMessage() for r in caplog.records]
    assert len(warned) == 2 and "kernel new is missing" in warned[0] and str(private.resolve()) in warned[0]
    assert "module __triton_launcher is missing" in warned[1]
    assert cache.compiled == ["kernel new", "module __triton_launcher"] and cache.counts() == (2, 2)
    assert _tree(pinned) == before                                # nothing written into the cache
    assert set(_tree(private)) == {"KEY/new.ttir", "KEY/new.json", "KEY/__grp__new.json",
                                   f"KEY/__triton_launcher{SO}"}
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="graphrt.cache"):   # later lookups: the private copy
        again = cache.manager("KEY").get_group("new.json")
    assert again == {"new.ttir": str(private.resolve() / "KEY" / "new.ttir"),
                     "new.json": str(private.resolve() / "KEY" / "new.json")}
    assert cache.private_hits == ["kernel new"] and not caplog.records   # warned once per name
    assert "2 compiled into" in cache.summary() and "1 loaded from" in cache.summary()


def test_incomplete_or_escaping_groups_are_misses(dirs):
    pinned, private = dirs
    key = pinned / "KEY"
    (key / "__grp__gone.json").write_text(json.dumps({"child_paths": {"gone.json": "x"}}))
    (key / "__grp__up.json").write_text(json.dumps({"child_paths": {"../KEY/k.json": "x"}}))
    (key / "__grp__bad.json").write_text("{not json")
    cache = ReadThroughCache(pinned, private)
    m = cache.manager("KEY")
    assert m.get_group("gone.json") is None and m.get_group("up.json") is None
    assert m.get_group("bad.json") is None and cache.loaded == []


def test_private_dir_inside_the_cache_is_refused(dirs):
    pinned, _ = dirs
    with pytest.raises(ValueError, match="private_dir: .* lies inside the graph cache"):
        ReadThroughCache(pinned, pinned / "sub")


def test_read_through_sets_and_restores_the_knob(dirs):
    pinned, private = dirs
    assert active() is None
    before = triton.knobs.cache.manager_class
    with read_through(pinned, private) as cache:
        assert active() is cache and triton.knobs.cache.manager_class is cache.manager
        with pytest.raises(RuntimeError, match="already reads the graph cache"):
            with read_through(pinned, private):
                pass
    assert active() is None and triton.knobs.cache.manager_class is before


def test_a_triton_without_the_knob_falls_back_loudly(dirs, monkeypatch, caplog, tmp_path):
    from graphrt.cache.load import reading_from
    monkeypatch.setattr(triton, "knobs", types.SimpleNamespace())   # as Triton before 3.4
    assert not triton_cache.supported()
    cache_dir = dirs[0].parent
    with caplog.at_level(logging.WARNING, logger="graphrt.cache"):
        with reading_from(cache_dir, private_dir=tmp_path / "p") as cache:
            assert cache is None and os.environ["TRITON_CACHE_DIR"] == str((cache_dir / "triton").resolve())
    assert len(caplog.records) == 1 and "no cache-manager knob" in caplog.records[0].getMessage()


_E2E = r'''
import json, logging, os, sys
logging.basicConfig(level=logging.WARNING, format="%(message)s", stream=sys.stdout)
import warnings
warnings.simplefilter("ignore")
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from graphrt import load_config
from graphrt.cache.load import check_cache, compilers_at, reading_from, write_cache_manifest
from graphrt.kernels import activation, norm

cache_dir, private = sys.argv[1], sys.argv[2]

def build(fn, args, constexprs):
    sig = {n: args.get(n, "constexpr") for n in fn.arg_names}
    triton.compile(ASTSource(fn, sig, constexprs=constexprs), target=GPUTarget("cuda", 90, 32),
                   options={"num_warps": 4})
    print("ok", fn.__name__, constexprs)

def norms():
    for add in (True, False):
        build(norm._rms_norm_kernel, dict(x_ptr="*bf16", x_stride="i32", res_ptr="*bf16", res_stride="i32",
              w_ptr="*bf16", out_ptr="*bf16", out_stride="i32", H="i32", eps="fp32"),
              dict(BLOCK=1024, ADD=add, SPLIT=1))

os.makedirs(cache_dir, mode=0o700)
with compilers_at(cache_dir):                      # the build: compiled into the cache
    norms()
cfg = load_config("configs/tiny.yaml")
write_cache_manifest(cache_dir, cfg, [{"bucket": b, "backend_name": cfg.backend} for b in cfg.buckets],
                     mode="eager")
check_cache(cache_dir)
with reading_from(cache_dir, private_dir=private) as cache:   # a warm start: read, never written
    norms()
    build(activation._silu_mul_kernel, dict(x_ptr="*bf16", x_stride="i32", out_ptr="*bf16",
          out_stride="i32", I="i32"), dict(BLOCK=1024))    # not in the cache
    print("COUNTS", json.dumps({"loaded": cache.loaded, "compiled": cache.compiled}))
check_cache(cache_dir)                             # still exactly what the manifest lists
print("ok checked")
'''


def test_compiled_kernels_load_from_the_cache_and_nothing_is_written(tmp_path):
    cache_dir, private = tmp_path / "cache", tmp_path / "private"
    out = compile_for_sm90(_E2E + "\n", 6, argv=[str(cache_dir), str(private)])
    counts = json.loads(out.split("COUNTS ", 1)[1].splitlines()[0])
    assert counts["loaded"] == ["kernel _rms_norm_kernel"] * 2, counts
    assert counts["compiled"] == ["kernel _silu_mul_kernel"], counts
    missing = [line for line in out.splitlines() if "is missing from it" in line]
    assert len(missing) == 1 and "kernel _silu_mul_kernel" in missing[0] and str(private) in missing[0]
    assert any(f.endswith("_silu_mul_kernel.cubin") for f in _tree(private))
    assert not any("_silu_mul" in f for f in _tree(cache_dir))


def test_reading_from_restores_everything_when_the_block_raises(dirs, monkeypatch, tmp_path):
    from graphrt.cache.load import reading_from
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "mine"))
    monkeypatch.delenv("FLASHINFER_WORKSPACE_BASE", raising=False)
    with pytest.raises(KeyError):
        with reading_from(dirs[0].parent) as cache:          # default private: the user's Triton cache
            assert cache.private == (tmp_path / "mine").resolve()
            assert os.environ["TRITON_CACHE_DIR"] == str((tmp_path / "mine").resolve())
            raise KeyError("boom")
    assert active() is None and os.environ["TRITON_CACHE_DIR"] == str(tmp_path / "mine")
    assert "FLASHINFER_WORKSPACE_BASE" not in os.environ
