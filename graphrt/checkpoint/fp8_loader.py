"""Load an FP8 checkpoint (or quantize a float one while loading) into the fused layout.

    ck = load_checkpoint(path, device="cuda")                       # config.json says FP8
    ck = load_checkpoint(path, device="cuda", quantization="fp8")   # float checkpoint -> FP8

Reached from `graphrt.checkpoint.loader.load_checkpoint` when config.json has a
`quantization_config` or `quantization` is given; the formats are parsed by
`graphrt.model.quant.formats`. The result is the loader's `Checkpoint` with the same fused
weights dict, except that each linear field (qkv / o / gate_up / down, lm_head unless ignored)
is a `graphrt.model.quant.Fp8Weight`: fused FP8 data [rows, K] plus float32 scales with every HF
part's scale kept (per-tensor scales repeated per row; block scales concatenated by block rows).
Each HF tensor is read once and copied into its rows on the device; per-tensor / per-channel
scales arrive as [] / [1] / [N] / [N, 1] in float32 or the model dtype.

Tensor parallelism (world_size > 1): each rank reads only its block of every FP8 weight (the
float loader's slices: rows of qkv / gate_up / lm_head, columns of o / down) and its part of the
scales (`graphrt.model.quant.shard`: per-tensor replicated, per-channel sliced with the rows or
whole for a column slice, block scales sliced by block; a shard that cuts a block is refused).
`quantization="fp8"` quantizes the rows a rank reads; a column-sliced weight (o, down) is
quantized whole, then sliced, so every rank's channel scales are the single-process ones.
"""
from __future__ import annotations

import time
from pathlib import Path

import torch

from graphrt.checkpoint.kv_scales import kv_scale_names, read_kv_scales
from graphrt.checkpoint.files import (F8_KIND, FILE_DTYPES, Checkpoint, CheckpointError, FiniteCheck,
                                             TensorFiles, check_scale, eos_token_ids, expected_tensors,
                                             nest_weights, warn_unused)
from graphrt.model.quant.fp8 import FP8, Fp8Weight, quantize_fp8
from graphrt.model.quant.formats import LINEAR_FIELDS, Fp8Format, parse_quantization
from graphrt.model.quant.shard import check_block_cut, shard_scale
from graphrt.model.spec import LlamaSpec, owned_slice, shard_spec, vocab_rows

VOCAB_TENSORS = ("model.embed_tokens.weight", "lm_head.weight")   # rows padded under tensor parallel


def _key(where: tuple) -> tuple:
    """(layer, field, offset) / (field, offset) -> the fused tensor's key (layer, field) / (field,)."""
    return where[:-1]


def _plan(fmt: Fp8Format, expected: dict) -> dict[tuple, dict]:
    """Fused key -> {"rows", "cols", "parts": [(name, rows, off)], "fp8": bool}."""
    plan: dict[tuple, dict] = {}
    for name, (shape, where) in expected.items():
        p = plan.setdefault(_key(where), {"shape": shape[1:], "rows": 0, "parts": [], "flags": set()})
        p["parts"].append((name, shape[0], where[-1]))
        p["rows"] += shape[0]
        if where[-2] in LINEAR_FIELDS and name.endswith(".weight"):
            p["flags"].add(fmt.quantized(name.removesuffix(".weight")))
        else:
            p["flags"].add(False)
    for key, p in plan.items():
        if len(p["flags"]) > 1:
            raise ValueError(f"quantization_config.ignore: keeps only some parts of the fused "
                             f"{'.'.join(map(str, key))} ({[n for n, _, _ in p['parts']]}) in float; "
                             f"ignore all of them or none")
        p["fp8"] = p["flags"].pop()
        if p["fp8"] and fmt.block is not None:
            for name, rows, off in p["parts"][:-1]:
                if rows % fmt.block[0]:
                    raise CheckpointError(f"tensor {name!r}: {rows} rows is not a multiple of the scale block "
                                          f"rows {fmt.block[0]}; block scales of fused parts must align")
    return plan


