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
    import hashlib

    import graphrt.attention.flashinfer_lean as lean_mod
    for name in [m for m in sys.modules if m == "flashinfer" or m.startswith("flashinfer.")]:
        monkeypatch.delitem(sys.modules, name)
    pkg = tmp_path / "flashinfer"
    pkg.mkdir()
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(sys, "fake_flashinfer_imports", 0, raising=False)

    def write(extra="", lean=False, files=None):
        """lean: the __init__ is one of LEAN_INITS, with the submodules graphrt imports."""
        init = pkg / "__init__.py"
        init.write_text("import sys, threading, time\nsys.fake_flashinfer_imports += 1\n"
                        "time.sleep(0.3)\nimporter = threading.current_thread().name\n"
                        "__version__ = '0.7.4'\n" + extra)
        known = {hashlib.sha256(init.read_bytes()).hexdigest(): "0.7.4"} if lean else {}
        monkeypatch.setattr(lean_mod, "LEAN_INITS", known)
        if lean:
            files = {"version.py": "__version__ = '0.7.4'\n__git_commit__ = 'abc'\n",
                     "decode.py": "class BatchDecodeWithPagedKVCacheWrapper: pass\n",
                     "prefill.py": "class BatchPrefillWithPagedKVCacheWrapper: pass\n", **(files or {})}
        for name, text in (files or {}).items():
            (pkg / name).write_text(text)
    yield write
    for name in [m for m in sys.modules if m == "flashinfer" or m.startswith("flashinfer.")]:
        sys.modules.pop(name, None)


LEAN_INIT = ("from .decode import BatchDecodeWithPagedKVCacheWrapper\nfrom .other import thing\n"
             "from .xqa import xqa as xqa\ntry:\n    from .trace import trace as trace\nexcept ImportError:\n    pass\n")
LEAN_FILES = {"other.py": "thing = 7\n", "lazy.py": "x = 3\n", "xqa.py": "def xqa():\n    return 1\n",
              "trace.py": "def trace():\n    return 2\n",
              "decode.py": "from .xqa import xqa\nfrom .trace import trace\nclass BatchDecodeWithPagedKVCacheWrapper: pass\n"}


def _forget():
    for name in [m for m in sys.modules if m == "flashinfer" or m.startswith("flashinfer.")]:
        del sys.modules[name]
    sys.fake_flashinfer_imports = 0


def test_a_lean_import_runs_no_package_init_until_a_name_it_lacks(fake_flashinfer, monkeypatch):
    import importlib

    import graphrt.attention.flashinfer_import as fi
    fake_flashinfer(LEAN_INIT, lean=True, files=LEAN_FILES)
    decode = import_flashinfer("backend 'flashinfer'", "flashinfer.decode")
    assert sys.fake_flashinfer_imports == 0 and fi.flashinfer_version("backend 'flashinfer'") == "0.7.4"
    pkg = sys.modules["flashinfer"]
    assert (pkg.__version__, pkg.__git_commit__) == ("0.7.4", "abc") and sys.fake_flashinfer_imports == 0
    assert importlib.import_module("flashinfer.lazy").x == 3 and sys.fake_flashinfer_imports == 0
    assert pkg.trace() == 2 and sys.fake_flashinfer_imports == 1   # the __init__'s (in a try block), not the submodule
    assert pkg.xqa() == 1 and sys.fake_flashinfer_imports == 1     # the __init__'s xqa, not the submodule
    assert pkg.thing == 7 and sys.fake_flashinfer_imports == 1     # run once
    from flashinfer import BatchDecodeWithPagedKVCacheWrapper, importer
    assert BatchDecodeWithPagedKVCacheWrapper is decode.BatchDecodeWithPagedKVCacheWrapper
    assert importer == "MainThread" and sys.fake_flashinfer_imports == 1 and sys.modules["flashinfer"] is pkg
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        pkg.nope
    assert import_flashinfer("backend 'flashinfer'") is pkg and sys.fake_flashinfer_imports == 1


def test_a_lean_package_names_what_the_whole_one_does(fake_flashinfer, monkeypatch):
    fake_flashinfer(LEAN_INIT, lean=True, files=LEAN_FILES)
    import_flashinfer("backend 'flashinfer'", "flashinfer.decode")
    pkg = sys.modules["flashinfer"]
    with pytest.raises(AttributeError, match="no attribute 'lazy'"):   # a submodule nobody imported
        pkg.lazy
    assert sys.fake_flashinfer_imports == 1 and "thing" in dir(pkg) and "xqa" in dir(pkg)


