"""Load an int4 weight-only checkpoint (GPTQ, AWQ, compressed-tensors W4A16), or quantize a float
one while loading, into the fused layout with `graphrt.model.quant.int4.Int4Weight` linears.

    ck = load_checkpoint(path, device="cuda")                        # config.json says GPTQ / AWQ / ...
    ck = load_checkpoint(path, device="cuda", quantization="int4")   # float checkpoint -> int4 RTN g128

Reached from `graphrt.checkpoint.loader.load_checkpoint` when `int4_config.is_int4` holds. Every
quantized HF module is read by its layout's reader (int4_gptq.py, int4_awq.py, int4_ct.py),
repacked once on the host into graphrt's layout, moved to the device, and the parts of a fused
weight (q, k, v; gate, up) concatenated by rows (each keeps its scales and zeros; act-order
parts must share one g_idx). Embeddings, norms and the LM head are read as stored (float), in
the model dtype. Headers (shapes, dtypes) of every tensor are checked before any data is read;
every problem is one CheckpointError line naming the file, the tensor or the config field.
Tensor parallelism is refused (quantization_config / quantization named): int4 weights load on
one device.
"""
from __future__ import annotations

import time
import warnings
from pathlib import Path

import torch

from graphrt.checkpoint import int4_awq, int4_ct, int4_gptq
from graphrt.checkpoint.files import (FILE_DTYPES, Checkpoint, CheckpointError, FiniteCheck, TensorFiles,
                                      eos_token_ids, expected_tensors, nest_weights, warn_unused)
from graphrt.checkpoint.int4_config import Int4Format, parse_int4
from graphrt.model.quant.int4 import cat_rows, quantize_int4
from graphrt.model.spec import LlamaSpec

READERS = {"gptq": int4_gptq, "awq": int4_awq, "compressed-tensors": int4_ct}
LINEAR_FIELDS = ("qkv", "o", "gate_up", "down")


def rtn_group(group_size: int, k: int) -> int:
    """The RTN group size for K columns: group_size if it divides K, else the largest of 64 / 32
    that does (SmolLM2's 576 columns: 64), else one group per row (-1)."""
    for g in (group_size, 64, 32):
        if 0 < g <= group_size and k % g == 0:
            return g
    return -1


def _plan(fmt: Int4Format, expected: dict) -> dict[tuple, dict]:
    """Fused key -> {"shape", "rows", "parts": [(HF name, rows, offset)], "int4": bool}."""
    plan: dict[tuple, dict] = {}
    for name, (shape, where) in expected.items():
        p = plan.setdefault(where[:-1], {"shape": shape[1:], "rows": 0, "parts": [], "flags": set()})
        p["parts"].append((name, shape[0], where[-1]))
        p["rows"] += shape[0]
        is_linear = where[-2] in LINEAR_FIELDS and name.endswith(".weight")
        p["flags"].add(is_linear and fmt.quantized(name.removesuffix(".weight")))
    for key, p in plan.items():
        if len(p["flags"]) > 1:
            raise CheckpointError(f"quantization_config: keeps only some parts of the fused "
                                  f"{'.'.join(map(str, key))} ({[n for n, _, _ in p['parts']]}) in float; "
                                  f"graphrt fuses them: quantize all of them or none")
        p["int4"] = p.pop("flags").pop()
    return plan


def _check_headers(fmt: Int4Format, plan: dict, expected: dict, rd: TensorFiles) -> tuple[torch.dtype | None, set]:
    """Every header before any data; returns (the embedding's dtype, the tensor names used)."""
    embed_dtype, used = None, set()
    reader = READERS.get(fmt.source)
    for p in plan.values():
        for name, _, _ in p["parts"]:
            shape = expected[name][0]
            if p["int4"] and reader is not None:
                module = name.removesuffix(".weight")
                reader.check(rd, module, fmt, shape[0], shape[1])
                used.update(reader.tensor_names(rd, module))
                continue
            f, got, kind = rd.header(name)
            if tuple(got) != tuple(shape):
                raise CheckpointError(f"{f}: tensor {name!r} has shape {list(got)}, config.json implies {list(shape)}")
            if kind not in FILE_DTYPES:
                raise CheckpointError(f"{f}: tensor {name!r} has dtype {kind}; supported {sorted(FILE_DTYPES)}")
            if p["int4"] and shape[1] % 8:
                raise CheckpointError(f"{f}: tensor {name!r} {list(shape)}: quantization='int4' needs K (its "
                                      f"columns) a multiple of 8")
            used.add(name)
            if name == "model.embed_tokens.weight":
                embed_dtype = FILE_DTYPES[kind]
    return embed_dtype, used


