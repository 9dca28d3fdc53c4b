"""Graph caches on CPU: build with graphrt-capture --out, check, load, and refuse what does not fit."""
from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

import pytest

from capture.cli import main as capture_main
from graphrt import DecodeRuntime, PagedKVCache, load_config
from graphrt.cache.load import CacheMismatchError, check_cache, sha256
from graphrt.attention.verify import verify_bucket

ROOT = Path(__file__).resolve().parents[2]
TINY = str(ROOT / "configs" / "tiny.yaml")


@pytest.fixture
def clean_env(monkeypatch):
    for name in ("FLASHINFER_WORKSPACE_BASE", "TRITON_CACHE_DIR"):
        monkeypatch.delenv(name, raising=False)  # restored after the test


@pytest.fixture(scope="module")
def build_run(tmp_path_factory):
    """graphrt-capture --out, once, under a umask that makes group-writable files: (cache dir,
    its stdout, the compiler variables after it returned)."""
    import contextlib
    import io
    with pytest.MonkeyPatch.context() as mp:
        for name in ("FLASHINFER_WORKSPACE_BASE", "TRITON_CACHE_DIR"):
            mp.delenv(name, raising=False)
        out = tmp_path_factory.mktemp("built") / "gc"
        old, stdout = os.umask(0o002), io.StringIO()
        try:
            with contextlib.redirect_stdout(stdout):
                assert capture_main(["--config", TINY, "--out", str(out), "--no-progress"]) == 0
        finally:
            os.umask(old)
        env_after = {name: os.environ.get(name) for name in ("FLASHINFER_WORKSPACE_BASE",
                                                             "TRITON_CACHE_DIR")}
    return out, stdout.getvalue(), env_after


@pytest.fixture(scope="module")
def built_cache(build_run):
    return build_run[0]


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
    with pytest.raises(CacheMismatchError, match="manifest.json: config does not match its config_digest"):
        check_cache(cache_dir)


def test_missing_or_corrupt_artifact_is_refused(cache_dir):
    art = cache_dir / "triton" / "k" / "kernel.cubin"
    art.parent.mkdir(parents=True)
    art.write_bytes(b"\x01\x02compiled")
    _edit_manifest(cache_dir, lambda d: d["artifacts"].__setitem__("triton/k/kernel.cubin", sha256(art)))
    check_cache(cache_dir)
    art.write_bytes(b"\x01\x02tampered")
    with pytest.raises(CacheMismatchError, match="triton/k/kernel.cubin: checksum mismatch"):
        check_cache(cache_dir)
    art.unlink()
    with pytest.raises(CacheMismatchError, match="kernel.cubin: listed in the manifest but missing"):
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
        from graphrt.cache.load import open_cache
        open_cache(DecodeRuntime, cache_dir, kv_cache=kv, device="cuda", lazy=False, progress=False)


# ---- trust: every file hashed, nothing unlisted, no symlinks, no paths out, pins ---------------
FI = "flashinfer/.cache/flashinfer/0.7.4/90/cached_ops/batch_decode_bf16"
SO = f"{FI}/batch_decode_bf16.so"
OBJ = f"{FI}/batch_decode.cuda.o"
TRITON = "triton/3QXTSKWB/prepare_kernel.cubin"


def _add_artifacts(cache: Path) -> None:
    """What a GPU cache holds (fake bytes): FlashInfer module, object, build file, generated source,
    Triton kernel and launcher, plus build-tool state; then re-hash as graphrt-capture does."""
    files = {SO: b"\x7fELF module v1" * 64, OBJ: b"\x7fELF object A" * 32,
             f"{FI}/build.ninja": b"rule cuda\n", TRITON: b"cubin" * 50,
             "flashinfer/.cache/flashinfer/0.7.4/90/generated/batch_decode_bf16/config.inc": b"#define X 1",
             "triton/3QXTSKWB/__grp__prepare_kernel.json": b"{}",
             "triton/LNCH/__triton_launcher.so": b"\x7fELF launcher",
             f"{FI}/.ninja_log": b"# ninja log v6\n",
             "flashinfer/.cache/flashinfer/0.7.4/90/cached_ops/tmp/batch_decode_bf16.lock": b""}
    for rel, data in files.items():
        (cache / rel).parent.mkdir(parents=True, exist_ok=True)
        (cache / rel).write_bytes(data)
    _resign(cache)


