"""FlashInfer as an optional dependency: one place that imports it, with the install line when missing.

Every CUDA path needs FlashInfer (prefill attention, the `flashinfer*` and `xqa` decode backends);
a CPU install does not (`pip install -e ".[test]"` pulls no CUDA package). It comes with the `gpu`
extra: `pip install "graphrt[gpu]"` (flashinfer-python 0.7.4, the version whose plan layout the
device planner knows, `flashinfer_layout.KNOWN_VERSIONS`).

    fi = import_flashinfer("backend 'flashinfer'")             # the module, or FlashInferMissing
    decode = import_flashinfer("backend 'xqa'", "flashinfer.decode")
    require_flashinfer("device 'cuda'")                        # before loading anything: no import

FlashInfer's import takes seconds: its package `__init__` imports hundreds of modules, of which
graphrt uses two. Where the installed FlashInfer allows it, graphrt imports the package lean: those
submodules without the `__init__`, which runs on the first name the package lacks, so any other code
sees the whole package (flashinfer_lean.py, the one module that knows the `__init__`;
GRAPHRT_LEAN_IMPORTS=0 imports it whole).
"""
from __future__ import annotations

import importlib.util
import sys

from graphrt.attention.flashinfer_lean import import_modules

# Imports nothing else of graphrt at module level (flashinfer_lean: the standard library only):
# `graphrt serve` checks for FlashInfer before it has chosen Triton's mode, and flashinfer_layout
# pulls in graphrt.kernels (Triton kernels).


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


def import_flashinfer(what: str, module: str = "flashinfer"):
    """Import `module` (flashinfer or one of its submodules; graphrt's paths name the submodule
    they use) for `what`; a submodule imports lean where the installed FlashInfer allows it
    (module docstring). A missing FlashInfer is FlashInferMissing with the install line; any
    other import error of an installed FlashInfer (a CUDA or torch mismatch) is raised as it is."""
    try:
        return import_modules((module,))[0]
    except ModuleNotFoundError as e:
        if e.name is not None and e.name.split(".")[0] == "flashinfer" and not flashinfer_installed():
            raise FlashInferMissing(what) from e
        raise


def flashinfer_version(what: str) -> str:
    """The imported FlashInfer's version (`flashinfer.version`, present lean or whole)."""
    return import_flashinfer(what, "flashinfer.version").__version__


__all__ = ["FlashInferMissing", "install_line", "flashinfer_installed", "import_flashinfer", "require_flashinfer",
           "flashinfer_version"]
