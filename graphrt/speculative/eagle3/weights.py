"""An EAGLE-3 head's tensors: the public names of both layouts and graphrt's fused layout.

Public tensors (original layout names; the speculators layout spells `midlayer.` as `layers.0.`),
H = hidden_size, Ht = the target's hidden size (= H), I = intermediate_size, Hq / Hkv / D the
heads, KV heads and head_dim, Vd = draft_vocab_size, V = the target's vocabulary:

    fc.weight                                  [H, 3 Ht]   three target hidden states -> H
    midlayer.input_layernorm.weight            [H]         RMSNorm of the token embedding
    midlayer.hidden_norm.weight                [H]         RMSNorm of the fused hidden state
    midlayer.self_attn.{q,k,v}_proj.weight     [Hq D | Hkv D, 2 H]
    midlayer.self_attn.o_proj.weight           [H, Hq D]
    midlayer.post_attention_layernorm.weight   [H]
    midlayer.mlp.{gate,up}_proj.weight         [I, H];  midlayer.mlp.down_proj.weight [H, I]
    norm.weight                                [H];     lm_head.weight [Vd, H]
    d2t                                        [Vd] int64: target id of draft id i = i + d2t[i]
    t2d                                        [V] bool: target ids inside the draft vocabulary
    embed_tokens.weight (optional)             [V, H]: absent = the target's embeddings

`Eagle3Weights` fuses q/k/v into one [(Hq + 2 Hkv) D, 2 H] weight and gate/up into one [2 I, H]
(as graphrt/model/weights.py does for the target) and keeps the draft vocabulary as
`draft_ids` [Vd] int64 target ids. Missing d2t and t2d mean the identity (only when Vd == V).
"""
from __future__ import annotations

from dataclasses import dataclass, fields

import torch

from graphrt.checkpoint.hf_files import CheckpointError

LAYER_PREFIX = {"original": "midlayer.", "speculators": "layers.0."}
IGNORED_SUFFIXES = ("rotary_emb.inv_freq",)              # old transformers saved it; unused
IGNORED_NAMES = ("verifier_lm_head.weight", "verifier_norm.weight")


def public_shapes(cfg) -> dict[str, tuple[int, ...]]:
    """Expected shape of every required float tensor, by its original-layout name."""
    h, i, d = cfg.hidden_size, cfg.intermediate_size, cfg.head_dim
    th = cfg.target_hidden_size or h
    m = "midlayer."
    return {"fc.weight": (h, 3 * th), m + "input_layernorm.weight": (h,), m + "hidden_norm.weight": (h,),
            m + "self_attn.q_proj.weight": (cfg.num_heads * d, 2 * h),
            m + "self_attn.k_proj.weight": (cfg.num_kv_heads * d, 2 * h),
            m + "self_attn.v_proj.weight": (cfg.num_kv_heads * d, 2 * h),
            m + "self_attn.o_proj.weight": (h, cfg.num_heads * d),
            m + "post_attention_layernorm.weight": (h,),
            m + "mlp.gate_proj.weight": (i, h), m + "mlp.up_proj.weight": (i, h),
            m + "mlp.down_proj.weight": (h, i), "norm.weight": (h,),
            "lm_head.weight": (cfg.draft_vocab_size, h)}


def to_layout(name: str, layout: str) -> str:
    """An original-layout tensor name in `layout`."""
    return LAYER_PREFIX[layout] + name[len("midlayer."):] if name.startswith("midlayer.") else name


def from_layout(name: str, layout: str) -> str:
    """A tensor name of `layout` in the original layout (unchanged when not a layer tensor)."""
    p = LAYER_PREFIX[layout]
    return "midlayer." + name[len(p):] if name.startswith(p) else name


@dataclass(frozen=True)
class Eagle3Weights:
    """Fused head weights, one dtype, one device (draft_ids: int64 on the same device).

    fc [H, 3H]; input_norm, hidden_norm, post_attn_norm, norm [H]; qkv [(Hq + 2 Hkv) D, 2H]
    (rows q, k, v; input columns: normed embedding, then normed hidden); o [H, Hq D];
    gate_up [2I, H] (rows gate, up); down [H, I]; lm_head [Vd, H]; draft_ids [Vd] int64 target
    ids, strictly increasing; embed [V, H] or None (use the target's).
    """
    fc: torch.Tensor
    input_norm: torch.Tensor
    hidden_norm: torch.Tensor
    qkv: torch.Tensor
    o: torch.Tensor
    post_attn_norm: torch.Tensor
    gate_up: torch.Tensor
    down: torch.Tensor
    norm: torch.Tensor
    lm_head: torch.Tensor
    draft_ids: torch.Tensor
    embed: torch.Tensor | None = None

    @property
    def dtype(self) -> torch.dtype:
        return self.fc.dtype

    @property
    def device(self) -> torch.device:
        return self.fc.device

    @property
    def nbytes(self) -> int:
        """Bytes of every tensor (what one head step streams, embeddings excluded)."""
        return sum(t.numel() * t.element_size() for f in fields(self) if f.name != "embed"
                   for t in [getattr(self, f.name)] if t is not None)