def _resign(cache: Path) -> None:
    """Recompute every artifact hash into the manifest: what someone who can write the cache can do."""
    from graphrt.cache.files import collect_artifacts
    _edit_manifest(cache, lambda d: d.__setitem__("artifacts", collect_artifacts(cache)))


def _digest(cache: Path) -> str:
    return sha256(cache / "manifest.json")


@pytest.fixture
def art_cache(cache_dir):
    _add_artifacts(cache_dir)
    return cache_dir


def _refused(cache: Path, pattern: str, **kw) -> str:
    with pytest.raises(CacheMismatchError, match=pattern) as e:
        check_cache(cache, **kw)
    return str(e.value)


def test_every_file_is_hashed_and_the_cache_loads(art_cache, capsys):
    m = check_cache(art_cache)
    arts = m.data["artifacts"]
    assert SO in arts and OBJ in arts and TRITON in arts and len(arts) == 7  # state files aside
    assert arts[OBJ] == sha256(art_cache / OBJ)  # objects by content, not size
    assert m.digest == _digest(art_cache)
    kv = PagedKVCache.allocate(load_config(TINY), 64, "cpu")
    rt = DecodeRuntime.from_cache(art_cache, kv_cache=kv, device="cpu", expect_digest=m.digest,
                                  config=load_config(TINY))
    assert verify_bucket(rt, 2, seed=1) < 1e-4
    capsys.readouterr()
    assert capture_main(["--check", str(art_cache), "--expect-digest", m.digest]) == 0
    assert f"manifest sha256 {m.digest}" in capsys.readouterr().out


def test_changed_module_is_refused(art_cache):
    (art_cache / SO).write_bytes(b"\x7fELF module v2" * 64)
    _refused(art_cache, f"{SO}: checksum mismatch")


def test_same_size_object_replacement_is_refused(art_cache):
    (art_cache / OBJ).write_bytes(b"\x7fELF object B" * 32)  # same size: sizes alone pass this
    _refused(art_cache, f"{OBJ}: checksum mismatch")


def test_every_changed_file_is_named_in_path_order(art_cache):
    (art_cache / TRITON).write_bytes(b"CUBIN" * 50)             # every file hashed: files.hash_files
    (art_cache / SO).write_bytes(b"\x7fELF module v2" * 64)
    msg = _refused(art_cache, "checksum mismatch")
    named = [line.split(": ")[0].lstrip(" -") for line in msg.splitlines() if "checksum mismatch" in line]
    assert named == [SO, TRITON]


def test_file_replaced_by_a_symlink_after_the_walk_is_refused(art_cache, tmp_path, monkeypatch):
    import graphrt.cache.load as load
    walked = load.walk
    (tmp_path / "evil.so").write_bytes(b"\x7fELF evil")

    def walk_then_swap(*args, **kw):                             # the race the walk cannot see
        found = walked(*args, **kw)
        (art_cache / SO).unlink()
        (art_cache / SO).symlink_to(tmp_path / "evil.so")
        return found
    monkeypatch.setattr(load, "walk", walk_then_swap)
    _refused(art_cache, f"{SO}: cannot be read")                # O_NOFOLLOW: the target is never read


def test_unlisted_and_missing_files_are_refused(art_cache):
    _edit_manifest(art_cache, lambda d: d["artifacts"].pop(SO))  # entry deleted, file kept
    _refused(art_cache, f"{SO}: present but not listed")
    _resign(art_cache)
    (art_cache / "triton/EVIL").mkdir()
    (art_cache / "triton/EVIL/__triton_launcher.so").write_bytes(b"\x7fELF evil")
    (art_cache / "extra.txt").write_text("x")
    msg = _refused(art_cache, "triton/EVIL/__triton_launcher.so: present but not listed")
    assert "extra.txt: present but not listed" in msg
    _resign(art_cache)
    (art_cache / TRITON).unlink()
    _refused(art_cache, f"{TRITON}: listed in the manifest but missing")


