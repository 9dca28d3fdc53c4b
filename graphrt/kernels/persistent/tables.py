"""The persistent step's device tables, built on the host from a schedule and the weights.

    t = build_tables(schedule, weights, kv_caches, fmt, prefetch=1, prefetch_bytes=128 << 10)
    t.woffs, t.units, t.align, t.qalign, t.bases

Pointers reach every per-layer tensor as a base pointer plus an int64 element offset of the
base's type. Model-dtype tensors (norms, bias, KV pages; the linear weights and LM head when
they are in the model dtype) share one base, `bases.w` (the first layer's qkv, or its input
norm when the linears are quantized); quantized linears (formats.py) have three more: their data
(`bases.q`: FP8 bytes or int4 words), scales (`bases.s`) and int4 zeros (`bases.z`):
- woffs [L, NF] int64 (columns W_*): each layer's weights, norms and KV pages; W_QKV .. W_DOWN
  are offsets from bases.q when the linears are quantized, and W_SQKV .. W_SDOWN / W_ZQKV ..
  W_ZDOWN their scales' / zeros' offsets from bases.s / bases.z (row 0; 0 for model dtype).
- units [N, FIELDS] int64: the schedule's rows with F_W0 / F_W1 made base-relative (int4:
  words, the schedule's element offsets / 8), and the L2 prefetch fields F_P0 / F_PB0 / F_P1 /
  F_PB1 of row u set to the weight tile of the unit `prefetch` places later in the same program
  (bytes capped at prefetch_bytes, multiples of 16; none when that unit has no weights, or with
  prefetch 0). The prefetch offsets are elements of bases.w for model-dtype linears, else bytes
  from bases.w (the tile may be quantized or, the LM head, in the model dtype).
- align / qalign: the element count of 16 bytes of bases.w / bases.q when the base and every
  offset from it are multiples of it (the kernel then vectorises weight loads), else 1 (and,
  align, no bulk prefetch: it needs 16-byte alignment).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from graphrt.kernels.persistent.formats import FMT_INT4, FMT_MODEL, WeightFormat, data_of
from graphrt.kernels.persistent.schedule import (F_LAYER, F_OP, F_P0, F_P1, F_PB0, F_PB1, F_W0, F_W1, F_WB,
                                                 OP_DOWN, OP_GU, OP_HEAD, OP_O, OP_QKV, Schedule)

# the device table of per-layer offsets: one row per layer, these columns
(W_QKV, W_BIAS, W_O, W_GU, W_DOWN, W_IN, W_POST, W_QN, W_KN, W_KC, W_VC,
 W_SQKV, W_SO, W_SGU, W_SDOWN, W_ZQKV, W_ZO, W_ZGU, W_ZDOWN) = range(19)
NF = 19
_OP_FIELD = {OP_QKV: W_QKV, OP_O: W_O, OP_GU: W_GU, OP_DOWN: W_DOWN}
_LINEARS = ("qkv", "o", "gate_up", "down")


@dataclass(frozen=True)
class Bases:
    """The tensors the offsets count from: w (model dtype), q (quantized data), s (scales), z
    (int4 zeros); q, s, z are w where the format has none."""
    w: torch.Tensor
    q: torch.Tensor
    s: torch.Tensor
    z: torch.Tensor


@dataclass(frozen=True)
class Tables:
    """build_tables' result (module docstring): woffs [L, NF] int64, units [N, FIELDS] int64 (CPU)."""
    woffs: torch.Tensor
    units: torch.Tensor
    align: int
    qalign: int
    bases: Bases


def _offset(base: torch.Tensor, t: torch.Tensor | None) -> int:
    """t's first element as an element offset of base's type (t None: 0); ValueError unless aligned."""
    if t is None:
        return 0
    esize = base.element_size()
    delta = t.data_ptr() - base.data_ptr()
    if delta % esize:
        raise ValueError("weights: a tensor not aligned to its element size")
    return delta // esize


