"""`graphrt-capture --out` into a new nested path makes owner-only folders (so the cache check
accepts what it just built under umask 002), and `graphrt serve --graph-cache DIR
--expect-digest HEX` refuses another manifest and a cache built for another geometry (one line,
exit 2, naming the fields), before loading weights; the matching cache loads."""
from __future__ import annotations

import hashlib
import os
import stat
from pathlib import Path

import pytest
import torch

from _checkpoints import write
from capture.cli import main as capture_main

pytest.importorskip("fastapi")
pytest.importorskip("transformers")
pytestmark = pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU (eager) cache path")
ROOT = Path(__file__).resolve().parents[2]
ENV = ("FLASHINFER_WORKSPACE_BASE", "TRITON_CACHE_DIR")


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    saved = {k: os.environ.pop(k, None) for k in ENV}
    old = os.umask(0o002)
    try:
        out = tmp_path_factory.mktemp("cap") / "new" / "nested" / "cache"
        rc = capture_main(["--config", str(ROOT / "configs" / "tiny.yaml"), "--out", str(out), "--no-progress",
                           "--verify-buckets", "4", "--verify-lengths", "1,16"])
    finally:
        os.umask(old)
        for k, v in saved.items():
            if v is not None:
                os.environ[k] = v
    assert rc == 0                                    # the check after the build accepted it
    return out


def test_capture_out_parents_are_owner_only(cache):
    for d in (cache.parent, cache.parent.parent):
        assert stat.S_IMODE(d.stat().st_mode) == 0o700, d


def _serve(args, capsys):
    from graphrt.serve.cli import main
    with pytest.raises(SystemExit) as e:
        main(args)
    lines = capsys.readouterr().err.strip().splitlines()
    assert e.value.code == 2 and len(lines) == 1, lines
    return lines[0]


def test_serve_pins_digest_and_geometry(cache, tmp_path_factory, capsys, monkeypatch):
    from graphrt.serve.cli import build_parser, load
    for k in ENV:
        monkeypatch.delenv(k, raising=False)
    good = write(tmp_path_factory, "gqa", shape="tiny-gqa", arch="llama", dtype="float32", seed=2)
    other = write(tmp_path_factory, "mha", shape="tiny", arch="llama", dtype="float32", seed=2)
    digest = hashlib.sha256((cache / "manifest.json").read_bytes()).hexdigest()
    base = ["--device", "cpu", "--graph-cache", str(cache)]
    line = _serve(["--model", str(good), *base, "--expect-digest", "0" * 64], capsys)
    assert "manifest.json: sha256" in line and "pinned " + "0" * 64 in line
    line = _serve(["--model", str(other), *base, "--expect-digest", digest], capsys)
    assert "another geometry" in line and "num_qo_heads: cache 4, model 2" in line and "num_kv_heads" in line
    line = _serve(["--model", str(good), "--device", "cpu", "--expect-digest", digest], capsys)
    assert "--expect-digest" in line
    llm, _ = load(build_parser().parse_args(["--model", str(good), *base, "--expect-digest", digest]))
    assert llm.generate([[3, 4]])[0].token_ids
