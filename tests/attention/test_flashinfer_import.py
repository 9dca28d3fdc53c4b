"""FlashInfer is optional (the `gpu` extra): every CUDA path that needs it says how to install it
when it is missing. Simulated on a CPU by hiding the module (a None entry in sys.modules) and, for
the entry points, by making torch report a CUDA device; nothing touches a GPU."""
from __future__ import annotations

import sys

import pytest
import torch

from graphrt import RuntimeConfig
from graphrt.attention.flashinfer_import import (FlashInferMissing, flashinfer_installed,
                                                 import_flashinfer, require_flashinfer)

CUDA = torch.device("cuda")   # a device object only: the paths below refuse before allocating


@pytest.fixture
def no_flashinfer(monkeypatch):
    for name in [m for m in sys.modules if m == "flashinfer" or m.startswith("flashinfer.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "flashinfer", None)


def _assert_install_line(err, what):
    msg = str(err.value)
    assert isinstance(err.value, ImportError) and msg.startswith(f"{what} needs FlashInfer, which is not installed")
    assert 'pip install "graphrt[gpu]"' in msg and "flashinfer-python==0.7.4" in msg, msg


def _config(backend="flashinfer", dtype="bfloat16", page_size=16):
    return RuntimeConfig(num_qo_heads=4, num_kv_heads=2, head_dim=64, page_size=page_size, max_context_len=64,
                         buckets=[1, 2], dtype=dtype, backend=backend, kv_pool_pages=8)


def test_import_and_require(no_flashinfer):
    assert not flashinfer_installed()
    with pytest.raises(FlashInferMissing) as err:
        import_flashinfer("backend 'flashinfer'")
    _assert_install_line(err, "backend 'flashinfer'")
    with pytest.raises(FlashInferMissing) as err:
        import_flashinfer("backend 'xqa'", "flashinfer.decode")
    _assert_install_line(err, "backend 'xqa'")
    with pytest.raises(FlashInferMissing):
        require_flashinfer("device 'cuda'")


def test_a_missing_submodule_of_an_installed_flashinfer_is_not_reworded(monkeypatch):
    fake = type(sys)("flashinfer")
    fake.__path__ = []                                    # a package without the submodule
    monkeypatch.setitem(sys.modules, "flashinfer", fake)
    with pytest.raises(ModuleNotFoundError) as err:
        import_flashinfer("backend 'xqa'", "flashinfer.no_such_module")
    assert not isinstance(err.value, FlashInferMissing)


def test_decode_backends_say_how_to_install(no_flashinfer):
    from graphrt.attention.backends.flashinfer import FlashInferBackend
    from graphrt.attention.backends.xqa import XqaBackend
    from graphrt.attention.kvcache import PagedKVCache
    kv = PagedKVCache.allocate(_config(dtype="float32", backend="reference"), 8, "cpu")
    with pytest.raises(FlashInferMissing) as err:
        FlashInferBackend(_config(), kv, CUDA)
    _assert_install_line(err, "backend 'flashinfer'")
    with pytest.raises(FlashInferMissing) as err:
        XqaBackend(_config(backend="xqa", page_size=32), kv, CUDA)
    _assert_install_line(err, "backend 'xqa'")


def test_prefill_on_cuda_says_how_to_install(no_flashinfer):
    from graphrt.model.prefill import PrefillAttention
    with pytest.raises(FlashInferMissing) as err:
        PrefillAttention(_config(), CUDA)
    _assert_install_line(err, "prefill attention on CUDA")
    assert PrefillAttention(_config(dtype="float32", backend="reference"), "cpu")._wrapper is None  # CPU: none needed


def test_llm_on_cuda_refuses_before_loading(no_flashinfer, monkeypatch, tmp_path):
    from graphrt import LLM
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    with pytest.raises(FlashInferMissing) as err:        # the path does not exist: nothing was read
        LLM(tmp_path / "not-a-checkpoint", device="cuda")
    _assert_install_line(err, "device 'cuda'")
