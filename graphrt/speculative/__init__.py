"""Speculative decoding on the device: proposers (n-gram, draft model), verification, acceptance, rounds."""
from graphrt.speculative.config import SpeculativeConfig
from graphrt.speculative.draft import DraftProposer
from graphrt.speculative.runner import BlockOutput, SpeculativeRunner

__all__ = ["SpeculativeConfig", "SpeculativeRunner", "DraftProposer", "BlockOutput"]
