"""Reading the persistent step's timeline (graphrt/kernels/persistent/timeline.py) on the CPU:
the attention split rule against the kernel's (every cached key read once over the splits),
each unit's streamed bytes, and a synthetic timeline summarised per unit kind (sums, rates,
span, busy share, the timer's resolution), per layer; a timeline of the wrong size refused."""
from __future__ import annotations

import pytest
import torch

from graphrt.kernels.persistent.schedule import F_OP, OP_ATT, OP_GU, OP_NAMES, Geometry, Tiles, build_schedule
from graphrt.kernels.persistent.timeline import layers_table, split_range, summarize, unit_bytes

TINY = Geometry(layers=2, hidden=128, inter=200, heads=4, kv_heads=2, head_dim=32, vocab=160)


@pytest.mark.parametrize("seq", [0, 1, 2, 17, 64, 65, 1000])
@pytest.mark.parametrize("splits", [1, 2, 3, 8])
def test_splits_cover_every_cached_key_once(seq, splits):
    ranges = [split_range(seq, sp, splits, 16, 32) for sp in range(splits)]
    covered = [k for lo, hi in ranges for k in range(lo, hi)]
    assert sorted(covered) == list(range(max(seq - 1, 0)))


def test_unit_bytes():
    s = build_schedule(TINY, 2, 3, tiles=Tiles(splits=2, min_keys=16, block_kv=16))
    nbytes = unit_bytes(s, [40, 0], kv_bytes=2)
    weights = sum(b for u, b in zip(s.units, nbytes) if u[F_OP] != OP_ATT)
    g = TINY
    per_layer = (g.qkv_rows * g.hidden + g.hidden * g.heads * g.head_dim + 2 * g.inter * g.hidden
                 + g.hidden * g.inter) * 2
    assert weights == g.layers * per_layer + g.vocab * g.hidden * 2
    kv = sum(b for u, b in zip(s.units, nbytes) if u[F_OP] == OP_ATT)
    assert kv == g.layers * g.kv_heads * 39 * 2 * g.head_dim * 2          # row 0: 39 cached keys; row 1 none
    assert all(b > 0 for u, b in zip(s.units, nbytes) if u[F_OP] == OP_GU)


def test_summarize_a_synthetic_timeline():
    s = build_schedule(TINY, 1, 2, tiles=Tiles(splits=1))
    n = len(s.units)
    rows = []
    for i in range(n):                      # unit i: waits i % 3 µs, works 2 µs, back to back per program
        rows.append([0, 0, 0, 0])
    for p in range(2):
        t = 1000 * p
        for i in range(s.starts[p], s.starts[p + 1]):
            w = (i % 3) * 1000
            rows[i] = [t, t + w, t + w + 2000, p]
            t += w + 2000
        rows.append([1000 * p, t, 0, p])
    tl = torch.tensor(rows, dtype=torch.int64)
    nbytes = [1000] * n
    r = summarize(s, tl, nbytes)
    assert r["total"]["units"] == n and r["total"]["bytes"] == 1000 * n
    assert r["total"]["work_us"] == pytest.approx(2 * n)
    assert r["total"]["wait_us"] == pytest.approx(sum(i % 3 for i in range(n)))
    for name, k in r["kinds"].items():
        assert name in OP_NAMES.values()
        assert k["us"] == pytest.approx(k["wait_us"] + k["work_us"])
        assert k["gb_s"] == pytest.approx(1000 * k["units"] / (k["work_us"] * 1e3))
    ends = [rows[n + p][1] for p in range(2)]
    assert r["span_us"] == pytest.approx((max(ends) - 0) / 1e3)
    assert all(b == pytest.approx(1.0) for b in r["busy_share"])
    assert r["timer_step_ns"] == 1000
    layers = layers_table(s, tl)
    assert [d["layer"] for d in layers] == [0, 1, 2] and "lm_head" in layers[-1]
    with pytest.raises(ValueError, match="timeline"):
        summarize(s, tl[:-1], nbytes)