def test_symlinks_are_refused(art_cache, tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "batch_decode_bf16.so").write_bytes((art_cache / SO).read_bytes())
    (art_cache / SO).unlink()
    (art_cache / SO).symlink_to(outside / "batch_decode_bf16.so")  # same bytes, listed hash fits
    _refused(art_cache, f"{SO}: a symlink")
    (art_cache / SO).unlink()
    (art_cache / SO).write_bytes((outside / "batch_decode_bf16.so").read_bytes())
    check_cache(art_cache)
    shutil.move(str(art_cache / "triton/3QXTSKWB"), str(outside / "tk"))
    (art_cache / "triton/3QXTSKWB").symlink_to(outside / "tk", target_is_directory=True)
    _refused(art_cache, "triton/3QXTSKWB: a symlink")


@pytest.mark.parametrize("entry, words", [
    ("../outside.so", r"a '\.\.' component"), ("triton/../../outside.so", r"a '\.\.' component"),
    ("/etc/passwd", "an absolute path"), ("triton//x.so", "an empty component"),
    ("notes/x.so", "not under"), ("triton/./x.so", r"a '\.' component"),
    ("triton\\x.so", "a backslash"), ("triton/x.lock", "a build-tool state file")])
def test_manifest_paths_outside_the_cache_are_refused(art_cache, entry, words):
    _edit_manifest(art_cache, lambda d: d["artifacts"].__setitem__(entry, "0" * 64))
    _refused(art_cache, f"manifest.json: artifact entry {re.escape(repr(entry))}: {words}")


def test_non_sha256_artifact_entry_is_refused(art_cache):
    _edit_manifest(art_cache, lambda d: d["artifacts"].__setitem__(OBJ, "size:832"))
    _refused(art_cache, f"{OBJ}'?: 'size:832' is not a sha256")


def test_every_environment_key_is_required(cache_dir):
    _edit_manifest(cache_dir, lambda d: d.__setitem__("environment", {}))
    msg = _refused(cache_dir, "environment.gpu missing")
    for key in ("graphrt", "torch", "triton", "cuda", "python", "flashinfer", "compute_capability"):
        assert f"environment.{key} missing" in msg


def test_environment_key_removed_added_or_python_abi_changed(cache_dir):
    import platform
    _edit_manifest(cache_dir, lambda d: d["environment"].pop("compute_capability"))
    _refused(cache_dir, "environment.compute_capability missing")
    _edit_manifest(cache_dir, lambda d: d["environment"].update(compute_capability=None, os="x"))
    _refused(cache_dir, "environment.os is not a key")
    major, minor, _ = platform.python_version_tuple()
    _edit_manifest(cache_dir, lambda d: d["environment"].pop("os"))
    _edit_manifest(cache_dir, lambda d: d["environment"].__setitem__("python", f"{major}.{minor}.999"))
    check_cache(cache_dir)  # a patch release keeps the ABI of compiled launchers
    _edit_manifest(cache_dir, lambda d: d["environment"].__setitem__("python", f"{major}.{int(minor) + 1}.0"))
    _refused(cache_dir, "environment.python: cache built with")


def test_config_edited_with_recomputed_digest_is_refused_when_pinned(art_cache):
    pinned = _digest(art_cache)
    cfg = load_config(TINY)
    edited = cfg.replace(buckets=[1, 2, 4, 8, 16])

    def edit(d):
        d.update(config=edited.to_dict(), config_digest=edited.digest(), buckets=[1, 2, 4, 8, 16])
        d["bucket_backends"]["16"] = "torch-splitkv"
    _edit_manifest(art_cache, edit)
    check_cache(art_cache)  # unpinned: a consistent manifest is trusted (README: trust model)
    _refused(art_cache, "manifest.json: sha256 .* pinned", expect_digest=pinned)
    msg = _refused(art_cache, "config differs from the pinned one", config=cfg)
    assert "'buckets': ([1, 2, 4, 8, 16], [1, 2, 4, 8])" in msg
    kv = PagedKVCache.allocate(cfg, 64, "cpu")
    with pytest.raises(CacheMismatchError, match="pinned"):
        DecodeRuntime.from_cache(art_cache, kv_cache=kv, device="cpu", expect_digest=pinned)
    with pytest.raises(CacheMismatchError, match="pinned"):
        DecodeRuntime.from_cache(art_cache, kv_cache=kv, device="cpu", config=cfg)
    assert capture_main(["--check", str(art_cache), "--expect-digest", pinned]) == 1


