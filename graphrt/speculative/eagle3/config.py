"""An EAGLE-3 head's geometry, read from either public config.json layout.

Two layouts exist for the same tensors:

- original (EAGLE / SpecForge): a LlamaConfig with `num_hidden_layers: 1`, `draft_vocab_size`,
  `architectures` one of ORIGINAL_ARCHITECTURES; optionally `eagle_config:
  {eagle_aux_hidden_state_layer_ids: [...]}` (or the same key at the top level);
- speculators (`speculators_model_type: "eagle3"`): the decoder geometry under
  `transformer_layer_config`, plus `draft_vocab_size`, `norm_before_residual`,
  `target_hidden_size`, `eagle_aux_hidden_state_layer_ids` and `speculators_config`
  (algorithm, proposal methods, verifier).

`layer_ids` name the target's hidden states the head reads, in ascending order: id i < L is the
residual stream entering decoder layer i (the output of layer i - 1; 0 = the embeddings), id L
the stream after the last layer, before the final norm (vLLM's and speculators' convention).
A config without ids uses DEFAULT: (2, L // 2, L - 3).

Every problem is one `CheckpointError` line naming the file and the field.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from graphrt.checkpoint.hf_files import CheckpointError, check_config

ORIGINAL_ARCHITECTURES = ("LlamaForCausalLMEagle3", "Eagle3LlamaForCausalLM")
SPECULATORS_ARCHITECTURES = ("Eagle3Speculator", "Eagle3DraftModel")
LAYOUTS = ("original", "speculators")
# transformers' LlamaConfig defaults: a speculators transformer_layer_config may be a diff dict
# (transformers 4.x `to_diff_dict` leaves out fields equal to these)
LLAMA_DEFAULTS = dict(vocab_size=32000, hidden_size=4096, intermediate_size=11008, num_hidden_layers=32,
                      num_attention_heads=32, max_position_embeddings=2048, rms_norm_eps=1e-6)


def default_layer_ids(num_layers: int) -> tuple[int, int, int]:
    """The target hidden states a head reads when its config names none: (2, L // 2, L - 3)."""
    return (2, num_layers // 2, num_layers - 3)


@dataclass(frozen=True)
class Eagle3Config:
    """Geometry of one EAGLE-3 head (one decoder layer whose q/k/v read 2 x hidden inputs).

    vocab_size: the target's vocabulary (embeddings and t2d rows); draft_vocab_size: rows of
    the head's lm_head (d2t maps them to target ids). layer_ids: None = DEFAULT for the
    target. head_dim, rope_theta, rope_scaling: what graphrt.model.rope reads.
    """
    layout: str
    hidden_size: int
    intermediate_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    draft_vocab_size: int
    rms_norm_eps: float
    rope_theta: float
    rope_scaling: dict | None
    max_position_embeddings: int
    layer_ids: tuple[int, ...] | None
    norm_before_residual: bool = False
    target_hidden_size: int | None = None
    torch_dtype: str | None = None
    verifier: str | None = None            # speculators_config.verifier.name_or_path
    speculative_tokens: int | None = None  # speculators_config's greedy proposal length

    @property
    def qkv_rows(self) -> int:
        return (self.num_heads + 2 * self.num_kv_heads) * self.head_dim

    def resolve_layer_ids(self, num_layers: int) -> tuple[int, ...]:
        """The target hidden states to record for a target of `num_layers` layers."""
        return self.layer_ids if self.layer_ids is not None else default_layer_ids(num_layers)

    def check_target(self, spec, where: str = "config.json") -> tuple[int, ...]:
        """CheckpointError naming the field when the head does not fit the target's LlamaSpec;
        returns the resolved layer ids."""
        th = self.target_hidden_size if self.target_hidden_size is not None else self.hidden_size
        for name, mine, theirs in (("vocab_size", self.vocab_size, spec.vocab_size),
                                   ("hidden_size", self.hidden_size, spec.hidden_size),
                                   ("target_hidden_size", th, spec.hidden_size)):
            if mine != theirs:
                raise CheckpointError(f"{where}: {name}: {mine}, the target has {theirs} "
                                      "(the head shares the target's embeddings and reads its hidden states)")
        ids = self.resolve_layer_ids(spec.num_layers)
        given = "eagle_aux_hidden_state_layer_ids" if self.layer_ids is not None else \
            f"eagle_aux_hidden_state_layer_ids (default (2, L//2, L-3) for L={spec.num_layers})"
        if len(ids) != 3 or len(set(ids)) != 3 or list(ids) != sorted(ids):
            raise CheckpointError(f"{where}: {given}: {list(ids)}: expected 3 distinct ascending ids")
        if min(ids) < 0 or max(ids) > spec.num_layers:
            raise CheckpointError(f"{where}: {given}: {list(ids)} out of range [0, {spec.num_layers}] "
                                  f"for a target of {spec.num_layers} layers")
        return tuple(ids)


def _int(raw: dict, name: str, where: str, *, default=None) -> int:
    v = raw.get(name, default)
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise CheckpointError(f"{where}: {name}: expected an int >= 1, got {v!r}")
    return v


def _bool(raw: dict, name: str, where: str) -> bool:
    v = raw.get(name, False)
    if not isinstance(v, bool):
        raise CheckpointError(f"{where}: {name}: expected true or false, got {v!r}")
    return v


def _layer_ids(v, where: str, name: str = "eagle_aux_hidden_state_layer_ids") -> tuple[int, ...] | None:
    if v is None:
        return None
    if not isinstance(v, list) or not v or any(isinstance(i, bool) or not isinstance(i, int) for i in v):
        raise CheckpointError(f"{where}: {name}: expected a list of ints, got {v!r}")
    return tuple(v)


def _geometry(cfg: dict, where: str) -> dict:
    """The decoder-layer fields shared by both layouts (cfg: a LlamaConfig dict)."""
    check_config(cfg, where)
    if cfg["num_hidden_layers"] != 1:
        raise CheckpointError(f"{where}: num_hidden_layers: {cfg['num_hidden_layers']}; graphrt runs "
                              "EAGLE-3 heads of exactly 1 decoder layer")
    for name in ("attention_bias", "mlp_bias"):
        if cfg.get(name):
            raise CheckpointError(f"{where}: {name}: biases are not supported in an EAGLE-3 head")
    act = cfg.get("hidden_act", "silu")
    if act != "silu":
        raise CheckpointError(f"{where}: hidden_act: {act!r}; supported: 'silu'")
    heads = cfg["num_attention_heads"]
    rope = cfg.get("rope_parameters") or {}            # transformers 5 spelling
    if not isinstance(rope, dict):
        raise CheckpointError(f"{where}: rope_parameters: expected an object, got {rope!r}")
    scaling = cfg.get("rope_scaling") or None
    if scaling is None and rope.get("rope_type", "default") != "default":
        scaling = dict(rope)
    if scaling is not None and not isinstance(scaling, dict):
        raise CheckpointError(f"{where}: rope_scaling: expected an object, got {scaling!r}")
    kind = (scaling or {}).get("rope_type", (scaling or {}).get("type", "default"))
    if kind not in ("default", "llama3"):
        raise CheckpointError(f"{where}: rope_scaling: type {kind!r} not supported (default, llama3)")
    return dict(hidden_size=cfg["hidden_size"], intermediate_size=cfg["intermediate_size"],
                num_heads=heads, num_kv_heads=cfg.get("num_key_value_heads") or heads,
                head_dim=cfg.get("head_dim") or cfg["hidden_size"] // heads, vocab_size=cfg["vocab_size"],
                rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
                rope_theta=float(cfg.get("rope_theta") or rope.get("rope_theta") or 10000.0),  # often omitted
                rope_scaling=None if kind == "default" else dict(scaling),
                max_position_embeddings=int(cfg.get("max_position_embeddings") or 131072),
                torch_dtype=cfg.get("torch_dtype") or cfg.get("dtype"))


def parse_config(raw: dict, file: Path | str = "config.json") -> Eagle3Config:
    """config.json (either layout) -> Eagle3Config; CheckpointError naming the field."""
    where = str(file)
    if "speculators_model_type" in raw:
        kind = raw["speculators_model_type"]
        if kind != "eagle3":
            raise CheckpointError(f"{where}: speculators_model_type: {kind!r}; graphrt loads 'eagle3' heads")
        layer = raw.get("transformer_layer_config")
        if not isinstance(layer, dict):
            raise CheckpointError(f"{where}: transformer_layer_config: expected an object, got {layer!r}")
        if layer.get("model_type", "llama") != "llama":
            raise CheckpointError(f"{where}: transformer_layer_config: model_type {layer.get('model_type')!r}; "
                                  "supported: 'llama'")
        geo = _geometry({**LLAMA_DEFAULTS, **layer}, f"{where}: transformer_layer_config")
        if raw.get("norm_before_fc"):
            raise CheckpointError(f"{where}: norm_before_fc: not supported")
        spec_cfg = raw.get("speculators_config") or {}
        if not isinstance(spec_cfg, dict):
            raise CheckpointError(f"{where}: speculators_config: expected an object, got {spec_cfg!r}")
        if spec_cfg.get("algorithm", "eagle3") != "eagle3":
            raise CheckpointError(f"{where}: speculators_config.algorithm: {spec_cfg.get('algorithm')!r}; "
                                  "expected 'eagle3'")
        verifier = (spec_cfg.get("verifier") or {}).get("name_or_path")
        tokens = None
        for m in spec_cfg.get("proposal_methods") or []:
            if isinstance(m, dict) and isinstance(m.get("speculative_tokens"), int):
                tokens = m["speculative_tokens"]
                break
        ids = _layer_ids(raw.get("eagle_aux_hidden_state_layer_ids"), where)
        th = raw.get("target_hidden_size")
        if th is not None:
            th = _int(raw, "target_hidden_size", where)
        return Eagle3Config(layout="speculators", draft_vocab_size=_int(raw, "draft_vocab_size", where),
                            layer_ids=ids, norm_before_residual=_bool(raw, "norm_before_residual", where),
                            target_hidden_size=th, verifier=verifier, speculative_tokens=tokens, **geo)
    archs = raw.get("architectures") or []
    if not isinstance(archs, list) or not any(a in ORIGINAL_ARCHITECTURES for a in archs):
        raise CheckpointError(f"{where}: architectures: {archs!r} is not an EAGLE-3 head; expected one of "
                              f"{list(ORIGINAL_ARCHITECTURES)} or a speculators config "
                              "(speculators_model_type: 'eagle3')")
    geo = _geometry(raw, where)
    eagle = raw.get("eagle_config") or {}
    if not isinstance(eagle, dict):
        raise CheckpointError(f"{where}: eagle_config: expected an object, got {eagle!r}")
    ids = _layer_ids(raw.get("eagle_aux_hidden_state_layer_ids",
                             eagle.get("eagle_aux_hidden_state_layer_ids")), where)
    th = raw.get("target_hidden_size")
    return Eagle3Config(layout="original",
                        draft_vocab_size=_int(raw, "draft_vocab_size", where, default=geo["vocab_size"]),
                        layer_ids=ids, norm_before_residual=_bool(raw, "norm_before_residual", where),
                        target_hidden_size=None if th is None else _int(raw, "target_hidden_size", where),
                        **geo)


__all__ = ["Eagle3Config", "parse_config", "default_layer_ids", "ORIGINAL_ARCHITECTURES",
           "SPECULATORS_ARCHITECTURES", "LAYOUTS"]