def test_whole_import_when_turned_off_another_init_or_an_opt_in(fake_flashinfer, monkeypatch):
    for env, lean, opt_in in (("0", True, None), ("1", False, None), ("1", True, "FLASHINFER_TRACE_APPLY"),
                              ("1", True, "FLASHINFER_LOGLEVEL")):
        _forget()
        monkeypatch.setenv("GRAPHRT_LEAN_IMPORTS", env)
        for name in ("FLASHINFER_TRACE_APPLY", "FLASHINFER_LOGLEVEL"):
            monkeypatch.delenv(name, raising=False)
        if opt_in:
            monkeypatch.setenv(opt_in, "0")                   # off, as FlashInfer reads it: still lean
            fake_flashinfer(LEAN_INIT, lean=lean, files=LEAN_FILES)
            import_flashinfer("backend 'flashinfer'", "flashinfer.decode")
            assert sys.fake_flashinfer_imports == 0
            _forget()
            monkeypatch.setenv(opt_in, "1")
        fake_flashinfer(LEAN_INIT, lean=lean, files=LEAN_FILES)
        import_flashinfer("backend 'flashinfer'", "flashinfer.decode")
        assert sys.fake_flashinfer_imports == 1 and "_graphrt_lean" not in vars(sys.modules["flashinfer"])
    monkeypatch.setenv("GRAPHRT_LEAN_IMPORTS", "yes")
    _forget()
    with pytest.raises(ValueError, match="GRAPHRT_LEAN_IMPORTS: must be 0 or 1"):
        import_flashinfer("backend 'flashinfer'", "flashinfer.decode")


def test_a_failed_lean_import_imports_whole_and_says_so(fake_flashinfer, monkeypatch, caplog):
    # prefill needs a name only the __init__ defines: decode imports lean, prefill (a later call) whole
    fake_flashinfer("helper = 5\n", lean=True, files={
        "prefill.py": "from flashinfer import helper\nclass BatchPrefillWithPagedKVCacheWrapper: pass\n"})
    import_flashinfer("backend 'flashinfer'", "flashinfer.decode")
    assert sys.fake_flashinfer_imports == 0
    with caplog.at_level("WARNING", logger="graphrt.attention"):
        prefill = import_flashinfer("prefill attention on CUDA", "flashinfer.prefill")
    assert prefill.helper == 5 and sys.fake_flashinfer_imports == 1
    assert "FlashInfer's lean import failed (ImportError" in caplog.text


def test_a_missing_dependency_is_raised_as_it_is(fake_flashinfer, monkeypatch, caplog):
    fake_flashinfer("", lean=True, files={"comm.py": "import no_such_cuda_binding\n"})
    with caplog.at_level("WARNING", logger="graphrt.attention"), pytest.raises(ModuleNotFoundError) as err:
        import_flashinfer("one-shot all-reduce", "flashinfer.comm")
    assert err.value.name == "no_such_cuda_binding" and not isinstance(err.value, FlashInferMissing)
    assert sys.fake_flashinfer_imports == 0 and "lean import failed" not in caplog.text


def test_an_init_that_raises_leaves_no_package(fake_flashinfer, monkeypatch):
    fake_flashinfer("raise RuntimeError('CUDA driver too old for this FlashInfer build')\n", lean=True)
    import_flashinfer("backend 'flashinfer'", "flashinfer.decode")          # lean: the __init__ not run
    with pytest.raises(RuntimeError, match="driver too old"):
        sys.modules["flashinfer"].something_else
    assert "flashinfer" not in sys.modules and sys.fake_flashinfer_imports == 1
    with pytest.raises(RuntimeError, match="driver too old"):             # whole: raised as it is, once
        import_flashinfer("backend 'flashinfer'")
    assert "flashinfer" not in sys.modules and sys.fake_flashinfer_imports == 2


SLOW_PREFILL = {"prefill.py": "import threading, time\ntime.sleep(0.3)\nby = threading.current_thread().name\n"}


def test_another_thread_waits_for_a_lean_import_under_way(fake_flashinfer):
    import threading
    import time
    fake_flashinfer(LEAN_INIT, lean=True, files={**LEAN_FILES, **SLOW_PREFILL})
    t = threading.Thread(target=import_flashinfer, args=("prefill attention on CUDA", "flashinfer.prefill"),
                         name="importer")
    t.start()
    time.sleep(0.1)                                       # the thread is inside prefill's import
    import flashinfer                                     # the lean package, as another library would
    assert flashinfer.thing == 7                          # waits, then runs the __init__ on this thread
    t.join()
    assert sys.fake_flashinfer_imports == 1 and flashinfer.importer == "MainThread"
    assert sys.modules["flashinfer.prefill"].by == "importer"
