"""The persistent step's static schedule (graphrt/kernels/persistent/schedule.py), pure Python:
every unit present once, each program's list in the global order, the counter protocol run
on the host for 1..many programs (no deadlock, every wait met exactly), waits an earlier unit
of the program met dropped and signals batched per run, one-program linearizations of a
many-program schedule, 8B / 1B geometries, and bad arguments refused."""
from __future__ import annotations

import pytest

from graphrt.kernels.persistent.schedule import (F_C, F_COUNT, F_LAYER, F_OP, F_SIGNAL, F_TARGET, F_WAIT, NO_WAIT,
                                                 OP_ATT, OP_DOWN, OP_GU, OP_HEAD, OP_O, OP_QKV, Geometry, Tiles,
                                                 build_schedule, default_splits, linearize, simulate)

TINY = Geometry(layers=2, hidden=128, inter=200, heads=4, kv_heads=2, head_dim=32, vocab=160)
B1 = Geometry(layers=16, hidden=2048, inter=8192, heads=32, kv_heads=8, head_dim=64, vocab=128256)
B8 = Geometry(layers=32, hidden=4096, inter=14336, heads=32, kv_heads=8, head_dim=128, vocab=128256)


def _count(s, op):
    return sum(1 for u in s.units if u[F_OP] == op)


