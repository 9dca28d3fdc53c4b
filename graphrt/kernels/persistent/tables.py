"""The persistent step's device tables, built on the host from a schedule and the weights.

    woffs, units, align = build_tables(schedule, weights, kv_caches, prefetch=1, prefetch_bytes=128 << 10)

Pointers reach every per-layer tensor as one model-dtype base pointer (the first layer's qkv)
plus an int64 element offset:
- woffs [L, NF] int64 (columns W_*): each layer's weights, norms and KV pages.
- units [N, FIELDS] int64: the schedule's rows with F_W0 / F_W1 made base-relative, and the
  L2 prefetch fields F_P0 / F_PB0 / F_P1 / F_PB1 of row u set to the weight tile of the unit
  `prefetch` places later in the same program (bytes capped at prefetch_bytes, multiples of 16;
  none when that unit has no weights, or with prefetch 0).
- align: the element count of 16 bytes when the base and every offset are multiples of it (the
  kernel then vectorises weight loads), else 1 (and no bulk prefetch: it needs 16-byte
  alignment).
"""
from __future__ import annotations

import torch

from graphrt.kernels.persistent.schedule import (F_LAYER, F_OP, F_P0, F_P1, F_PB0, F_PB1, F_W0, F_W1, F_WB,
                                                 OP_DOWN, OP_GU, OP_HEAD, OP_O, OP_QKV, Schedule)

# the device table of per-layer offsets: one row per layer, these columns
W_QKV, W_BIAS, W_O, W_GU, W_DOWN, W_IN, W_POST, W_QN, W_KN, W_KC, W_VC = range(11)
NF = 11
_OP_FIELD = {OP_QKV: W_QKV, OP_O: W_O, OP_GU: W_GU, OP_DOWN: W_DOWN}


def build_tables(s: Schedule, weights, kv_caches, *, prefetch: int, prefetch_bytes: int):
    """(woffs [L, NF] int64, units [N, FIELDS] int64, align) on the CPU (see the module
    docstring); ValueError when a tensor is not aligned to its element size."""
    base = weights.layers[0].qkv
    esize = base.element_size()

    def off(t):
        if t is None:
            return 0
        delta = t.data_ptr() - base.data_ptr()
        if delta % esize:
            raise ValueError("weights: a tensor not aligned to its element size")
        return delta // esize

    table = [[off(x) for x in (layer.qkv, layer.qkv_bias, layer.o, layer.gate_up, layer.down, layer.input_norm,
                               layer.post_attn_norm, layer.q_norm, layer.k_norm, cache.k, cache.v)]
             for layer, cache in zip(weights.layers, kv_caches)]
    head = off(weights.lm_head)
    rows = [list(u) for u in s.units]
    for u in rows:                                             # weight-relative -> base-relative
        op = u[F_OP]
        if op in _OP_FIELD:
            start = table[u[F_LAYER]][_OP_FIELD[op]]
            u[F_W0] += start
            if op == OP_GU:
                u[F_W1] += start
        elif op == OP_HEAD:
            u[F_W0] += head
    vec = 16 // esize                                          # elements in 16 bytes
    align = vec if base.data_ptr() % 16 == 0 and all(o % vec == 0 for r in table for o in r) \
        and head % vec == 0 and all(u[F_W0] % vec == 0 and u[F_W1] % vec == 0 for u in rows) else 1
    if prefetch and align > 1:
        cap = max(0, prefetch_bytes) // 16 * 16
        for p in range(s.programs):
            lst = rows[s.starts[p]:s.starts[p + 1]]
            for i, u in enumerate(lst):
                if i + prefetch >= len(lst):
                    break
                later = lst[i + prefetch]
                nbytes = min(later[F_WB], cap) // 16 * 16
                if nbytes > 0:
                    u[F_P0], u[F_PB0] = later[F_W0], nbytes
                    if later[F_OP] == OP_GU:
                        u[F_P1], u[F_PB1] = later[F_W1], nbytes
    woffs = torch.tensor(table, dtype=torch.int64)
    units = torch.tensor(rows, dtype=torch.int64)
    return woffs, units, align


__all__ = ["build_tables", "NF", "W_QKV", "W_BIAS", "W_O", "W_GU", "W_DOWN", "W_IN", "W_POST", "W_QN", "W_KN",
           "W_KC", "W_VC"]
