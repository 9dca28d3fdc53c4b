"""EAGLE-3 draft heads: the public checkpoint layouts, the head's forward, chain drafting.

config.py (Eagle3Config from either config.json layout), weights.py (public tensor names, the
fused layout), checkpoint.py (load_eagle3, read/write a head directory), convert.py (original
<-> speculators), head.py (Eagle3Head: extend / chain_step / write_kv / prefill over the head's
paged KV), propose.py (Eagle3Drafter: draft-extend + k - 1 chain steps a round, the first draft),
phase.py (the head as a phase of the speculative rounds), prompt.py (the prompt pass as graphs).
"""
from graphrt.speculative.eagle3.checkpoint import Eagle3Checkpoint, load_eagle3
from graphrt.speculative.eagle3.config import Eagle3Config, default_layer_ids, parse_config
from graphrt.speculative.eagle3.convert import convert_head
from graphrt.speculative.eagle3.head import Eagle3Head
from graphrt.speculative.eagle3.propose import Eagle3Drafter
from graphrt.speculative.eagle3.weights import Eagle3Weights

__all__ = ["Eagle3Checkpoint", "Eagle3Config", "Eagle3Drafter", "Eagle3Head", "Eagle3Weights",
           "convert_head", "default_layer_ids", "load_eagle3", "parse_config"]
