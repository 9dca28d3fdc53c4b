"""Speculative decoding on the device: proposers (n-gram), verification, acceptance, rounds."""
from graphrt.speculative.config import SpeculativeConfig
from graphrt.speculative.runner import SpeculativeRunner

__all__ = ["SpeculativeConfig", "SpeculativeRunner"]
