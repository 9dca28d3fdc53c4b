"""FP8 checkpoint formats: config.json's `quantization_config` (or `quantization="fp8"`) ->
one validated `Fp8Format` that says, per HF linear module, whether it is FP8 and where its
scale lives.

Formats read (facts from their on-disk layouts):
- compressed-tensors "float-quantized" (llm-compressor): `quant_method: "compressed-tensors"`,
  `format: "float-quantized"`, one config group targeting `Linear` with `weights: {num_bits: 8,
  type: "float", strategy: "tensor" | "channel" | "block" (+ block_structure)}`, `ignore` (module
  names, or `re:` regexes; typically `lm_head`). Tensors: `<module>.weight` F8_E4M3 [N, K] and
  `<module>.weight_scale` ([] / [1] per tensor, [N, 1] per channel, [N/bn, K/bk] per block;
  float32 or the model dtype). Activation schemes (dynamic or static `input_scale`) are accepted;
  graphrt always quantizes activations per token at run time (static input scales unused).
  `kv_cache_scheme` ({num_bits: 8, type: "float", strategy: "tensor"}, static): per-layer
  `self_attn.k_scale` / `self_attn.v_scale` ([] or [1] float) for an FP8 KV cache
  (graphrt/checkpoint/kv_scales.py reads them; they apply with kv_cache_dtype="fp8").
- transformers `quant_method: "fp8"` (the official Qwen3 FP8 releases): `fmt: "e4m3"`,
  `activation_scheme: "dynamic"`, `weight_block_size: [128, 128]` (or null: per tensor),
  `modules_to_not_convert`. Tensors: `<module>.weight` F8_E4M3 and `<module>.weight_scale_inv`
  float32 [ceil(N/bn), ceil(K/bk)] (multiplied, despite the name).
- `quantization="fp8"` on a float checkpoint: every decoder linear layer quantized per channel
  while loading (lm_head kept in the model dtype).
Anything else is refused with a ValueError naming the field.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

METHODS = ("fp8",)                        # values of LLM(..., quantization=) this module reads
ALL_METHODS = ("fp8", "int4")             # every value (int4: graphrt/checkpoint/int4_config.py)
LINEAR_FIELDS = ("qkv", "o", "gate_up", "down", "lm_head")


@dataclass(frozen=True)
class Fp8Format:
    """source: "compressed-tensors" | "fp8" (transformers) | "quantize" (float checkpoint,
    quantized per channel while loading); strategy: "tensor" | "channel" | "block";
    block: (bn, bk) for "block"; scale_suffix: the scale tensor's name after `<module>.`;
    ignore: module names / `re:` patterns kept in the model dtype; kv_scales: the checkpoint
    holds per-layer FP8 KV scales (compressed-tensors `kv_cache_scheme`)."""

    source: str
    strategy: str
    block: tuple[int, int] | None = None
    scale_suffix: str = "weight_scale"
    ignore: tuple[str, ...] = ()
    kv_scales: bool = False

    def quantized(self, module: str) -> bool:
        """Is HF module `module` (e.g. "model.layers.0.self_attn.q_proj", "lm_head") FP8?"""
        if self.source == "quantize":
            return module != "lm_head"
        for pat in self.ignore:
            if pat.startswith("re:"):
                if re.fullmatch(pat[3:], module) or re.fullmatch(pat[3:], module.removeprefix("model.")):
                    return False
            elif pat in (module, module.removeprefix("model.")):
                return False
        return True


def _need(cond: bool, field: str, got, want: str) -> None:
    if not cond:
        raise ValueError(f"quantization_config.{field}: {got!r} is not supported; graphrt reads {want}")


def _compressed_tensors(q: dict) -> Fp8Format:
    _need(q.get("format") in ("float-quantized", "naive-quantized"), "format", q.get("format"),
          "'float-quantized' (FP8 e4m3)")
    kv = q.get("kv_cache_scheme")
    if kv is not None:
        _need(isinstance(kv, dict), "kv_cache_scheme", kv, "null or an object")
        for key, want in (("type", "float"), ("num_bits", 8), ("strategy", "tensor")):
            _need(kv.get(key) == want, f"kv_cache_scheme.{key}", kv.get(key), repr(want))
        _need(not kv.get("dynamic", False), "kv_cache_scheme.dynamic", kv.get("dynamic"),
              "false (static per-layer k_scale / v_scale)")
        _need(kv.get("symmetric", True) is True, "kv_cache_scheme.symmetric", kv.get("symmetric"), "true")
    groups = q.get("config_groups")
    _need(isinstance(groups, dict) and len(groups) == 1, "config_groups",
          None if not isinstance(groups, dict) else sorted(groups), "exactly one group")
    (name, g), = groups.items()
    _need(isinstance(g, dict) and g.get("targets") == ["Linear"], f"config_groups.{name}.targets",
          g.get("targets") if isinstance(g, dict) else g, "['Linear']")
    w = g.get("weights")
    f = f"config_groups.{name}.weights"
    _need(isinstance(w, dict), f, w, "an object (type, num_bits, strategy)")
    _need(w.get("type") == "float", f + ".type", w.get("type"), "'float'")
    _need(w.get("num_bits") == 8, f + ".num_bits", w.get("num_bits"), "8")
    _need(w.get("symmetric", True) is True, f + ".symmetric", w.get("symmetric"), "true")
    strategy = w.get("strategy")
    _need(strategy in ("tensor", "channel", "block"), f + ".strategy", strategy,
          "'tensor', 'channel' or 'block'")
    block = None
    if strategy == "block":
        bs = w.get("block_structure")
        _need(isinstance(bs, list) and len(bs) == 2 and all(type(b) is int and b > 0 for b in bs),
              f + ".block_structure", bs, "[rows, cols] of positive ints")
        block = tuple(bs)
    a = g.get("input_activations")
    if a is not None:
        f = f"config_groups.{name}.input_activations"
        _need(isinstance(a, dict) and a.get("type") == "float" and a.get("num_bits") == 8, f, a,
              "null or 8-bit float")
    ignore = module_list(q, "ignore")
    return Fp8Format("compressed-tensors", strategy, block, "weight_scale", ignore, kv is not None)


def module_list(q: dict, key: str) -> tuple[str, ...]:
    """A list of module names / `re:` patterns; each pattern must compile."""
    names = q.get(key) or []
    _need(isinstance(names, list) and all(isinstance(s, str) for s in names), key, names,
          "a list of module names")
    for i, pat in enumerate(names):
        if pat.startswith("re:"):
            try:
                re.compile(pat[3:])
            except re.error as e:
                raise ValueError(f"quantization_config.{key}[{i}]: {pat!r} is not a valid regular "
                                 f"expression ({e})") from None
    return tuple(names)


def _transformers_fp8(q: dict) -> Fp8Format:
    _need(q.get("fmt", "e4m3") == "e4m3", "fmt", q.get("fmt"), "'e4m3'")
    _need(q.get("activation_scheme", "dynamic") == "dynamic", "activation_scheme",
          q.get("activation_scheme"), "'dynamic'")
    bs = q.get("weight_block_size")
    if bs is not None:
        _need(isinstance(bs, list) and len(bs) == 2 and all(type(b) is int and b > 0 for b in bs),
              "weight_block_size", bs, "[rows, cols] of positive ints or null")
    skip = module_list(q, "modules_to_not_convert")
    return Fp8Format("fp8", "tensor" if bs is None else "block", None if bs is None else tuple(bs),
                     "weight_scale_inv", skip)


def parse_quantization(raw: dict, quantization: str | None = None) -> Fp8Format | None:
    """config.json dict + the user's `quantization` ("fp8" or None) -> Fp8Format, or None for
    a plain float checkpoint. Raises ValueError naming the unsupported field."""
    if quantization is not None and quantization not in METHODS:
        raise ValueError(f"quantization: {quantization!r} is not supported; expected one of "
                         f"{ALL_METHODS} or None")
    q = raw.get("quantization_config")
    if q is None:
        return Fp8Format("quantize", "channel") if quantization == "fp8" else None
    if not isinstance(q, dict):
        raise ValueError(f"quantization_config: expected an object, got {type(q).__name__}")
    method = q.get("quant_method")
    if method == "compressed-tensors":
        return _compressed_tensors(q)
    if method == "fp8":
        return _transformers_fp8(q)
    raise ValueError(f"quantization_config.quant_method: {method!r} is not supported; graphrt reads "
                     f"'compressed-tensors' (float-quantized FP8, pack-quantized int4), 'fp8', 'gptq' "
                     f"and 'awq'")


__all__ = ["ALL_METHODS", "Fp8Format", "LINEAR_FIELDS", "METHODS", "module_list", "parse_quantization"]
