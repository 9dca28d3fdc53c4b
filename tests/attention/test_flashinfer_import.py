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


@pytest.fixture
def fake_flashinfer(tmp_path, monkeypatch):
    """A `flashinfer` package on sys.path whose import takes 0.3 s and counts itself (body: extra
    lines appended to its __init__)."""
    import graphrt.attention.flashinfer_import as fi
    for name in [m for m in sys.modules if m == "flashinfer" or m.startswith("flashinfer.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setattr(fi, "_prefetch", None)
    monkeypatch.setenv("GRAPHRT_PREFETCH_IMPORTS", "1")
    pkg = tmp_path / "flashinfer"
    pkg.mkdir()
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(sys, "fake_flashinfer_imports", 0, raising=False)

    def write(extra=""):
        (pkg / "__init__.py").write_text("import sys, threading, time\nsys.fake_flashinfer_imports += 1\n"
                                         "time.sleep(0.3)\nimporter = threading.current_thread().name\n"
                                         "__version__ = '0.7.4'\n" + extra)
    yield write
    for name in [m for m in sys.modules if m == "flashinfer" or m.startswith("flashinfer.")]:
        sys.modules.pop(name, None)


def test_a_prefetch_imports_flashinfer_once_on_its_thread(fake_flashinfer):
    import time

    from graphrt.attention.flashinfer_import import prefetch_flashinfer
    fake_flashinfer()
    t = time.perf_counter()
    assert prefetch_flashinfer() is True
    assert time.perf_counter() - t < 0.2                  # the caller goes on while it imports
    assert prefetch_flashinfer() is False                 # one at a time
    mod = import_flashinfer("backend 'flashinfer'")       # joins the prefetch, imports nothing more
    assert mod.importer == "graphrt-import-flashinfer" and sys.fake_flashinfer_imports == 1
    assert prefetch_flashinfer() is False                 # imported already


def test_a_failed_prefetch_raises_on_the_callers_import(fake_flashinfer):
    from graphrt.attention.flashinfer_import import prefetch_flashinfer
    fake_flashinfer("raise RuntimeError('CUDA driver too old for this FlashInfer build')\n")
    assert prefetch_flashinfer() is True
    with pytest.raises(RuntimeError, match="driver too old"):
        import_flashinfer("backend 'flashinfer'")
    assert sys.fake_flashinfer_imports == 2               # the caller's own import ran and raised


def test_no_prefetch_unless_turned_on_nor_when_missing(fake_flashinfer, monkeypatch):
    from graphrt.attention.flashinfer_import import prefetch_flashinfer
    fake_flashinfer()
    for off in ("0", None):                               # off, and the default
        if off is None:
            monkeypatch.delenv("GRAPHRT_PREFETCH_IMPORTS")
        else:
            monkeypatch.setenv("GRAPHRT_PREFETCH_IMPORTS", off)
        assert prefetch_flashinfer() is False and "flashinfer" not in sys.modules
    monkeypatch.setenv("GRAPHRT_PREFETCH_IMPORTS", "1")
    monkeypatch.setitem(sys.modules, "flashinfer", None)  # hidden: missing
    assert prefetch_flashinfer() is False
    for bad in ("yes", "true", "2", ""):
        monkeypatch.setenv("GRAPHRT_PREFETCH_IMPORTS", bad)
        with pytest.raises(ValueError, match="GRAPHRT_PREFETCH_IMPORTS: must be 0 or 1"):
            prefetch_flashinfer()


def test_join_waits_for_the_prefetch(fake_flashinfer):
    import graphrt.attention.flashinfer_import as fi
    fake_flashinfer()
    assert fi.prefetch_flashinfer() is True
    assert fi._prefetch.is_alive()                        # still importing (0.3 s)
    fi.join_prefetch()
    assert not fi._prefetch.is_alive() and sys.modules["flashinfer"].importer == "graphrt-import-flashinfer"
