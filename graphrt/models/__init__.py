"""Model families that decode through graphrt's AttentionContext."""
from .llama import LlamaDecoder, LlamaSpec

__all__ = ["LlamaDecoder", "LlamaSpec"]
