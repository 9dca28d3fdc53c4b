"""int4 weight-only checkpoint formats: config.json's `quantization_config` (or
`quantization="int4"`) -> one validated `Int4Format`.

Read (bits 4 only; group sizes 32 / 64 / 128 or -1 = per channel; symmetric or asymmetric):
- GPTQ (`quant_method: "gptq"`, AutoGPTQ / GPTQModel): `bits`, `group_size`, `sym`,
  `desc_act` (act-order, `g_idx`), `checkpoint_format` "gptq" (v1: zeros stored minus one) or
  "gptq_v2" (true zeros); `lm_head` must be false. Reader: int4_gptq.py.
- AWQ (`quant_method: "awq"`, AutoAWQ): `bits` or `w_bit`, `group_size` or `q_group_size`,
  `zero_point`, `version` "gemm" (others refused), `modules_to_not_convert`. Reader: int4_awq.py.
- compressed-tensors (`quant_method: "compressed-tensors"`, `format: "pack-quantized"`,
  llm-compressor's W4A16): one config group targeting `Linear` with `weights: {num_bits: 4,
  type: "int", symmetric, strategy: "group" | "channel", group_size, actorder: null | "group" |
  "weight", dynamic: false}`, `input_activations: null`, `ignore`. Reader: int4_ct.py.
- `quantization="int4"` on a float checkpoint: round-to-nearest, group 128 (64 or 32 where 128
  does not divide a layer's K, else per channel), asymmetric, every decoder linear layer (the LM
  head and embeddings stay in the model dtype).
Anything else: ValueError naming the field (the loader adds the file: one CheckpointError line).
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from graphrt.model.quant.formats import module_list

METHOD = "int4"                              # LLM(..., quantization="int4")
RTN_GROUP = 128
GROUPS = (32, 64, 128, -1)


@dataclass(frozen=True)
class Int4Format:
    """source: "gptq" | "awq" | "compressed-tensors" | "quantize"; group_size: 32 / 64 / 128 or
    -1 (per channel); symmetric: codes centred on 8 (no stored zeros needed); act_order: GPTQ
    desc_act / compressed-tensors actorder (g_idx tensors may permute the groups); gptq_v1: the
    stored zeros are one below the true ones (GPTQ "gptq"; the reader checks symmetric files'
    zeros and corrects a mislabel); ignore: module names / `re:` patterns kept in float."""

    source: str
    group_size: int
    symmetric: bool
    act_order: bool = False
    gptq_v1: bool = False
    ignore: tuple[str, ...] = ()

    def quantized(self, module: str) -> bool:
        """Is HF module `module` (e.g. "model.layers.0.mlp.down_proj", "lm_head") int4?"""
        if module == "lm_head" or module.endswith("embed_tokens"):
            return False                     # as stored: float in every format read here
        for pat in self.ignore:
            short = module.removeprefix("model.")
            if pat.startswith("re:"):
                if re.fullmatch(pat[3:], module) or re.fullmatch(pat[3:], short):
                    return False
            elif pat in (module, short) or module.endswith("." + pat) or ("." + pat + ".") in ("." + short + "."):
                return False
        return True


def _need(cond: bool, field: str, got, want: str) -> None:
    if not cond:
        raise ValueError(f"quantization_config.{field}: {got!r} is not supported; graphrt reads {want}")


def _group(field: str, g) -> int:
    _need(type(g) is int and g in GROUPS, field, g, "32, 64, 128 or -1 (per channel)")
    return g


def _gptq(q: dict) -> Int4Format:
    _need(q.get("bits") == 4, "bits", q.get("bits"), "4")
    g = _group("group_size", q.get("group_size"))
    fmt = q.get("checkpoint_format", "gptq")
    _need(fmt in ("gptq", "gptq_v2"), "checkpoint_format", fmt, "'gptq' or 'gptq_v2'")
    _need(q.get("lm_head", False) is False, "lm_head", q.get("lm_head"), "false (a float LM head)")
    sym = q.get("sym", True)
    _need(isinstance(sym, bool), "sym", sym, "true or false")
    desc = q.get("desc_act", False)
    _need(isinstance(desc, bool), "desc_act", desc, "true or false")
    return Int4Format("gptq", g, sym, desc, fmt == "gptq", module_list(q, "modules_to_not_convert"))


def _awq(q: dict) -> Int4Format:
    bits = q.get("bits", q.get("w_bit"))
    _need(bits == 4, "bits" if "bits" in q else "w_bit", bits, "4")
    g = _group("group_size" if "group_size" in q else "q_group_size", q.get("group_size", q.get("q_group_size")))
    version = str(q.get("version", "gemm")).lower()
    _need(version == "gemm", "version", q.get("version"), "'gemm' (AutoAWQ's GEMM packing)")
    zp = q.get("zero_point", True)
    _need(isinstance(zp, bool), "zero_point", zp, "true or false")
    return Int4Format("awq", g, not zp, False, False, module_list(q, "modules_to_not_convert"))


def _compressed_tensors(q: dict) -> Int4Format:
    _need(q.get("format") == "pack-quantized", "format", q.get("format"), "'pack-quantized' (int4 W4A16)")
    groups = q.get("config_groups")
    _need(isinstance(groups, dict) and len(groups) == 1, "config_groups",
          None if not isinstance(groups, dict) else sorted(groups), "exactly one group")
    (name, grp), = groups.items()
    _need(isinstance(grp, dict) and grp.get("targets") == ["Linear"], f"config_groups.{name}.targets",
          grp.get("targets") if isinstance(grp, dict) else grp, "['Linear']")
    f = f"config_groups.{name}.weights"
    w = grp.get("weights")
    _need(isinstance(w, dict), f, w, "an object (num_bits, type, strategy, group_size)")
    _need(w.get("num_bits") == 4, f + ".num_bits", w.get("num_bits"), "4")
    _need(w.get("type", "int") == "int", f + ".type", w.get("type"), "'int'")
    _need(not w.get("dynamic", False), f + ".dynamic", w.get("dynamic"), "false")
    sym = w.get("symmetric", True)
    _need(isinstance(sym, bool), f + ".symmetric", sym, "true or false")
    strategy = w.get("strategy")
    _need(strategy in ("group", "channel"), f + ".strategy", strategy, "'group' or 'channel'")
    g = -1 if strategy == "channel" else _group(f + ".group_size", w.get("group_size"))
    _need(g != -1 or strategy == "channel", f + ".group_size", w.get("group_size"), "32, 64 or 128")
    actorder = w.get("actorder")
    _need(actorder in (None, "group", "weight", "static", False), f + ".actorder", actorder,
          "null, 'group', 'weight' or 'static'")
    a = grp.get("input_activations")
    _need(a is None, f"config_groups.{name}.input_activations", a, "null (weight-only W4A16)")
    return Int4Format("compressed-tensors", g, sym, actorder in ("group",), False, module_list(q, "ignore"))


def is_int4(raw: dict, quantization: str | None) -> bool:
    """Does this load go through the int4 loader (a config.json dict + LLM's `quantization`)?"""
    if quantization == METHOD:
        return True
    q = raw.get("quantization_config")
    if not isinstance(q, dict):
        return False
    m = q.get("quant_method")
    return m in ("gptq", "awq") or (m == "compressed-tensors" and q.get("format") == "pack-quantized")


def parse_int4(raw: dict, quantization: str | None = None) -> Int4Format:
    """config.json dict + `quantization` ("int4" or None) -> Int4Format (is_int4 must hold).
    Raises ValueError naming the unsupported field."""
    q = raw.get("quantization_config")
    if quantization == METHOD:
        if q is not None:
            method = q.get("quant_method") if isinstance(q, dict) else q
            raise ValueError(f"quantization: 'int4' quantizes a float checkpoint, but config.json has a "
                             f"quantization_config (quant_method {method!r}); load it with quantization=None")
        return Int4Format("quantize", RTN_GROUP, False)
    method = q.get("quant_method")
    if quantization is not None:
        raise ValueError(f"quantization: {quantization!r} quantizes a float checkpoint, but config.json has a "
                         f"quantization_config (quant_method {method!r}, int4); load it with quantization=None")
    if method == "gptq":
        return _gptq(q)
    if method == "awq":
        return _awq(q)
    return _compressed_tensors(q)


__all__ = ["GROUPS", "Int4Format", "METHOD", "RTN_GROUP", "is_int4", "parse_int4"]
