"""Test helper: random HF checkpoints written by tools/make_checkpoint.py (the real file path)."""
from __future__ import annotations

import importlib.util
from pathlib import Path

TOOLS = Path(__file__).resolve().parent.parent / "tools"


def tool_module(name: str):
    """tools/<name>.py loaded as a module (the tools are scripts, not a package)."""
    spec = importlib.util.spec_from_file_location(name, TOOLS / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def make_checkpoint_module():
    return tool_module("make_checkpoint")


def write(tmp_path_factory, name: str, **kw) -> Path:
    """Write a checkpoint (make_checkpoint.write_checkpoint kwargs) under a fresh tmp dir."""
    return make_checkpoint_module().write_checkpoint(tmp_path_factory.mktemp(name), **kw)


BF16_GAP = 2 ** -5     # float32 truth's top-2 gap under this (relative to the top logit, ~4 bf16 ulps): a tie


def assert_greedy_matches_hf(hf, prompt: list[int], out: list[int], *, tie_gap: float = BF16_GAP) -> None:
    """Greedy tokens `out` after `prompt`, token by token against HF's logits (GPU; `hf` should be
    the float32 truth); a difference is allowed only at a top-2 tie (top-2 gap under `tie_gap`
    times the top logit; default BF16_GAP), then it stops."""
    import torch
    seq = list(prompt)
    for i, tok in enumerate(out):
        with torch.no_grad():
            logits = hf(torch.tensor([seq], device="cuda")).logits[0, -1].float()
        top2 = torch.topk(logits, 2)
        if tok != int(top2.indices[0]):
            gap = float(top2.values[0] - logits[tok])
            assert gap <= tie_gap * abs(float(top2.values[0])) + 1e-3, \
                f"token {i}: graphrt {tok}, HF {int(top2.indices[0])}, gap {gap}, top {float(top2.values[0])}"
            return
        seq.append(tok)
