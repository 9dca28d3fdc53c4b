"""FlashInfer as an optional dependency: one place that imports it, with the install line when missing.

Every CUDA path needs FlashInfer (prefill attention, the `flashinfer*` and `xqa` decode backends);
a CPU install does not (`pip install -e ".[test]"` pulls no CUDA package). It comes with the `gpu`
extra: `pip install "graphrt[gpu]"` (flashinfer-python 0.7.4, the version whose plan layout the
device planner knows, `flashinfer_layout.KNOWN_VERSIONS`).

    fi = import_flashinfer("backend 'flashinfer'")             # the module, or FlashInferMissing
    decode = import_flashinfer("backend 'xqa'", "flashinfer.decode")
    require_flashinfer("device 'cuda'")                        # before loading anything: no import
    prefetch_flashinfer()    # GRAPHRT_PREFETCH_IMPORTS=1: the import runs on a thread while the weights load
    ...
    join_prefetch()          # before the environment it read changes (import_flashinfer joins too)

FlashInfer's import takes seconds: its package `__init__` imports hundreds of modules (MoE, GEMM,
Mamba, ...) of which graphrt uses two, `flashinfer.decode` and `flashinfer.prefill` (2.2 s against
0.7 s on a 2-core host). For the FlashInfer versions whose `__init__` only re-exports
(LEAN_VERSIONS), graphrt puts the package into sys.modules without running its `__init__` and
imports the submodules it uses; the first attribute the package lacks (another library's
`flashinfer.X`, `from flashinfer import X`) runs the whole `__init__` into the same module, so
the package is what `import flashinfer` would have made. GRAPHRT_LEAN_IMPORTS=0 imports it
whole from the start. A lean import that fails imports it whole, logged.

With GRAPHRT_PREFETCH_IMPORTS=1 a CUDA start-up also starts that import on a daemon thread first,
so it overlaps the checkpoint read and CUDA's initialisation, which wait on I/O and the driver,
not on the interpreter. import_flashinfer joins that thread before it imports, so graphrt's own
import of FlashInfer never races it; a failed prefetch leaves nothing behind (Python removes a
module whose import raised), and the import on the caller's thread then raises the error itself.
Off by default until a GPU start-up has measured it (tools/device/round22d.sh A/Bs the two).
"""
from __future__ import annotations

import importlib
import importlib.util
import logging
import os
import sys
import threading

log = logging.getLogger("graphrt.attention")

# FlashInfer versions whose package __init__ only re-exports its submodules (plus opt-in tracing and
# a version log line under FLASHINFER_LOGLEVEL), so that flashinfer.decode / flashinfer.prefill work
# without it: read in 0.7.4's __init__.py. Another version imports whole.
LEAN_VERSIONS = ("0.7.4",)
USED = ("flashinfer.decode", "flashinfer.prefill")   # what graphrt's CUDA paths import

# Imports nothing of graphrt at module level: `graphrt serve` checks for FlashInfer before it has
# chosen Triton's mode, and flashinfer_layout pulls in graphrt.kernels (Triton kernels).


def install_line() -> str:
    """How to install the FlashInfer graphrt knows (the gpu extra, or the pinned wheel)."""
    from graphrt.attention.flashinfer_layout import KNOWN_VERSIONS
    return f'pip install "graphrt[gpu]" (or pip install flashinfer-python=={KNOWN_VERSIONS[-1]})'


class FlashInferMissing(ImportError):
    """FlashInfer is not installed and a CUDA path needs it; the message says how to install it."""

    def __init__(self, what: str):
        super().__init__(f"{what} needs FlashInfer, which is not installed: {install_line()}", name="flashinfer")


def flashinfer_installed() -> bool:
    """Whether `import flashinfer` can find the package (without importing it; a None entry in
    sys.modules, as tests use to hide it, counts as missing)."""
    if "flashinfer" in sys.modules:
        return sys.modules["flashinfer"] is not None
    return importlib.util.find_spec("flashinfer") is not None


def require_flashinfer(what: str) -> None:
    """Raise FlashInferMissing (naming `what` needs it) unless FlashInfer is installed."""
    if not flashinfer_installed():
        raise FlashInferMissing(what)


_prefetch: threading.Thread | None = None      # the one prefetch thread of this process


def prefetch_flashinfer() -> bool:
    """Start importing FlashInfer on a daemon thread -> whether one started (only with
    GRAPHRT_PREFETCH_IMPORTS=1, and not when it is imported or missing or a prefetch is running;
    another value than 0 or 1 is a ValueError naming it). Errors stay on the thread: the caller's
    own import raises them."""
    global _prefetch
    on = os.environ.get("GRAPHRT_PREFETCH_IMPORTS", "0")
    if on not in ("0", "1"):
        raise ValueError(f"GRAPHRT_PREFETCH_IMPORTS: must be 0 or 1, got {on!r}")
    if on == "0" or "flashinfer" in sys.modules \
            or (_prefetch is not None and _prefetch.is_alive()) or not flashinfer_installed():
        return False

    def run():
        try:
            _import(USED)
        except BaseException:          # noqa: BLE001 - import_flashinfer raises it on the caller's thread
            pass
    _prefetch = threading.Thread(target=run, name="graphrt-import-flashinfer", daemon=True)
    _prefetch.start()
    return True