def load_int4(path: Path, raw: dict, arch: str, spec: LlamaSpec, quantization: str | None, rd: TensorFiles,
              *, device, dtype: torch.dtype | None, untie: bool, rank: int, world_size: int) -> Checkpoint:
    """See the module docstring; arguments as `load_checkpoint`'s (raw: config.json)."""
    try:
        fmt = parse_int4(raw, quantization)
    except ValueError as e:
        raise CheckpointError(f"{path / 'config.json'}: {e}") from None
    if world_size > 1:
        field = "quantization='int4'" if fmt.source == "quantize" else \
            f"quantization_config.quant_method {raw['quantization_config'].get('quant_method')!r}"
        raise CheckpointError(f"{path}: {field}: int4 weights load on one device; tensor_parallel="
                              f"{world_size} is not supported with int4 weights")
    expected = expected_tensors(spec, arch)
    plan = _plan(fmt, expected)
    embed_dtype, used = _check_headers(fmt, plan, expected, rd)
    warn_unused(path, rd.names, used, f" (num_hidden_layers={spec.num_layers})")
    dtype = dtype or embed_dtype
    device = torch.device(device)
    finite = FiniteCheck()
    reader = READERS.get(fmt.source)
    out: dict[tuple, object] = {}
    t0, nbytes, v1_seen = time.perf_counter(), 0, set()
    for key, p in plan.items():
        if not p["int4"]:
            t = torch.empty((p["rows"], *p["shape"]), dtype=dtype, device=device)
            for name, n, off in p["parts"]:
                w = rd.tensor(name)
                t[off:off + n].copy_(w)
                nbytes += w.nbytes
                finite.add(name, rd.file(name), t[off:off + n])
            out[key] = t
            continue
        parts = []
        for name, n, _ in p["parts"]:
            module = name.removesuffix(".weight")
            if reader is None:                        # quantization="int4": RTN on the device
                w = rd.tensor(name).to(device)
                nbytes += w.nbytes
                finite.add(name, rd.file(name), w)
                parts.append(quantize_int4(w, rtn_group(fmt.group_size, w.shape[1]), symmetric=fmt.symmetric))
                continue
            k = p["shape"][0]
            if fmt.source == "gptq":
                w4, v1 = int4_gptq.read(rd, module, fmt, n, k)
                v1_seen.add(v1)
            else:
                w4 = reader.read(rd, module, fmt, n, k)
            nbytes += w4.nbytes
            finite.add(f"{module} (int4 scales)", rd.file(reader.tensor_names(rd, module)[0]), w4.scale)
            parts.append(w4.to(device))
        try:
            out[key] = parts[0] if len(parts) == 1 else cat_rows(parts)
        except ValueError as e:
            raise CheckpointError(f"{path}: fused {'.'.join(map(str, key))} "
                                  f"({[n for n, _, _ in p['parts']]}): {e}") from None
    finite.raise_bad()
    if fmt.source == "gptq" and fmt.gptq_v1 and False in v1_seen:
        warnings.warn(f"graphrt: {path}: quantization_config.checkpoint_format is 'gptq' (v1: zeros stored "
                      f"minus one) but the symmetric zeros are stored as 8 (gptq_v2): read as gptq_v2",
                      stacklevel=3)
    weights, spec = nest_weights(out, path, spec, untie, world_size)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return Checkpoint(path, arch, spec, arch == "qwen3", weights, dtype, device,
                      eos_token_ids(path, raw, spec.vocab_size), int(raw.get("max_position_embeddings") or 0),
                      nbytes, time.perf_counter() - t0, rank, world_size)


__all__ = ["load_int4", "rtn_group"]
