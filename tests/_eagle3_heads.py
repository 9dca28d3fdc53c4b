"""Test helper: an EAGLE-3 head with random weights for a checkpoint of tools/make_checkpoint.py,
written in the public original layout (config.json + model.safetensors) by graphrt's writer."""
from __future__ import annotations

import json
from pathlib import Path

import torch


def write_random_head(target: Path, out: Path, *, layer_ids=(0, 1, 2), seed: int = 0, scale: float = 0.05,
                      intermediate: int = 96, repeat: bool = False, dtype=torch.float32) -> Path:
    """A full-vocabulary head (d2t zeros) reading the target's hidden states `layer_ids`.

    repeat=True: a head that proposes the last token k times. fc passes the third state through
    (for layer_ids[2] = L: the target's final pre-norm stream), o_proj and down_proj are zero, and
    norm / lm_head are the target's, so its logits are the target's own at the paired position:
    it predicts the token it is paired with, and a chain repeats it. A random target that repeats
    tokens then accepts often (multi-token rounds, mid-round stops). dtype: of the stored tensors."""
    from graphrt.speculative.eagle3 import Eagle3Config
    from graphrt.speculative.eagle3.checkpoint import write_head
    from graphrt.speculative.eagle3.convert import original_config
    t = json.loads((Path(target) / "config.json").read_text())
    h, v, hq, hkv, d = (t["hidden_size"], t["vocab_size"], t["num_attention_heads"], t["num_key_value_heads"],
                        t["head_dim"])
    cfg = Eagle3Config(layout="original", hidden_size=h, intermediate_size=intermediate, num_heads=hq,
                       num_kv_heads=hkv, head_dim=d, vocab_size=v, draft_vocab_size=v, rms_norm_eps=1e-5,
                       rope_theta=10000.0, rope_scaling=None, max_position_embeddings=t["max_position_embeddings"],
                       layer_ids=tuple(layer_ids), torch_dtype="float32")
    g = torch.Generator().manual_seed(seed)

    def r(*shape):
        return torch.randn(shape, generator=g) * scale
    m = "midlayer."
    tensors = {"fc.weight": r(h, 3 * h), m + "input_layernorm.weight": torch.ones(h),
               m + "hidden_norm.weight": torch.ones(h), m + "self_attn.q_proj.weight": r(hq * d, 2 * h),
               m + "self_attn.k_proj.weight": r(hkv * d, 2 * h), m + "self_attn.v_proj.weight": r(hkv * d, 2 * h),
               m + "self_attn.o_proj.weight": r(h, hq * d), m + "post_attention_layernorm.weight": torch.ones(h),
               m + "mlp.gate_proj.weight": r(intermediate, h), m + "mlp.up_proj.weight": r(intermediate, h),
               m + "mlp.down_proj.weight": r(h, intermediate), "norm.weight": torch.ones(h),
               "lm_head.weight": r(v, h) * 20, "d2t": torch.zeros(v, dtype=torch.int64),
               "t2d": torch.ones(v, dtype=torch.bool)}
    if repeat:
        from safetensors.torch import load_file
        w = {}
        for f in sorted(Path(target).glob("*.safetensors")):          # one file or shards
            w.update({n: t for n, t in load_file(str(f)).items() if n in ("model.norm.weight", "lm_head.weight")})
        tensors["fc.weight"] = torch.cat([torch.zeros(h, 2 * h), torch.eye(h)], 1)
        tensors[m + "self_attn.o_proj.weight"] = torch.zeros(h, hq * d)
        tensors[m + "mlp.down_proj.weight"] = torch.zeros(h, intermediate)
        tensors["norm.weight"] = w["model.norm.weight"].float()
        tensors["lm_head.weight"] = w["lm_head.weight"].float()
    tensors = {n: t.to(dtype) if t.is_floating_point() else t for n, t in tensors.items()}
    return write_head(out, original_config(cfg), tensors, "original")


def repeat_head_counts(outputs: list[list[int]], k: int) -> tuple[int, int, float]:
    """What the repeat head earns on greedy outputs (token ids after each prompt): (accepted,
    proposed, repeat rate). The first token comes from the prefill; each round then proposes
    the last token k times, accepts the target's tokens while they repeat it (at most k, and
    fewer than the request still emits) and emits one more. Exact for the engine where the
    requests stop at max_tokens only (a host-side stop leaves the device a block past it).
    Repeat rate: the share of consecutive pairs with token[t + 1] == token[t]."""
    accepted = proposed = pairs = reps = 0
    for toks in outputs:
        pairs += max(len(toks) - 1, 0)
        reps += sum(a == b for a, b in zip(toks, toks[1:]))
        i = 1
        while i < len(toks):
            a = 0
            while a < k and i + a < len(toks) - 1 and toks[i + a] == toks[i - 1]:
                a += 1
            accepted, proposed, i = accepted + a, proposed + k, i + a + 1
    return accepted, proposed, reps / max(pairs, 1)
