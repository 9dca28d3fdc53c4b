"""FlashInfer's package imported lean: the submodules graphrt uses without the package's __init__.

FlashInfer 0.7.4's `__init__` imports hundreds of modules (MoE, GEMM, Mamba, ...) to re-export
their names; graphrt's CUDA paths use two submodules, `flashinfer.decode` and `flashinfer.prefill`
(2.2 s against 0.7 s on a 2-core host). Where the installed `__init__.py` is one read and found to
do nothing else (LEAN_INITS, by its sha256: a patched or other version imports whole), the package
module goes into sys.modules without running it, and the submodules import as usual. The package
then behaves as the whole one would, later:

- the first name it lacks (`flashinfer.X`, `from flashinfer import X`, `dir(flashinfer)`) from any
  code runs the `__init__` into the same module (`complete`), so the objects are the same;
- while graphrt's own imports run (`importing`) or the `__init__` runs (`running`), a missing name
  is an AttributeError on that thread (the import system then imports a submodule, as in a whole
  import); another thread waits for them;
- the submodules the `__init__` rebinds to another object (0.7.4: `xqa` and `fi_trace`, functions of
  the same name) are not left on the package, so they resolve as in a whole import;
- the version names (`__version__`, `__git_commit__`, `__git_version__`) are set from
  `flashinfer.version`;
- FLASHINFER_TRACE_APPLY or FLASHINFER_LOGLEVEL set (features of the `__init__`): whole import.

A lean import that fails on a name only the `__init__` binds imports whole (logged); any other
error is raised as it is. An `__init__` that raises leaves no package in sys.modules, as a failed
import does. Only flashinfer_import.py uses this module.
"""
from __future__ import annotations

import ast
import hashlib
import importlib
import importlib.util
import logging
import os
import sys
import threading
from pathlib import Path

log = logging.getLogger("graphrt.attention")

# sha256 of a FlashInfer __init__.py that only re-exports its submodules (opt-in Trace Apply and a
# FLASHINFER_LOGLEVEL version line aside) -> its version; read in full before it was added here
LEAN_INITS = {"5dbe288e2df718c517bef48905900ebd76a1d7ab40e9cea681ec1c39dfa5e6f7": "0.7.4"}
USED = ("flashinfer.version", "flashinfer.decode", "flashinfer.prefill")   # what graphrt's CUDA paths import
OPT_IN_ENV = ("FLASHINFER_TRACE_APPLY", "FLASHINFER_LOGLEVEL")            # the __init__ acts on these
VERSION_NAMES = ("__version__", "__git_commit__", "__git_version__")

_lock = threading.RLock()


class _Lean:
    """A lean package's state: `importing` while graphrt imports its submodules and `running` while
    the __init__ runs (both on thread `owner`), `done` after the __init__ ran."""

    def __init__(self, init_path: Path):
        self.rebound = _rebound_names(init_path)    # read once: what the __init__ binds (_drop_rebound)
        self.importing = self.running = self.done = False
        self.owner: int | None = None


def import_modules(modules: tuple[str, ...]) -> list:
    """Import each of `modules` (`flashinfer` or its submodules): the package lean first where it
    is not imported yet and allowed(); a lean import failing on a name only the __init__ binds
    completes the package, logged, and imports again."""
    with _lock:
        if "flashinfer" not in sys.modules and allowed():
            _lean_package()
        package = sys.modules.get("flashinfer")
        state = _state(package)
        lean = state is not None and not state.done
        try:
            if lean:
                state.importing, state.owner = True, threading.get_ident()
            mods = [complete() if m == "flashinfer" else importlib.import_module(m) for m in modules]
            if lean:
                _drop_rebound(package, state)
            return mods
        except (ImportError, AttributeError) as e:
            if not lean or sys.modules.get("flashinfer") is not package or not _lacks_init_name(e, package):
                raise
            log.warning("FlashInfer's lean import failed (%s: %s); importing it whole (GRAPHRT_LEAN_IMPORTS=0 "
                        "skips the attempt)", type(e).__name__, e)
        finally:
            if lean:
                state.importing = False
        complete()
        return [importlib.import_module(m) for m in modules]