def check_tensors(cfg, tensors: dict, where: str) -> None:
    """CheckpointError naming the tensor when `tensors` (original-layout names -> tensors, as
    read) are missing, misshapen, of a wrong dtype, or unknown."""
    want = public_shapes(cfg)
    for name, shape in want.items():
        if name not in tensors:
            raise CheckpointError(f"{where}: tensor {name!r} missing")
        t = tensors[name]
        if not t.is_floating_point():
            raise CheckpointError(f"{where}: tensor {name!r} has dtype {t.dtype}; expected a float dtype")
        if tuple(t.shape) != shape:
            raise CheckpointError(f"{where}: tensor {name!r} has shape {list(t.shape)}, expected "
                                  f"{list(shape)} from config.json")
    extra = "embed_tokens.weight"
    if extra in tensors and tuple(tensors[extra].shape) != (cfg.vocab_size, cfg.hidden_size):
        raise CheckpointError(f"{where}: tensor {extra!r} has shape {list(tensors[extra].shape)}, expected "
                              f"{[cfg.vocab_size, cfg.hidden_size]}")
    known = set(want) | {"d2t", "t2d", extra}
    for name in tensors:
        if name not in known and name not in IGNORED_NAMES and not name.endswith(IGNORED_SUFFIXES):
            raise CheckpointError(f"{where}: tensor {name!r} is not part of a 1-layer EAGLE-3 head")


def draft_ids_of(cfg, tensors: dict, where: str) -> torch.Tensor:
    """[Vd] int64 target ids of the draft vocabulary, from d2t (and t2d, checked against it)."""
    vd, v = cfg.draft_vocab_size, cfg.vocab_size
    d2t, t2d = tensors.get("d2t"), tensors.get("t2d")
    if t2d is not None:
        if tuple(t2d.shape) != (v,) or t2d.dtype not in (torch.bool, torch.uint8, torch.int64, torch.int32):
            raise CheckpointError(f"{where}: tensor 't2d' is {t2d.dtype} {list(t2d.shape)}, expected bool [{v}]")
        mask = t2d.to(torch.bool)
        if int(mask.sum()) != vd:
            raise CheckpointError(f"{where}: tensor 't2d' marks {int(mask.sum())} target ids, "
                                  f"draft_vocab_size is {vd}")
    if d2t is None:
        if t2d is not None:
            return mask.nonzero().flatten().to(torch.int64)
        if vd != v:
            raise CheckpointError(f"{where}: tensor 'd2t' missing (draft_vocab_size {vd} != vocab_size {v})")
        return torch.arange(v, dtype=torch.int64)
    if tuple(d2t.shape) != (vd,) or d2t.dtype not in (torch.int64, torch.int32):
        raise CheckpointError(f"{where}: tensor 'd2t' is {d2t.dtype} {list(d2t.shape)}, expected int64 [{vd}]")
    ids = torch.arange(vd, dtype=torch.int64) + d2t.to(torch.int64)
    if vd and (int(ids.min()) < 0 or int(ids.max()) >= v):
        raise CheckpointError(f"{where}: tensor 'd2t' maps draft ids to target ids outside [0, {v})")
    if vd > 1 and not bool((ids[1:] > ids[:-1]).all()):
        raise CheckpointError(f"{where}: tensor 'd2t' maps two draft ids to one target id (or out of order)")
    if t2d is not None and not bool(mask[ids].all()):
        raise CheckpointError(f"{where}: tensors 'd2t' and 't2d' disagree on the draft vocabulary")
    return ids


def fuse(cfg, tensors: dict, *, dtype: torch.dtype, device, where: str) -> Eagle3Weights:
    """Checked original-layout tensors -> Eagle3Weights on `device` in `dtype`."""
    check_tensors(cfg, tensors, where)
    ids = draft_ids_of(cfg, tensors, where)
    device = torch.device(device)

    def w(*names):
        parts = [tensors[n].to(device=device, dtype=dtype) for n in names]
        return (parts[0] if len(parts) == 1 else torch.cat(parts)).contiguous()

    m = "midlayer."
    embed = tensors.get("embed_tokens.weight")
    return Eagle3Weights(
        fc=w("fc.weight"), input_norm=w(m + "input_layernorm.weight"), hidden_norm=w(m + "hidden_norm.weight"),
        qkv=w(*(m + f"self_attn.{x}_proj.weight" for x in "qkv")), o=w(m + "self_attn.o_proj.weight"),
        post_attn_norm=w(m + "post_attention_layernorm.weight"),
        gate_up=w(m + "mlp.gate_proj.weight", m + "mlp.up_proj.weight"), down=w(m + "mlp.down_proj.weight"),
        norm=w("norm.weight"), lm_head=w("lm_head.weight"), draft_ids=ids.to(device),
        embed=None if embed is None else embed.to(device=device, dtype=dtype).contiguous())


__all__ = ["Eagle3Weights", "public_shapes", "check_tensors", "draft_ids_of", "fuse", "to_layout",
           "from_layout", "LAYER_PREFIX"]