def join_prefetch() -> None:
    """Wait for a running prefetch (FlashInfer reads its environment while it imports)."""
    t = _prefetch
    if t is not None and t is not threading.current_thread():
        t.join()


def import_flashinfer(what: str, module: str = "flashinfer"):
    """Import `module` (flashinfer or one of its submodules; graphrt's paths name the submodule
    they use) for `what`, after a prefetch under way; a submodule imports lean where the version
    allows (module docstring). A missing FlashInfer is FlashInferMissing with the install line; any
    other import error of an installed FlashInfer (a CUDA or torch mismatch) is raised as it is."""
    join_prefetch()
    try:
        return _import((module,))[0]
    except ModuleNotFoundError as e:
        if e.name is not None and e.name.split(".")[0] == "flashinfer" and not flashinfer_installed():
            raise FlashInferMissing(what) from e
        raise


def flashinfer_version(what: str) -> str:
    """The imported FlashInfer's version (`flashinfer.version`, present lean or whole)."""
    return import_flashinfer(what, "flashinfer.version").__version__


_lean_lock = threading.RLock()


def _import(modules: tuple[str, ...]) -> list:
    """Import each of `modules`: the package lean first where it is not imported yet and its
    version allows; a lean import that raises completes the package (the whole __init__), logged,
    and imports again, so an error of the whole import is raised as it is."""
    with _lean_lock:
        lean = "flashinfer" not in sys.modules and _lean_allowed() and _lean_package()
        package = sys.modules.get("flashinfer")
        state = getattr(package, "__dict__", {}).get("_graphrt_lean")
        try:
            if state is not None:
                state.importing = True
            return [_complete() if m == "flashinfer" else importlib.import_module(m) for m in modules]
        except Exception as e:        # noqa: BLE001 - imported whole below, which raises its own error
            if not lean or sys.modules.get("flashinfer") is not package:   # or the whole __init__ raised
                raise
            log.warning("FlashInfer's lean import failed (%s: %s); importing it whole (GRAPHRT_LEAN_IMPORTS=0 "
                        "skips the attempt)", type(e).__name__, e)
        finally:
            if state is not None:
                state.importing = False
        _complete()
        return [importlib.import_module(m) for m in modules]


def _lean_allowed() -> bool:
    on = os.environ.get("GRAPHRT_LEAN_IMPORTS", "1")
    if on not in ("0", "1"):
        raise ValueError(f"GRAPHRT_LEAN_IMPORTS: must be 0 or 1, got {on!r}")
    if on == "0" or not flashinfer_installed():
        return False
    from graphrt.cache.manifest import flashinfer_version as installed_version   # read, not imported
    return installed_version() in LEAN_VERSIONS


class _Lean:
    """A lean package's state: `importing` while graphrt imports its submodules, `running` while
    its __init__ runs, `done` after."""

    def __init__(self):
        self.importing = self.running = self.done = False


def _lean_package() -> bool:
    """Put FlashInfer's package module into sys.modules without running its __init__ -> True.
    Its __getattr__ imports a submodule it is asked for (an import inside FlashInfer, now or later)
    and runs the __init__ (into the same module) for the first other name it lacks; while graphrt's
    own submodule imports run, such a name is an AttributeError (the lean import then fails)."""
    spec = importlib.util.find_spec("flashinfer")
    if spec is None or spec.loader is None or not spec.submodule_search_locations:
        return False
    mod, state = importlib.util.module_from_spec(spec), _Lean()

    def __getattr__(name):
        if not (state.running or state.done):
            if not name.startswith("__") and importlib.util.find_spec(f"flashinfer.{name}") is not None:
                return importlib.import_module(f"flashinfer.{name}")
            if not state.importing:
                return getattr(_complete(), name)
        raise AttributeError(f"module 'flashinfer' has no attribute {name!r}")
    mod.__getattr__ = __getattr__
    mod._graphrt_lean = state
    sys.modules["flashinfer"] = mod
    return True


def _complete():
    """The whole flashinfer package: a lean one's __init__ run into it once; one imported whole as
    it is. An __init__ that raises leaves no package in sys.modules (as a failed import does)."""
    with _lean_lock:
        mod = sys.modules.get("flashinfer")
        state = getattr(mod, "__dict__", {}).get("_graphrt_lean")
        if state is None or state.done:
            return importlib.import_module("flashinfer")
        state.running = True
        try:
            mod.__spec__.loader.exec_module(mod)
            state.done = True
        except BaseException:
            if sys.modules.get("flashinfer") is mod:
                del sys.modules["flashinfer"]
            raise
        finally:
            state.running = False
        return mod


__all__ = ["FlashInferMissing", "install_line", "flashinfer_installed", "import_flashinfer", "require_flashinfer",
           "prefetch_flashinfer", "join_prefetch", "flashinfer_version", "LEAN_VERSIONS", "USED"]