def test_resigned_module_passes_only_unpinned(art_cache):
    pinned = _digest(art_cache)
    (art_cache / SO).write_bytes(b"\x7fELF backdoor" * 64)
    _resign(art_cache)
    check_cache(art_cache)  # the owner may rebuild; a pin is what detects a re-signed manifest
    _refused(art_cache, "pinned", expect_digest=pinned)


def test_bad_pins_are_rejected(cache_dir):
    with pytest.raises(ValueError, match="expect_digest"):
        check_cache(cache_dir, expect_digest="abc")
    with pytest.raises(ValueError, match="expect_digest"):
        check_cache(cache_dir, expect_digest=_digest(cache_dir).upper())
    with pytest.raises(TypeError, match="config"):
        check_cache(cache_dir, config=load_config(TINY).to_dict())
    with pytest.raises(TypeError, match="trust_unsafe_permissions"):
        check_cache(cache_dir, trust_unsafe_permissions="yes")
    with pytest.raises(SystemExit):
        capture_main(["--config", TINY, "--expect-digest", "0" * 64])


@pytest.mark.parametrize("content", [b'{"format": 2, "config": {', b"", b"[1, 2]", b"\xff\xfe"])
def test_truncated_or_invalid_manifest(cache_dir, capsys, content):
    (cache_dir / "manifest.json").write_bytes(content)
    _refused(cache_dir, "manifest.json: (not valid JSON|top level)")
    capsys.readouterr()
    assert capture_main(["--check", str(cache_dir)]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("graphrt-capture --check: ") and "Traceback" not in err


def test_manifest_missing_fields_are_refused(cache_dir):
    _edit_manifest(cache_dir, lambda d: d.pop("bucket_backends"))
    _refused(cache_dir, "manifest.json: 'bucket_backends' missing")
    _edit_manifest(cache_dir, lambda d: d.update(bucket_backends={"1": "torch-splitkv"}, mode="fast"))
    msg = _refused(cache_dir, "bucket_backends")
    assert "mode 'fast'" in msg


# ---- trust: owner and permissions --------------------------------------------------------------
def test_group_or_other_writable_cache_is_refused_unless_trusted(art_cache, capsys):
    os.chmod(art_cache / SO, 0o664)
    msg = _refused(art_cache, f"{SO}: writable by group/others")
    assert "trust_unsafe_permissions=True" in msg
    check_cache(art_cache, trust_unsafe_permissions=True)
    os.chmod(art_cache / SO, 0o644)
    os.chmod(art_cache / "triton", 0o777)
    _refused(art_cache, "triton: writable by group/others")
    os.chmod(art_cache / "triton", 0o755)
    os.chmod(art_cache, 0o775)
    _refused(art_cache, r"\(the cache directory\): writable by group/others")
    kv = PagedKVCache.allocate(load_config(TINY), 64, "cpu")
    with pytest.raises(CacheMismatchError, match="writable"):
        DecodeRuntime.from_cache(art_cache, kv_cache=kv, device="cpu")
    DecodeRuntime.from_cache(art_cache, kv_cache=kv, device="cpu", trust_unsafe_permissions=True)
    assert capture_main(["--check", str(art_cache)]) == 1
    assert capture_main(["--check", str(art_cache), "--trust-unsafe-permissions"]) == 0


def test_writable_parent_directory_is_refused_unless_sticky(built_cache, tmp_path, clean_env):
    parent = tmp_path / "shared"
    parent.mkdir()
    cache = parent / "gc"
    shutil.copytree(built_cache, cache)
    os.chmod(parent, 0o777)
    _refused(cache, "shared \\(a directory above the cache\\): writable by group/others")
    os.chmod(parent, 0o1777)  # sticky, as /tmp: others cannot rename the cache away
    check_cache(cache)


def test_cache_reached_through_a_symlink_in_a_writable_directory_is_refused(built_cache, tmp_path, clean_env):
    """The parents are judged along the path as given: a link inside a world-writable,
    non-sticky directory can be re-pointed between the check and the load."""
    safe = tmp_path / "safe"
    safe.mkdir()
    shutil.copytree(built_cache, safe / "gc")
    check_cache(safe / "gc")
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o777)
    (shared / "link").symlink_to(safe, target_is_directory=True)
    msg = _refused(shared / "link" / "gc", "shared \\(a directory above the cache\\): writable by group/others")
    assert f"{shared} (a directory above the cache)" in msg
    (tmp_path / "rel").symlink_to(Path("shared") / "link", target_is_directory=True)   # a chain, relative
    _refused(tmp_path / "rel" / "gc", "shared \\(a directory above the cache\\): writable")
    os.chmod(shared, 0o1777)                          # sticky: only the link's owner can re-point it
    check_cache(shared / "link" / "gc")
    check_cache(tmp_path / "rel" / "gc")
    # a link whose target passes through a writable directory: judged there too
    os.chmod(shared, 0o755)
    (tmp_path / "open").mkdir()
    os.chmod(tmp_path / "open", 0o777)
    (tmp_path / "open" / "inner").symlink_to(safe, target_is_directory=True)
    (tmp_path / "front").symlink_to(tmp_path / "open" / "inner", target_is_directory=True)
    _refused(tmp_path / "front" / "gc", "open \\(a directory above the cache\\): writable")