def _scale_shape(fmt: Fp8Format, rows: int, cols: int) -> tuple[tuple[int, ...], ...]:
    """Accepted on-disk shapes of one module's weight scale."""
    if fmt.strategy == "tensor":
        return ((), (1,))
    if fmt.strategy == "channel":
        return ((rows,), (rows, 1))
    bn, bk = fmt.block
    return ((-(-rows // bn), -(-cols // bk)),)


def _scale_name(fmt: Fp8Format, weight: str) -> str:
    return weight.removesuffix("weight") + fmt.scale_suffix


def _check_headers(fmt: Fp8Format, plan: dict, expected: dict, rd: TensorFiles, cuts: dict) -> torch.dtype | None:
    embed_dtype = None
    for p in plan.values():
        for name, _, _ in p["parts"]:
            f, shape, kind = rd.header(name)
            if shape != expected[name][0]:
                raise CheckpointError(f"{f}: tensor {name!r} has shape {list(shape)}, "
                                      f"config.json implies {list(expected[name][0])}")
            stored_fp8 = p["fp8"] and fmt.source != "quantize"
            if stored_fp8 and kind != F8_KIND:
                raise CheckpointError(f"{f}: tensor {name!r} has dtype {kind}; the "
                                      f"quantization_config makes it {F8_KIND}")
            if not stored_fp8 and kind not in FILE_DTYPES:
                raise CheckpointError(f"{f}: tensor {name!r} has dtype {kind}; supported "
                                      f"{sorted(FILE_DTYPES)}" + (" (listed in quantization_config."
                                      "ignore)" if kind == F8_KIND else ""))
            if stored_fp8:
                sname = _scale_name(fmt, name)
                sf, sshape, skind = rd.header(sname)
                ok = _scale_shape(fmt, shape[0], shape[1])
                if sshape not in ok or skind not in FILE_DTYPES:
                    raise CheckpointError(f"{sf}: tensor {sname!r} is {skind} {list(sshape)}; a "
                                          f"{fmt.strategy} scale of {name!r} {list(shape)} is float of "
                                          f"shape {' or '.join(str(list(o)) for o in ok)}")
                if fmt.strategy == "block":
                    try:
                        check_block_cut(name, fmt.block, shape, cuts[name])
                    except ValueError as e:
                        raise CheckpointError(f"{f}: {e}") from None
            if name == "model.embed_tokens.weight":
                embed_dtype = FILE_DTYPES[kind]
    return embed_dtype


def _cut(name: str, expected: dict, placed: dict, vocab_size: int, rank: int):
    """The rank's block of tensor `name` (graphrt.model.spec.owned_slice): (dim, a, b) or None;
    a vocabulary tensor's real rows (the shard's other rows are zero padding)."""
    full, local = expected[name][0], placed[name][0]
    if name in VOCAB_TENSORS and full != local:
        return (0, *vocab_rows(vocab_size, local[0], rank))
    return owned_slice(full, local, rank)


def _read(rd: TensorFiles, name: str, cut) -> torch.Tensor:
    """The host tensor, or only its rows / columns [a, b) (cut = (dim, a, b))."""
    if cut is None:
        return rd.tensor(name)
    dim, a, b = cut
    return rd.tensor(name, **{"rows" if dim == 0 else "cols": (a, b)})


def load_quantized(path: Path, raw: dict, arch: str, spec: LlamaSpec, quantization: str | None,
                   rd: TensorFiles, *, device, dtype: torch.dtype | None, untie: bool, rank: int,
                   world_size: int) -> Checkpoint:
    """See the module docstring; arguments as `load_checkpoint`'s (raw: config.json; rd: the
    checkpoint's tensor files; untie: spec was untied for an lm_head.weight present with
    tie_word_embeddings, see files.retie_or_warn)."""
    try:
        fmt = parse_quantization(raw, quantization)
    except ValueError as e:                          # the field is named; add the file
        raise CheckpointError(f"{path / 'config.json'}: {e}") from None
    if fmt is None:
        raise ValueError("quantization_config: null and quantization=None: not a quantized load")
    expected = expected_tensors(spec, arch)             # on disk: the whole model's shapes
    local = spec if world_size == 1 else shard_spec(spec, world_size)
    placed = expected if world_size == 1 else expected_tensors(local, arch)   # this rank's layout
    cuts = {name: _cut(name, expected, placed, spec.vocab_size, rank) for name in expected}
    plan = _plan(fmt, placed)
    embed_dtype = _check_headers(fmt, plan, expected, rd, cuts)
    used = set(expected) | {_scale_name(fmt, n) for p in plan.values() if p["fp8"] and fmt.source != "quantize"
                            for n, _, _ in p["parts"]}
    used |= {n for n in rd.names if n.endswith(".input_scale")}   # static activation scales: unused
    kv_names = kv_scale_names(rd, spec.num_layers) if fmt.kv_scales else []
    used |= {n for pair in kv_names for n in pair}
    warn_unused(path, rd.names, used, f" (num_hidden_layers={spec.num_layers})")
    dtype = dtype or embed_dtype
    device = torch.device(device)
    finite = FiniteCheck()
    out: dict[tuple, object] = {}
    t0, nbytes = time.perf_counter(), 0
    for key, p in plan.items():
        rows, cols = p["rows"], p["shape"][0] if p["shape"] else None
        if not p["fp8"]:
            t = torch.zeros((rows, *p["shape"]), dtype=dtype, device=device)   # zero: vocab padding
            for name, n, off in p["parts"]:
                w = _read(rd, name, cuts[name])
                t[off:off + w.shape[0]].copy_(w)
                nbytes += w.nbytes
                finite.add(name, rd.file(name), t[off:off + w.shape[0]])
            out[key] = t
            continue
        data = torch.zeros((rows, cols), dtype=FP8, device=device)   # zero: vocab padding rows
        parts = []
        for name, n, off in p["parts"]:
            cut, full = cuts[name], expected[name][0]
            if fmt.source == "quantize":                 # float checkpoint: per channel on the device
                whole = cut is not None and cut[0] == 1  # a column slice: the whole rows' scales
                w = _read(rd, name, None if whole else cut).to(device)
                nbytes += w.nbytes
                finite.add(name, rd.file(name), w)
                q = quantize_fp8(w, "channel")
                q_data = q.data[:, cut[1]:cut[2]] if whole else q.data
                data[off:off + q_data.shape[0]].copy_(q_data)
                parts.append(shard_scale(q.scale, "channel", tuple(q.data.shape), None, n))   # read rows' scales
                continue
            w = _read(rd, name, cut)
            data[off:off + w.shape[0]].copy_(w)
            nbytes += w.nbytes
            finite.add(name, rd.file(name), data[off:off + w.shape[0]])
            sname = _scale_name(fmt, name)
            s = rd.tensor(sname).float()                 # a few values, on the host
            check_scale(sname, rd.file(sname), s)
            nbytes += s.nbytes
            parts.append(shard_scale(s, fmt.strategy, full, cut, n, block=fmt.block, name=name))
        scale = torch.cat(parts).to(device).contiguous()
        out[key] = Fp8Weight(data, scale, fmt.block if fmt.strategy == "block" else None)
    finite.raise_bad()                                   # one host sync for the whole checkpoint
    kv_scales = read_kv_scales(rd, spec.num_layers) if fmt.kv_scales else None
    weights, spec = nest_weights(out, path, spec, untie, world_size)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return Checkpoint(path, arch, spec, arch == "qwen3", weights, dtype, device,
                      eos_token_ids(path, raw, spec.vocab_size), int(raw.get("max_position_embeddings") or 0),
                      nbytes, time.perf_counter() - t0, rank, world_size, kv_scales=kv_scales)


__all__ = ["load_quantized"]
