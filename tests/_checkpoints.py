"""Test helper: random HF checkpoints written by tools/make_checkpoint.py (the real file path)."""
from __future__ import annotations

import importlib.util
from pathlib import Path

_TOOL = Path(__file__).resolve().parent.parent / "tools" / "make_checkpoint.py"


def make_checkpoint_module():
    spec = importlib.util.spec_from_file_location("make_checkpoint", _TOOL)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def write(tmp_path_factory, name: str, **kw) -> Path:
    """Write a checkpoint (make_checkpoint.write_checkpoint kwargs) under a fresh tmp dir."""
    return make_checkpoint_module().write_checkpoint(tmp_path_factory.mktemp(name), **kw)