def test_symlink_above_the_cache_owned_by_another_user_is_refused(built_cache, tmp_path, clean_env,
                                                                monkeypatch):
    import graphrt.cache.files as cf
    safe = tmp_path / "safe"
    safe.mkdir()
    shutil.copytree(built_cache, safe / "gc")
    (tmp_path / "link").symlink_to(safe, target_is_directory=True)
    check_cache(tmp_path / "link" / "gc")
    real_lstat = os.lstat

    def lstat(p, *a, **kw):                           # the link as if another user made it
        st = real_lstat(p, *a, **kw)
        if Path(p) == tmp_path / "link":
            st = os.stat_result((st.st_mode, st.st_ino, st.st_dev, st.st_nlink, 4242) + tuple(st)[5:])
        return st
    monkeypatch.setattr(cf.os, "lstat", lstat)
    _refused(tmp_path / "link" / "gc", "link \\(a symlink above the cache\\): owned by uid 4242")


def test_deeply_nested_manifest_is_one_error_naming_it(cache_dir, capsys):
    (cache_dir / "manifest.json").write_text("[" * 100000 + "]" * 100000)
    _refused(cache_dir, "manifest.json: JSON nested 100000 levels deep")
    assert capture_main(["--check", str(cache_dir), "--trust-unsafe-permissions"]) == 1
    err = capsys.readouterr().err
    assert "nested 100000 levels deep" in err and "Traceback" not in err


def test_cache_owned_by_another_user_is_refused(art_cache, monkeypatch):

    import graphrt.cache.files as cf
    if os.geteuid() == 0:  # a real foreign file
        os.chown(art_cache / TRITON, 65534, 65534)
        _refused(art_cache, f"{TRITON}: owned by uid 65534, not by the current user")
        os.chown(art_cache / TRITON, 0, 0)
    monkeypatch.setattr(cf, "current_uid", lambda: os.geteuid() + 4242)
    msg = _refused(art_cache, "manifest.json: owned by uid")
    assert f"{SO}: owned by uid" in msg and "(the cache directory): owned by uid" in msg
    check_cache(art_cache, trust_unsafe_permissions=True)


def test_capture_writes_a_cache_others_cannot_write(build_run):
    import stat
    out, stdout, _ = build_run  # built under umask 002
    for p in [out, *out.rglob("*")]:
        assert not stat.S_IMODE(p.lstat().st_mode) & 0o022, p
    assert f"manifest sha256 {_digest(out)}" in stdout


# ---- the compilers point at the cache only while it loads -----------------------------------------
ENV = ("FLASHINFER_WORKSPACE_BASE", "TRITON_CACHE_DIR")


def _env():
    return {name: os.environ.get(name) for name in ENV}


