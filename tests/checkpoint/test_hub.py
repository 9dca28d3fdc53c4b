"""Hugging Face repo ids (graphrt/checkpoint/hub.py): resolved offline from a pre-populated cache
layout (models--org--name/snapshots/<commit>/..., refs/<branch>), a local directory wins, and
names that resolve to nothing fail with one line naming the field."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from _checkpoints import write
from graphrt.checkpoint.hub import looks_like_repo_id, resolve_model

hub = pytest.importorskip("huggingface_hub")
ROOT = Path(__file__).resolve().parents[2]
COMMIT = "0123456789abcdef0123456789abcdef01234567"
OLD = "fedcba9876543210fedcba9876543210fedcba98"


def _populate(cache: Path, ckpt: Path, repo: str = "org/tiny") -> Path:
    """The cache layout huggingface_hub writes: snapshots by commit, refs naming them."""
    root = cache / f"models--{repo.replace('/', '--')}"
    snap = root / "snapshots" / COMMIT
    shutil.copytree(ckpt, snap)
    old = root / "snapshots" / OLD
    old.mkdir(parents=True)
    (old / "config.json").write_text("{}")
    (root / "refs").mkdir()
    (root / "refs" / "main").write_text(COMMIT)
    (root / "refs" / "v0").write_text(OLD)
    return snap


def _resolve_in_subprocess(cache: Path, *args: str) -> list[str]:
    """resolve_model in a fresh process with the user's environment variables (huggingface_hub
    reads HF_HUB_CACHE and HF_HUB_OFFLINE when it is imported)."""
    env = dict(os.environ, HF_HUB_CACHE=str(cache), HF_HUB_OFFLINE="1",
               PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    script = ("import json, sys\nfrom graphrt.checkpoint.hub import resolve_model\nout = []\n"
              "for a in json.loads(sys.argv[1]):\n"
              "    try:\n        out.append(str(resolve_model(a[0], revision=a[1])))\n"
              "    except ValueError as e:\n        out.append('ValueError ' + str(e))\n"
              "print(json.dumps(out))")
    r = subprocess.run([sys.executable, "-c", script, json.dumps([list(a) for a in args])], env=env,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


def test_repo_id_resolves_offline_from_the_cache(tmp_path_factory, tmp_path):
    ckpt = write(tmp_path_factory, "hubsrc", arch="llama", dtype="float32", seed=6)
    cache = tmp_path / "hub"
    snap = _populate(cache, ckpt)
    got = _resolve_in_subprocess(cache, ("org/tiny", None), ("org/tiny", "main"), ("org/tiny", "v0"),
                                 ("org/tiny", COMMIT), ("org/tiny", "v9"), ("org/missing", None))
    assert got[0] == got[1] == got[3] == str(snap)
    assert got[2] == str(cache / "models--org--tiny" / "snapshots" / OLD)
    assert got[4].startswith("ValueError model: 'org/tiny' is not a local directory and no snapshot of it "
                             "at revision 'v9' is in the Hugging Face cache (HF_HUB_OFFLINE=1")
    assert got[5].startswith("ValueError model: 'org/missing' is not a local directory")
    assert str(cache) in got[5]


def test_llm_loads_a_repo_id_like_the_directory(tmp_path_factory, tmp_path, monkeypatch):
    """LLM("org/tiny") reads the snapshot: same tokens as LLM(directory)."""
    from huggingface_hub import constants

    from graphrt import LLM, SamplingParams
    ckpt = write(tmp_path_factory, "hubllm", arch="qwen2", dtype="float32", seed=7)
    cache = tmp_path / "hub"
    snap = _populate(cache, ckpt)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))   # as HF_HUB_CACHE at import would
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    params = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)
    by_id = LLM("org/tiny", device="cpu", max_batch=2, steps_per_graph=2)
    assert Path(by_id.checkpoint.path) == snap
    by_dir = LLM(ckpt, device="cpu", max_batch=2, steps_per_graph=2)
    a = by_id.generate(["hello", [3, 4]], params, use_tqdm=False)
    b = by_dir.generate(["hello", [3, 4]], params, use_tqdm=False)
    assert [o.token_ids for o in a] == [o.token_ids for o in b] and all(len(o.token_ids) == 4 for o in a)


def test_local_directory_wins(tmp_path, monkeypatch):
    d = tmp_path / "org" / "tiny"
    d.mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    assert resolve_model("org/tiny") == Path("org/tiny")             # never asks the hub
    assert resolve_model(d) == d
    with pytest.raises(ValueError, match="^revision: 'v1' given, but model 'org/tiny' is a local directory"):
        resolve_model("org/tiny", revision="v1")


def test_paths_are_not_repo_ids_and_bad_input(tmp_path):
    for name in ("/nonexistent/ckpt", "./ckpt", "~/ckpt", "a/b/c", "a--b", "a..b", "-a", "a\\b", ""):
        assert not looks_like_repo_id(name), name
    for name in ("gpt2", "Qwen/Qwen2.5-0.5B-Instruct", "meta-llama/Llama-3.2-1B", "org/name_v1.0"):
        assert looks_like_repo_id(name), name
    missing = tmp_path / "nope"
    assert resolve_model(str(missing)) == missing                    # the loader names the missing directory
    with pytest.raises(ValueError, match="^model: expected a directory or a Hugging Face repo id"):
        resolve_model(3)
    with pytest.raises(ValueError, match="^revision: expected a non-empty branch"):
        resolve_model("org/tiny", revision="")
