"""Triton as a dependency of the GPU path only: the one check, with the install line when missing.

A CPU install of graphrt carries no Triton (`pip install graphrt`, or with the `serve` extra): on
a CPU the model runs the torch kernel set (kernels/ops.py), which imports none. Triton comes with
the `gpu` extra (CUDA runs the Triton kernels) and the `test` extra (the kernel tests and
graphrt-capture run the Triton kernels through its interpreter on a CPU). graphrt's Triton kernel
modules import triton at their top and are imported only where Triton kernels run; the entry
points to those paths call `require_triton` first, so a missing Triton is one line saying what
needs it and how to install it, not a ModuleNotFoundError from inside a kernel module.

    require_triton("device 'cuda'")        # TritonMissing (an ImportError) unless installed
"""
from __future__ import annotations

import importlib.util
import sys

INSTALL = ('pip install "graphrt[gpu]" on a GPU machine; on a CPU, the test extra ("graphrt[test]") or '
           'pip install "triton>=3.0" (graphrt itself runs on a CPU without it: kernels="torch")')


class TritonMissing(ImportError):
    """Triton is not installed and a path that runs Triton kernels was asked for."""

    def __init__(self, what: str):
        super().__init__(f"{what} needs Triton, which is not installed: {INSTALL}", name="triton")


def triton_installed() -> bool:
    """Whether `import triton` can find the package (without importing it; a None entry in
    sys.modules, as tests use to hide it, counts as missing)."""
    if "triton" in sys.modules:
        return sys.modules["triton"] is not None
    try:
        return importlib.util.find_spec("triton") is not None
    except (ImportError, ValueError):
        return False


def require_triton(what: str) -> None:
    """Raise TritonMissing (naming `what` needs it) unless Triton is installed."""
    if not triton_installed():
        raise TritonMissing(what)


__all__ = ["TritonMissing", "triton_installed", "require_triton", "INSTALL"]