@pytest.mark.parametrize("preset", [None, "/srv/engine-own"])
def test_from_cache_restores_the_compiler_environment(art_cache, monkeypatch, preset):
    for name in ENV:
        if preset:
            monkeypatch.setenv(name, f"{preset}/{name}")
    before = _env()
    cfg = load_config(TINY)
    kv = PagedKVCache.allocate(cfg, 64, "cpu")
    rt = DecodeRuntime.from_cache(art_cache, kv_cache=kv, device="cpu")
    assert _env() == before
    # failure inside the scope: the runtime constructor refuses a KV cache of another geometry
    bad_kv = PagedKVCache.allocate(cfg.replace(num_kv_heads=1, num_qo_heads=1), 64, "cpu")
    with pytest.raises(Exception) as e:
        DecodeRuntime.from_cache(art_cache, kv_cache=bad_kv, device="cpu")
    assert not isinstance(e.value, CacheMismatchError) and _env() == before
    # failure in the check (before the scope) and in the eager-on-GPU refusal
    with pytest.raises(CacheMismatchError):
        DecodeRuntime.from_cache(art_cache, kv_cache=kv, device="cpu", expect_digest="0" * 64)
    with pytest.raises(CacheMismatchError, match="without CUDA"):
        DecodeRuntime.from_cache(art_cache, kv_cache=kv, device="cuda")
    assert _env() == before
    # lazy captures re-enter the cache: inside compile_scope the compilers point at it
    with rt.compile_scope():
        assert os.environ["TRITON_CACHE_DIR"] == str((art_cache / "triton").resolve())
        assert os.environ["FLASHINFER_WORKSPACE_BASE"] == str((art_cache / "flashinfer").resolve())
    assert _env() == before


def test_compile_scope_refuses_a_compilation_and_restores(art_cache, clean_env):
    kv = PagedKVCache.allocate(load_config(TINY), 64, "cpu")
    rt = DecodeRuntime.from_cache(art_cache, kv_cache=kv, device="cpu", lazy=True)
    with pytest.raises(CacheMismatchError, match=r"\(re\)compiled while loading"):
        with rt.compile_scope():
            (art_cache / "triton/NEW").mkdir()
            (art_cache / "triton/NEW/kernel.cubin").write_bytes(b"compiled now")
    assert _env() == {name: None for name in ENV}
    with pytest.raises(KeyError):
        with rt.compile_scope():
            raise KeyError("inside")
    assert _env() == {name: None for name in ENV}
    assert DecodeRuntime(load_config(TINY), kv, "cpu").compile_scope is not None


def test_capture_out_restores_the_compiler_environment(build_run):
    assert build_run[2] == {name: None for name in ENV}


@pytest.mark.gpu
def test_lazy_load_compiles_nothing_and_restores_environment(tmp_path, clean_env):
    """GPU: a lazily loaded bucket is captured inside the cache's scope (Triton finds its kernel
    there), the cache is unchanged afterwards and the variables are gone again."""
    import subprocess
    import sys
    import yaml
    cfg = yaml.safe_load(open(ROOT / "configs" / "llama-3.1-8b.yaml"))
    cfg.update(buckets=[1, 8, 16], backend="flashinfer", kv_pool_pages=1024)
    path = tmp_path / "cfg.yaml"
    path.write_text(yaml.safe_dump(cfg))
    cache = tmp_path / "cache"
    built = subprocess.run([sys.executable, "-m", "capture", "--config", str(path), "--out",
                            str(cache), "--no-progress"], capture_output=True, text=True, cwd=ROOT)
    assert built.returncode == 0, built.stderr[-2000:]
    digest = sha256(cache / "manifest.json")
    assert f"manifest sha256 {digest}" in built.stdout
    code = (
        "import os; from graphrt import *; from graphrt.attention.verify import verify_bucket\n"
        f"cfg = load_config({str(path)!r}); kv = PagedKVCache.allocate(cfg, 1024, 'cuda')\n"
        f"rt = DecodeRuntime.from_cache({str(cache)!r}, kv_cache=kv, lazy=True, expect_digest={digest!r})\n"
        "errs = [verify_bucket(rt, b, seed=b) for b in (16, 1, 8)]\n"
        "assert sorted(rt.graphs.stats_by_bucket()) == [1, 8, 16], rt.graphs.stats\n"
        "assert 'TRITON_CACHE_DIR' not in os.environ and 'FLASHINFER_WORKSPACE_BASE' not in os.environ\n"
        "print('ERR', max(errs))\n")
    env = {k: v for k, v in os.environ.items() if k not in ENV}
    warm = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, env=env)
    assert warm.returncode == 0, warm.stderr[-3000:]
    assert float(warm.stdout.split("ERR")[-1]) < 2e-2
    assert subprocess.run([sys.executable, "-m", "capture", "--check", str(cache), "--expect-digest",
                           digest], capture_output=True, cwd=ROOT).returncode == 0
