"""Starting worker processes whatever the caller is: a guarded script, an unguarded one, `python -`,
`python -c`, a notebook.

The "spawn" start method re-runs the caller's main module in each child before it unpickles the
target (so that functions defined there resolve). For graphrt's own workers that is wrong: a script
without an `if __name__ == "__main__":` guard would build its LLM again inside the worker, which
then dies while bootstrapping. `start_detached_from_main` starts processes whose target lives in
graphrt with the caller's main module hidden from the child's preparation data, so the child
imports graphrt and nothing of the caller's.
"""
from __future__ import annotations

import sys
import threading
import types
from contextlib import contextmanager

_swap = threading.Lock()  # one start at a time swaps sys.modules["__main__"]


@contextmanager
def _main_hidden():
    """sys.modules["__main__"] is a bare module (no __file__, no __spec__) inside the block."""
    with _swap:
        main = sys.modules.get("__main__")
        sys.modules["__main__"] = types.ModuleType("__main__")
        try:
            yield
        finally:
            if main is None:
                sys.modules.pop("__main__", None)
            else:
                sys.modules["__main__"] = main


def start_detached_from_main(procs) -> None:
    """p.start() for each process (spawn context). Targets and args must be importable without
    the caller's main module (functions of graphrt, plain data): they are pickled inside."""
    for p in procs:
        if getattr(getattr(p, "_target", None), "__module__", "") == "__main__":
            raise ValueError("target: a function of the caller's __main__ module cannot be started "
                             "detached from it; define it in an importable module")
    with _main_hidden():
        for p in procs:
            p.start()