@pytest.mark.parametrize("rows,programs", [(1, 1), (3, 1), (3, 2), (4, 7), (16, 132)])
def test_tiny_units_and_protocol(rows, programs):
    s = build_schedule(TINY, rows, programs, tiles=Tiles(splits=2))
    L = TINY.layers
    assert _count(s, OP_QKV) == L * s.n_qkv == L * (4 + 4) * 32 // 16
    assert _count(s, OP_ATT) == L * rows * TINY.kv_heads * 2
    assert _count(s, OP_O) == L * s.n_o and _count(s, OP_GU) == L * s.n_gu == L * 13
    assert _count(s, OP_DOWN) == L * s.n_down and _count(s, OP_HEAD) == s.n_head == 5
    assert s.starts[0] == 0 and s.starts[-1] == len(s.units) and list(s.starts) == sorted(s.starts)
    lens = [s.starts[p + 1] - s.starts[p] for p in range(programs)]
    assert max(lens) - min(lens) <= 6                      # round-robin per phase keeps them even
    ctr = simulate(s)
    c = s.counters
    for l in range(L):
        assert ctr[c.att(l)] == rows * TINY.kv_heads and ctr[c.res1(l)] == s.n_o
        assert ctr[c.mlp(l)] == s.n_gu and ctr[c.res2(l)] == s.n_down
        assert [ctr[c.qkv(l, g)] for g in range(2)] == [(2 + 2) * 32 // 16] * 2
    assert ctr[c.head] == s.n_head


def test_program_lists_keep_the_global_order():
    """Within each program, a unit never precedes one of an earlier phase (layer, op order)."""
    s = build_schedule(TINY, 2, 5, tiles=Tiles(splits=3))
    rank = {OP_QKV: 0, OP_ATT: 1, OP_O: 2, OP_GU: 3, OP_DOWN: 4, OP_HEAD: 5}
    for p in range(5):
        keys = [(u[1], rank[u[0]]) for u in s.program_units(p)]
        assert keys == sorted(keys)


def test_first_layer_waits_for_nothing():
    s = build_schedule(TINY, 1, 1)
    first = [u for u in s.units if u[F_OP] == OP_QKV and u[1] == 0]
    assert all(u[F_WAIT] == NO_WAIT and u[F_TARGET] == 0 for u in first)


@pytest.mark.parametrize("programs", [1, 3, 7])
def test_waits_dropped_and_signals_batched(programs):
    """Per program: the first unit of each phase (but layer 0's qkv) waits, the rest of the
    phase's units there do not; non-attention units signal once per run of one counter, by the
    run's length; each program's last head tile carries a distinct answer slot."""
    s = build_schedule(TINY, 2, programs, tiles=Tiles(splits=2))
    rank = {OP_QKV: 0, OP_ATT: 1, OP_O: 2, OP_GU: 3, OP_DOWN: 4, OP_HEAD: 5}
    slots = []
    for p in range(programs):
        lst = s.program_units(p)
        seen = set()
        for u in lst:
            phase = (u[F_LAYER], rank[u[F_OP]])
            first = phase not in seen and not (u[F_OP] == OP_QKV and u[F_LAYER] == 0) and u[F_OP] != OP_ATT
            if u[F_OP] != OP_ATT:
                assert (u[F_WAIT] != NO_WAIT) == first, (p, u)
            seen.add(phase)
        for u in lst:                                      # counts: every unit counted once
            assert u[F_COUNT] >= 0
        runs = {}
        for u in lst:
            if u[F_OP] != OP_ATT:
                runs[u[F_SIGNAL]] = runs.get(u[F_SIGNAL], 0) + 1
        for sig, n in runs.items():
            assert sum(u[F_COUNT] for u in lst if u[F_OP] != OP_ATT and u[F_SIGNAL] == sig) == n
        assert all(u[F_COUNT] == 1 for u in lst if u[F_OP] == OP_ATT)
        heads = [u for u in lst if u[F_OP] == OP_HEAD]
        if heads:
            assert heads[-1][F_COUNT] == len(heads) and all(u[F_COUNT] == 0 for u in heads[:-1])
            slots.append(heads[-1][F_C])
    assert sorted(slots) == list(range(s.head_programs)) and s.head_programs == min(programs, s.n_head)
    simulate(s)


@pytest.mark.parametrize("policy", ["eager", "random"])
def test_linearize_keeps_the_protocol(policy):
    s = build_schedule(TINY, 2, 5, tiles=Tiles(splits=3))
    one = linearize(s, policy, seed=4)
    assert one.programs == 1 and one.starts == (0, len(s.units)) and sorted(one.units) == sorted(s.units)
    assert simulate(one) == simulate(s)
    if policy == "eager":                                  # later phases run as early as they may
        assert one.units != s.units
    with pytest.raises(ValueError, match="policy"):
        linearize(s, "lifo")


@pytest.mark.parametrize("g", [B1, B8], ids=["1b", "8b"])
@pytest.mark.parametrize("rows", [1, 16])
def test_real_geometries(g, rows):
    s = build_schedule(g, rows, 132, max_context_len=4096)
    assert s.splits == default_splits(g, rows, 132, 4096, Tiles().min_keys)
    assert s.n_head == -(-g.vocab // 32) and s.n_qkv == g.qkv_rows // 16
    assert s.counters.count < 2 ** 16
    simulate(s)


def test_bad_arguments():
    with pytest.raises(ValueError, match="rows"):
        build_schedule(TINY, 17, 1)
    with pytest.raises(ValueError, match="rows"):
        build_schedule(TINY, 0, 1)
    with pytest.raises(ValueError, match="programs"):
        build_schedule(TINY, 1, 0)
    with pytest.raises(ValueError, match="qkv_bn"):
        build_schedule(TINY, 1, 1, tiles=Tiles(qkv_bn=64))          # 64 does not divide head_dim 32
    with pytest.raises(ValueError, match="head_bn"):
        build_schedule(TINY, 1, 1, tiles=Tiles(head_bn=24))
    with pytest.raises(ValueError, match="block_k"):
        build_schedule(TINY, 1, 1, tiles=Tiles(block_k=16))           # head_bn 32 rows
    with pytest.raises(ValueError, match="splits"):
        build_schedule(TINY, 1, 1, tiles=Tiles(splits=65))
    with pytest.raises(ValueError, match="min_keys"):
        build_schedule(TINY, 1, 1, tiles=Tiles(min_keys=100))
    with pytest.raises(ValueError, match="head_dim"):
        Geometry(layers=1, hidden=8, inter=8, heads=2, kv_heads=1, head_dim=48, vocab=8)
    with pytest.raises(ValueError, match="kv_heads"):
        Geometry(layers=1, hidden=8, inter=8, heads=3, kv_heads=2, head_dim=32, vocab=8)
    with pytest.raises(ValueError, match="layers"):
        Geometry(layers=0, hidden=8, inter=8, heads=2, kv_heads=1, head_dim=32, vocab=8)


def test_simulate_finds_a_deadlock():
    s = build_schedule(TINY, 1, 2, tiles=Tiles(splits=1))
    # swap two programs' first units across a dependency: a QKV of layer 1 first in program 0
    units = list(s.units)
    first_l1 = next(i for i, u in enumerate(units) if u[F_OP] == OP_QKV and u[1] == 1)
    units.insert(0, units.pop(first_l1))
    # keep program 0's boundaries: the moved unit now precedes layer 0's units it depends on
    broken = type(s)(**{**s.__dict__, "units": tuple(units)})
    with pytest.raises(RuntimeError, match="deadlock|counter"):
        simulate(broken)
