"""The model step: Llama/Qwen2/Qwen3 decoders over the attention runtime, captured whole.

Entry points: `ModelRuntime` (runtime.py: the graphed decode step with sampling),
`LlamaDecoder` (llama.py), `LlamaSpec` (spec.py), weights.py, prefill.py, sampling.py.
Imports only `graphrt.attention` and below.
"""
from graphrt.model.llama import LlamaDecoder
from graphrt.model.spec import LlamaSpec
from graphrt.model.weights import LayerWeights, ModelWeights, fuse_hf_state_dict

__all__ = ["LlamaDecoder", "LlamaSpec", "LayerWeights", "ModelWeights", "fuse_hf_state_dict"]
