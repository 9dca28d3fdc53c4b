"""Speculative decoding on the device: proposers (n-gram, draft model), verification, acceptance, rounds.

Names resolve on first access (PEP 562): importing the package (e.g. for SpeculativeConfig, which
EngineConfig validates) loads no Triton kernel.
"""
from importlib import import_module

_EXPORTS = {"SpeculativeConfig": "graphrt.speculative.config",
            "DraftProposer": "graphrt.speculative.draft",
            "SpeculativeRunner": "graphrt.speculative.runner",
            "BlockOutput": "graphrt.speculative.runner"}

__all__ = list(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'graphrt.speculative' has no attribute {name!r}")
