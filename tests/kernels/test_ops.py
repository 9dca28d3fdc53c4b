"""kernels/ops.py: the kernel-set choice (torch references or Triton kernels), resolved once."""
from __future__ import annotations

import dataclasses
import subprocess
import sys
import textwrap

import pytest
import torch

from graphrt.kernels.ops import KERNELS, KernelOps, check_kernels, kernel_ops, resolve_kernels


def test_both_sets_have_every_function():
    sets = {name: kernel_ops(name) for name in KERNELS}
    fields = [f.name for f in dataclasses.fields(KernelOps) if f.name != "name"]
    for name, ops in sets.items():
        assert ops.name == name and all(callable(getattr(ops, f)) for f in fields)
    assert sets["torch"].rms_norm.__module__ == "graphrt.kernels.reference"
    assert sets["triton"].rms_norm.__module__ == "graphrt.kernels.norm"


def test_defaults_follow_the_device():
    assert resolve_kernels(None, "cpu") == resolve_kernels("auto", torch.device("cpu")) == "torch"
    assert resolve_kernels(None, torch.device("cuda", 0)) == "triton"
    assert resolve_kernels("triton", "cpu") == "triton" and resolve_kernels("torch", "cuda") == "torch"


@pytest.mark.parametrize("bad", ["cuda", "Torch", 1, ["torch"], ""])
def test_bad_names_are_refused(bad):
    with pytest.raises(ValueError, match="^kernels: "):
        check_kernels(bad)
    with pytest.raises(ValueError, match="^kernels: "):
        kernel_ops(bad)


def test_torch_set_runs_without_triton():
    """The torch kernel set, the torch attention backend and `import graphrt` need no Triton: a
    subprocess whose `import triton` fails runs a layer's kernels (norm, rope_append into a paged
    cache, silu_mul, argmax)."""
    code = textwrap.dedent('''
        import importlib.abc, sys
        class Block(importlib.abc.MetaPathFinder):
            def find_spec(self, name, path=None, target=None):
                if name == "triton" or name.startswith("triton."):
                    raise ImportError("triton is blocked in this test")
        sys.meta_path.insert(0, Block())
        import torch, graphrt
        import graphrt.attention.backends.torch_decode            # the CPU's attention backend
        from graphrt.attention.kvcache import PagedKVCache
        from graphrt.kernels.ops import kernel_ops
        ops = kernel_ops("torch")
        x, w = torch.randn(3, 64), torch.ones(64)
        h = ops.rms_norm(x, w, 1e-5)
        cache = PagedKVCache(torch.zeros(4, 16, 1, 64), torch.zeros(4, 16, 1, 64), "NHD")
        cos_sin = torch.cat([torch.ones(32, 32), torch.zeros(32, 32)], -1)
        err = torch.zeros(1, dtype=torch.int32)
        q = ops.rope_append_decode(torch.randn(3, 4 * 64), cos_sin, cache, torch.tensor([[1], [2], [3]],
                                   dtype=torch.int32), torch.tensor([1, 2, 0], dtype=torch.int32), err,
                                   num_q_heads=2)
        out = torch.empty(3, dtype=torch.int64)
        ops.argmax_into(ops.silu_mul(torch.randn(3, 8)), out)
        assert q.shape == (3, 2, 64) and int(err) == 0 and cache.k[2, 1].abs().sum() > 0
        assert "triton" not in sys.modules
        print("ok")
    ''')
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr[-2000:]