def allowed() -> bool:
    """GRAPHRT_LEAN_IMPORTS (default 1; 0 or 1, else ValueError naming it), none of OPT_IN_ENV on,
    FlashInfer installed with an __init__.py of LEAN_INITS."""
    on = os.environ.get("GRAPHRT_LEAN_IMPORTS", "1")
    if on not in ("0", "1"):
        raise ValueError(f"GRAPHRT_LEAN_IMPORTS: must be 0 or 1, got {on!r}")
    if on == "0" or any(os.environ.get(name, "0") not in ("", "0", "false", "False") for name in OPT_IN_ENV):
        return False
    spec = importlib.util.find_spec("flashinfer") if sys.modules.get("flashinfer", 0) is not None else None
    if spec is None or spec.origin is None or not spec.submodule_search_locations:
        return False
    try:
        return hashlib.sha256(Path(spec.origin).read_bytes()).hexdigest() in LEAN_INITS
    except OSError:
        return False


def complete():
    """The whole flashinfer package: a lean one's __init__ run into it once (on this thread; others
    wait); one imported whole as it is."""
    with _lock:
        mod = sys.modules.get("flashinfer")
        state = _state(mod)
        if state is None or state.done:
            return importlib.import_module("flashinfer")
        outer = state.importing, state.owner
        state.running, state.owner = True, threading.get_ident()
        try:
            mod.__spec__.loader.exec_module(mod)
            state.done = True
        except BaseException:
            if sys.modules.get("flashinfer") is mod:
                del sys.modules["flashinfer"]
            raise
        finally:
            state.running = False
            state.importing, state.owner = outer
        return mod


def _state(mod) -> _Lean | None:
    return getattr(mod, "__dict__", {}).get("_graphrt_lean")


def _lean_package() -> None:
    """Put FlashInfer's package module into sys.modules without running its __init__ (module
    docstring: how it then behaves)."""
    spec = importlib.util.find_spec("flashinfer")
    mod, state = importlib.util.module_from_spec(spec), _Lean(Path(spec.origin))

    def __getattr__(name):
        if (state.importing or state.running) and state.owner != threading.get_ident():
            with _lock:                             # another thread's import or __init__: wait for it
                pass
            return getattr(mod, name)
        if state.importing or state.running or state.done:
            raise AttributeError(f"module 'flashinfer' has no attribute {name!r}", name=name, obj=mod)
        return getattr(complete(), name)

    def __dir__():
        whole = complete()
        own = vars(whole).get("__dir__")
        return own() if own is not None and own is not __dir__ else sorted(vars(whole))
    mod.__getattr__, mod.__dir__, mod._graphrt_lean = __getattr__, __dir__, state
    sys.modules["flashinfer"] = mod


def _drop_rebound(mod, state: _Lean) -> None:
    """After lean imports: the version names from flashinfer.version, and no submodule left on the
    package under a name its __init__ binds to another object (from .xqa import xqa)."""
    version = sys.modules.get("flashinfer.version")
    for name in VERSION_NAMES:
        if version is not None and hasattr(version, name):
            setattr(mod, name, getattr(version, name))
    for name in state.rebound:
        value = vars(mod).get(name)
        if value is not None and value is sys.modules.get(f"flashinfer.{name}"):
            delattr(mod, name)


def _rebound_names(init_path: Path) -> set[str]:
    """Names the __init__ binds at module level (inside if / try / with blocks too) other than to
    its own submodule: `from .x import a as b` (b), definitions and assignments; `from . import x`
    binds the submodule itself."""
    names, todo = set(), list(ast.parse(init_path.read_text()).body)
    while todo:
        node = todo.pop()
        if isinstance(node, ast.ImportFrom) and node.module is not None and node.level >= 1:
            names.update(a.asname or a.name for a in node.names)
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, (ast.If, ast.Try, ast.With)):
            todo += node.body + getattr(node, "orelse", []) + getattr(node, "finalbody", [])
            todo += [n for h in getattr(node, "handlers", []) for n in h.body]
    return names


def _lacks_init_name(e: Exception, package) -> bool:
    """Whether `e` is the lean package lacking a name: `from flashinfer import X` (ImportError
    naming flashinfer, not a missing module) or `flashinfer.X` (its AttributeError)."""
    if isinstance(e, ModuleNotFoundError):
        return False
    if isinstance(e, ImportError):
        return e.name == "flashinfer"
    return getattr(e, "obj", None) is package
