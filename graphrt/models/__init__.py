"""Model families that decode through graphrt's AttentionContext."""
from .llama import LlamaDecoder
from .spec import LlamaSpec
from .weights import LayerWeights, ModelWeights, fuse_hf_state_dict

__all__ = ["LlamaDecoder", "LlamaSpec", "LayerWeights", "ModelWeights", "fuse_hf_state_dict"]