def build_tables(s: Schedule, weights, kv_caches, fmt: WeightFormat = WeightFormat(FMT_MODEL, FMT_MODEL), *,
                 prefetch: int, prefetch_bytes: int) -> Tables:
    """The step's tables on the CPU (see the module docstring); ValueError when a tensor is not
    aligned to its element size."""
    quant = fmt.fmt != FMT_MODEL
    first = weights.layers[0]
    base = first.input_norm if quant else first.qkv
    qbase = data_of(first.qkv)
    sbase = first.qkv.scale if quant else base
    zbase = first.qkv.zero if fmt.has_zero else base
    esize = base.element_size()

    def off(t):
        return _offset(base, t)

    def q_off(w):                                              # a quantized weight: data, scale, zero
        return (_offset(qbase, data_of(w)), _offset(sbase, w.scale),
                _offset(zbase, w.zero) if fmt.has_zero else 0)

    table = []
    for layer, cache in zip(weights.layers, kv_caches):
        if quant:
            parts = [q_off(getattr(layer, f)) for f in _LINEARS]
            lin = [p[0] for p in parts]
            extra = [p[1] for p in parts] + [p[2] for p in parts]
        else:
            lin = [off(getattr(layer, f)) for f in _LINEARS]
            extra = [0] * 8
        row = [lin[0], off(layer.qkv_bias), lin[1], lin[2], lin[3]]
        row += [off(x) for x in (layer.input_norm, layer.post_attn_norm, layer.q_norm, layer.k_norm, cache.k, cache.v)]
        table.append(row + extra)
    head_q = fmt.head_fmt != FMT_MODEL
    head = q_off(weights.lm_head)[0] if head_q else off(weights.lm_head)
    per_word = 8 if fmt.fmt == FMT_INT4 else 1                 # int4: schedule elements -> words
    rows = [list(u) for u in s.units]
    for u in rows:                                             # weight-relative -> base-relative
        op = u[F_OP]
        if op in _OP_FIELD:
            start = table[u[F_LAYER]][_OP_FIELD[op]]
            u[F_W0] = u[F_W0] // per_word + start
            if op == OP_GU:
                u[F_W1] = u[F_W1] // per_word + start
        elif op == OP_HEAD:
            u[F_W0] = (u[F_W0] // per_word if head_q else u[F_W0]) + head
    vec = 16 // esize                                          # elements in 16 bytes
    if not quant:
        align = vec if base.data_ptr() % 16 == 0 and all(o % vec == 0 for r in table for o in r) \
            and head % vec == 0 and all(u[F_W0] % vec == 0 and u[F_W1] % vec == 0 for u in rows) else 1
        qalign = align
    else:
        qvec = 16 // qbase.element_size()
        model = [r[c] for r in table for c in (W_BIAS, W_IN, W_POST, W_QN, W_KN, W_KC, W_VC)]
        model += [] if head_q else [head] + [u[F_W0] for u in rows if u[F_OP] == OP_HEAD]
        align = vec if base.data_ptr() % 16 == 0 and all(o % vec == 0 for o in model) else 1
        qs = [r[c] for r in table for c in (W_QKV, W_O, W_GU, W_DOWN)]
        qs += [u[F_W0] for u in rows if u[F_OP] in _OP_FIELD or (head_q and u[F_OP] == OP_HEAD)]
        qs += [u[F_W1] for u in rows if u[F_OP] == OP_GU]
        qalign = qvec if qbase.data_ptr() % 16 == 0 and all(o % qvec == 0 for o in qs) else 1

    def tile_at(u, w):                                         # a unit's tile: prefetch offset (None: none)
        if not quant:
            return w
        on_q = u[F_OP] != OP_HEAD or head_q
        b = qbase if on_q else base
        nbytes = b.data_ptr() + w * b.element_size() - base.data_ptr()
        return nbytes if nbytes % 16 == 0 else None

    if prefetch and align > 1:
        cap = max(0, prefetch_bytes) // 16 * 16
        for p in range(s.programs):
            lst = rows[s.starts[p]:s.starts[p + 1]]
            for i, u in enumerate(lst):
                if i + prefetch >= len(lst):
                    break
                later = lst[i + prefetch]
                nbytes = min(later[F_WB], cap) // 16 * 16
                at0 = tile_at(later, later[F_W0])
                if nbytes > 0 and at0 is not None:
                    u[F_P0], u[F_PB0] = at0, nbytes
                    at1 = tile_at(later, later[F_W1])
                    if later[F_OP] == OP_GU and at1 is not None:
                        u[F_P1], u[F_PB1] = at1, nbytes
    woffs = torch.tensor(table, dtype=torch.int64)
    units = torch.tensor(rows, dtype=torch.int64)
    return Tables(woffs, units, align, qalign, Bases(base, qbase, sbase, zbase))


__all__ = ["Bases", "Tables", "build_tables", "NF", "W_QKV", "W_BIAS", "W_O", "W_GU", "W_DOWN", "W_IN", "W_POST",
           "W_QN", "W_KN", "W_KC", "W_VC", "W_SQKV", "W_SO", "W_SGU", "W_SDOWN", "W_ZQKV", "W_ZO", "W_ZGU", "W_ZDOWN"]
