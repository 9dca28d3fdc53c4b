"""The engine-device boundary: what the engine asks of a device and what comes back.

caps.py (Capabilities: what an executor can do, read once), launch.py (the launch descriptions
Prefill, Block and Draw, and the one Result type), protocol.py (the Executor protocol the engine
drives), local.py (LocalExecutor: the protocol over one process's ModelRuntime and speculative
runner), changes.py (the slot changes the scheduler records and every launch carries),
input_batch.py (the executor's host stager of the slots' rows: what the changes changed, as SlotUpdates).
The tensor-parallel executor (graphrt/parallel/executor.py) implements the same protocol one
layer up.

Names resolve on first access (PEP 562): importing the package loads no Triton kernel.
"""
from importlib import import_module

_EXPORTS = {"Capabilities": "graphrt.worker.caps", "Draw": "graphrt.worker.launch",
            "Block": "graphrt.worker.launch", "Prefill": "graphrt.worker.launch", "Result": "graphrt.worker.launch",
            "Executor": "graphrt.worker.protocol", "check_executor": "graphrt.worker.protocol",
            "LocalExecutor": "graphrt.worker.local", "InputBatch": "graphrt.worker.input_batch",
            **{n: "graphrt.worker.changes" for n in ("Activate", "Deactivate", "SetHistory", "SetPages",
                                                     "SetProcessing", "SetToken")}}

__all__ = list(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'graphrt.worker' has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_EXPORTS))
