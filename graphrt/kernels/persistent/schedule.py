"""The static schedule of the persistent decode step: work units, dependency counters, programs.

Built once on the host per (model geometry, bucket, program count), pure Python (no GPU):

    g = Geometry(layers=16, hidden=2048, inter=8192, heads=32, kv_heads=8, head_dim=64, vocab=128256)
    s = build_schedule(g, rows=4, programs=132, tiles=Tiles())
    s.units   # [N, FIELDS] int64 rows, grouped by program, each group in topological order
    s.starts  # [P + 1] int64: program p runs units starts[p] .. starts[p + 1] - 1

Units of one decoder layer l, in this order (the kernel's ops, kernels/persistent/units.py):

    QKV   a tile of qkv_bn rows of the fused qkv weight (never across a head): RMSNorm of the
          residual stream in its prologue (layer 0: of the embedding rows), the product (+ bias)
          into the qkv scratch. Waits RES2[l - 1] (all down tiles of the layer before; layer 0:
          nothing); signals QKV[l][g], g the KV group whose heads the tile's rows belong to.
    ATT   (row b, kv head g, split s): RoPE of the group's q heads and of the new k, the split's
          keys of the paged cache (split 0 also takes the new key and writes k / v into the
          cache), a partial; the last of the S splits to arrive merges them into the attention
          scratch. Waits QKV[l][g] == qkv tiles of the group; the merging unit signals ATT[l].
    O     a tile of o_bn rows of o: residual[:, tile] += round(product) in place (layer 0: the
          embedding rows + product), and each row's partial sum of squares of the new tile.
          Waits ATT[l] == rows * kv_heads; signals RES1[l].
    GU    gate rows [n, n + gu_bn) and up rows [I + n, ...) (one GEMV of 2 gu_bn rows, gate and
          up interleaved): RMSNorm prologue (the sums of squares from the O tiles), silu(gate) *
          up into the MLP scratch. Waits RES1[l]; signals MLP[l].
    DOWN  a tile of down_bn rows of down: the residual add and sums of squares as O. Waits
          MLP[l]; signals RES2[l].

then HEAD tiles of head_bn vocabulary rows: the final RMSNorm prologue, logits (model dtype) and
each row's argmax over the program's tiles; each program's last tile stores it and arrives, and
the last to arrive reduces the programs' answers into the greedy tokens. HEAD waits RES2[L - 1].

Every wait is on units earlier in the global order, and each program's list keeps that order,
so with all programs resident the step cannot deadlock (the earliest unfinished unit always has
its inputs); with one program the list is the global order and no wait ever spins. Units of a
phase are dealt round-robin over the programs, continuing where the phase before stopped.
Within a program, a wait an earlier unit already met is dropped, and a run of units signalling
the same counter signals once, by the run's length (F_COUNT); a later phase never waits on a
counter of its own phase, so the batching cannot deadlock. `simulate` runs the protocol on the
host; `linearize` turns a many-program schedule into one program's list in an order a GPU could
interleave it (tests run the kernel with it: the counters are sufficient, not just live).

The split count S (the KV splits of each row's kv head) follows the program count by default
(`default_splits`): schedules for different grids then reduce attention in different orders,
and their logits differ in the last bits; with the same S every grid computes each value with
the same operations in the same order (the GPU tests compare grids at a fixed S bit for bit).

Counters (int32, global memory, all zero between launches: the last program to finish zeroes
them): per layer QKV[l][0..Hkv), ATT[l], RES1[l], MLP[l], RES2[l]; then the split arrivals
ARR[b * Hkv + g], the LM-head tiles' arrival (each program adds its head tiles once, after
its last), and DONE (programs finished).
"""
from __future__ import annotations

from dataclasses import dataclass


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


OP_QKV, OP_ATT, OP_O, OP_GU, OP_DOWN, OP_HEAD = 1, 2, 3, 4, 5, 6
OP_NAMES = {OP_QKV: "qkv", OP_ATT: "attention", OP_O: "o", OP_GU: "gate_up", OP_DOWN: "down", OP_HEAD: "lm_head"}
# one unit row (int64; FIELDS = 16: 128 bytes): what the kernel reads per unit
(F_OP, F_LAYER, F_A, F_B, F_C, F_WAIT, F_TARGET, F_SIGNAL, F_COUNT, F_W0, F_W1, F_WB,
 F_P0, F_PB0, F_P1, F_PB1) = range(16)
FIELDS = 16
NO_WAIT = -1        # F_WAIT of a unit that waits for nothing (F_TARGET 0)
MAX_ROWS = 16       # decode rows of one step (the GEMV tile's M)
MAX_STAGES = 16     # GEMV weight chunks in flight in a shared-memory ring (the launch's `stages`) at most


@dataclass(frozen=True)
class Geometry:
    """The decoder's shapes (one rank): layers L, hidden H, intermediate I, q heads Hq, kv heads
    Hkv, head_dim D, vocabulary V."""
    layers: int
    hidden: int
    inter: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int

    def __post_init__(self):
        for name in ("layers", "hidden", "inter", "heads", "kv_heads", "head_dim", "vocab"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name}: expected an int >= 1, got {v!r}")
        if self.heads % self.kv_heads:
            raise ValueError(f"heads: {self.heads} is not a multiple of kv_heads={self.kv_heads}")
        if self.head_dim < 32 or self.head_dim & (self.head_dim - 1):
            raise ValueError(f"head_dim: expected a power of 2 >= 32, got {self.head_dim}")

    @property
    def group(self) -> int:
        return self.heads // self.kv_heads

    @property
    def qkv_rows(self) -> int:
        return (self.heads + 2 * self.kv_heads) * self.head_dim


@dataclass(frozen=True)
class Tiles:
    """Output rows per GEMV unit of each weight (powers of 2, >= 16; qkv_bn divides head_dim),
    block_k: the K columns of one weight chunk of a 16-row tile (a tile of n rows loads block_k *
    16 / n columns: the same registers; a gate_up tile is 2 gu_bn rows, gate and up interleaved;
    block_k >= every tile's rows); splits: KV splits per (row, kv head) (0: chosen
    by `build_schedule` to give about one attention unit per program); block_kv: keys per
    attention block; min_keys: keys per split at least (a multiple of block_kv)."""
    qkv_bn: int = 16
    o_bn: int = 16
    gu_bn: int = 16
    down_bn: int = 16
    head_bn: int = 32
    block_k: int = 256
    splits: int = 0
    block_kv: int = 64
    min_keys: int = 256

    def check(self, g: Geometry) -> None:
        for name in ("qkv_bn", "o_bn", "gu_bn", "down_bn", "head_bn", "block_k", "block_kv"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 16 or v & (v - 1):
                raise ValueError(f"tiles.{name}: expected a power of 2 >= 16, got {v!r}")
        widest = max(self.qkv_bn, self.o_bn, 2 * self.gu_bn, self.down_bn, self.head_bn)
        if self.block_k < widest:
            raise ValueError(f"tiles.block_k: {self.block_k} below the widest tile's {widest} rows")
        if g.head_dim % self.qkv_bn:
            raise ValueError(f"tiles.qkv_bn: {self.qkv_bn} must divide head_dim={g.head_dim} (a tile "
                             f"never spans two heads)")
        if isinstance(self.splits, bool) or not isinstance(self.splits, int) or not 0 <= self.splits <= 64:
            raise ValueError(f"tiles.splits: expected an int in [0, 64], got {self.splits!r}")
        if self.min_keys < self.block_kv or self.min_keys % self.block_kv:
            raise ValueError(f"tiles.min_keys: expected a multiple of block_kv={self.block_kv}, got "
                             f"{self.min_keys}")


@dataclass(frozen=True)
class Counters:
    """Indices of the counters in the int32 counter buffer (see the module docstring)."""
    layers: int
    kv_heads: int
    rows: int

    def qkv(self, l: int, g: int) -> int:
        return l * (self.kv_heads + 4) + g

    def att(self, l: int) -> int:
        return l * (self.kv_heads + 4) + self.kv_heads

    def res1(self, l: int) -> int:
        return self.att(l) + 1

    def mlp(self, l: int) -> int:
        return self.att(l) + 2

    def res2(self, l: int) -> int:
        return self.att(l) + 3

    @property
    def arrivals(self) -> int:                   # first of rows * kv_heads split-arrival counters
        return self.layers * (self.kv_heads + 4)

    @property
    def head(self) -> int:
        return self.arrivals + self.rows * self.kv_heads

    @property
    def done(self) -> int:
        return self.head + 1

    @property
    def count(self) -> int:
        return self.done + 1


@dataclass(frozen=True)
class Schedule:
    """units: FIELDS-int rows (tuples), grouped by program; starts: P + 1 offsets; counters: the
    layout; splits: S of the attention units; tile counts of each GEMV (n_qkv, n_o, n_gu,
    n_down, n_head); head_programs: the programs holding LM-head tiles (each one's last head
    tile carries its answer slot 0 .. head_programs - 1 in F_C)."""
    geometry: Geometry
    tiles: Tiles
    rows: int
    programs: int
    splits: int
    units: tuple
    starts: tuple
    counters: Counters
    n_qkv: int
    n_o: int
    n_gu: int
    n_down: int
    n_head: int
    head_programs: int

    def program_units(self, p: int) -> tuple:
        return self.units[self.starts[p]:self.starts[p + 1]]


def default_splits(g: Geometry, rows: int, programs: int, max_context_len: int, min_keys: int) -> int:
    """KV splits per (row, kv head): about one attention unit per program, at most one split per
    min_keys keys of the longest context, 1..64."""
    want = _cdiv(programs, rows * g.kv_heads)
    return max(1, min(want, _cdiv(max_context_len, min_keys), 64))


def _group_of_row(g: Geometry, r: int) -> int:
    d, hq, hkv = g.head_dim, g.heads, g.kv_heads
    if r < hq * d:
        return (r // d) // g.group
    if r < (hq + hkv) * d:
        return (r - hq * d) // d
    return (r - (hq + hkv) * d) // d


def build_schedule(g: Geometry, rows: int, programs: int, *, tiles: Tiles = Tiles(),
                   max_context_len: int = 4096, elem_bytes: float = 2,
                   head_elem_bytes: float | None = None) -> Schedule:
    """The step's units for `rows` decode rows (1..16) over `programs` programs (>= 1).
    elem_bytes: bytes per weight element of the layers' linears (F_WB, the L2 prefetch: 2 bf16,
    1 FP8, 0.5 int4; scales are not counted), head_elem_bytes: the LM head's (None: elem_bytes);
    max_context_len: bounds the default split
    count. F_W0 / F_W1 hold the unit's weight tile as an element offset within its weight (the
    launcher adds the weight's own offset and fills the prefetch fields F_P*, step.py)."""
    if isinstance(rows, bool) or not isinstance(rows, int) or not 1 <= rows <= MAX_ROWS:
        raise ValueError(f"rows: expected an int in [1, {MAX_ROWS}], got {rows!r}")
    if isinstance(programs, bool) or not isinstance(programs, int) or programs < 1:
        raise ValueError(f"programs: expected an int >= 1, got {programs!r}")
    tiles.check(g)
    hb = elem_bytes if head_elem_bytes is None else head_elem_bytes
    for name, v in (("elem_bytes", elem_bytes), ("head_elem_bytes", hb)):
        if isinstance(v, bool) or v not in (0.5, 1, 2, 4):
            raise ValueError(f"{name}: expected 0.5, 1, 2 or 4 bytes, got {v!r}")
    splits = tiles.splits or default_splits(g, rows, programs, max_context_len, tiles.min_keys)
    c = Counters(g.layers, g.kv_heads, rows)
    L, H, I, K_ATT = g.layers, g.hidden, g.inter, g.heads * g.head_dim
    n_qkv, n_o = _cdiv(g.qkv_rows, tiles.qkv_bn), _cdiv(H, tiles.o_bn)
    n_gu, n_down = _cdiv(I, tiles.gu_bn), _cdiv(H, tiles.down_bn)
    n_head = _cdiv(g.vocab, tiles.head_bn)
    per_group = (g.group + 2) * g.head_dim // tiles.qkv_bn          # qkv tiles of one KV group
    phases = []                                                      # lists of unit rows

    def unit(op, layer, a=0, b=0, cc=0, wait=NO_WAIT, target=0, signal=NO_WAIT, w=(), wb=0):
        w = list(w) + [0, 0]
        row = [0] * FIELDS
        row[F_OP], row[F_LAYER], row[F_A], row[F_B], row[F_C] = op, layer, a, b, cc
        row[F_WAIT], row[F_TARGET], row[F_SIGNAL], row[F_COUNT] = wait, target, signal, 1
        row[F_W0], row[F_W1], row[F_WB] = w[0], w[1], wb
        return row

    for l in range(L):
        w_prev = (c.res2(l - 1), n_down) if l else (NO_WAIT, 0)
        phases.append([unit(OP_QKV, l, n0, wait=w_prev[0], target=w_prev[1], signal=c.qkv(l, _group_of_row(g, n0)),
                            w=[n0 * H], wb=int(min(tiles.qkv_bn, g.qkv_rows - n0) * H * elem_bytes))
                       for n0 in range(0, g.qkv_rows, tiles.qkv_bn)])
        phases.append([unit(OP_ATT, l, b, kvh, sp, wait=c.qkv(l, kvh), target=per_group, signal=c.att(l))
                       for b in range(rows) for kvh in range(g.kv_heads) for sp in range(splits)])
        phases.append([unit(OP_O, l, n0, wait=c.att(l), target=rows * g.kv_heads, signal=c.res1(l),
                            w=[n0 * K_ATT], wb=int(min(tiles.o_bn, H - n0) * K_ATT * elem_bytes))
                       for n0 in range(0, H, tiles.o_bn)])
        phases.append([unit(OP_GU, l, n0, wait=c.res1(l), target=n_o, signal=c.mlp(l),
                            w=[n0 * H, (I + n0) * H], wb=int(min(tiles.gu_bn, I - n0) * H * elem_bytes))
                       for n0 in range(0, I, tiles.gu_bn)])
        phases.append([unit(OP_DOWN, l, n0, wait=c.mlp(l), target=n_gu, signal=c.res2(l),
                            w=[n0 * I], wb=int(min(tiles.down_bn, H - n0) * I * elem_bytes))
                       for n0 in range(0, H, tiles.down_bn)])
    phases.append([unit(OP_HEAD, L, n0, n0 // tiles.head_bn, wait=c.res2(L - 1), target=n_down, signal=c.head,
                        w=[n0 * H], wb=int(min(tiles.head_bn, g.vocab - n0) * H * hb))
                   for n0 in range(0, g.vocab, tiles.head_bn)])
    per_program = [[] for _ in range(programs)]
    nxt = 0
    for phase in phases:
        for u in phase:
            per_program[nxt].append(u)
            nxt = (nxt + 1) % programs
    units, starts, slots = [], [0], 0
    for lst in per_program:
        _elide_and_batch(lst)
        heads = [u for u in lst if u[F_OP] == OP_HEAD]
        if heads:
            heads[-1][F_C] = slots
            slots += 1
        units += [tuple(u) for u in lst]
        starts.append(len(units))
    return Schedule(g, tiles, rows, programs, splits, tuple(units), tuple(starts), c,
                    n_qkv, n_o, n_gu, n_down, n_head, slots)


def _elide_and_batch(lst: list) -> None:
    """One program's unit rows, in place: a wait an earlier unit of the program already met
    (the same counter, a target no higher) is dropped (F_WAIT NO_WAIT, F_TARGET 0: counters only
    grow within a launch, and the earlier acquire already ordered this unit's reads); a run of
    consecutive units signalling the same counter signals once, at its last unit, by the run's
    length (F_COUNT; 0 on the others). Attention units keep their own arrival (count 1): the
    last split of a row's kv head merges."""
    met: dict[int, int] = {}
    for u in lst:
        if u[F_WAIT] == NO_WAIT:
            continue
        if met.get(u[F_WAIT], -1) >= u[F_TARGET]:
            u[F_WAIT], u[F_TARGET] = NO_WAIT, 0
        else:
            met[u[F_WAIT]] = u[F_TARGET]
    i = 0
    while i < len(lst):
        j = i
        if lst[i][F_OP] != OP_ATT:
            while j + 1 < len(lst) and lst[j + 1][F_OP] != OP_ATT and lst[j + 1][F_SIGNAL] == lst[i][F_SIGNAL]:
                j += 1
        for k in range(i, j):
            lst[k][F_COUNT] = 0
        lst[j][F_COUNT] = j - i + 1
        i = j + 1


def _step_protocol(s: Schedule, u, ctr: list, arrivals: dict) -> None:
    """Apply unit row u's signal to the host counters (simulate / linearize)."""
    if u[F_OP] == OP_ATT:
        key = (u[F_LAYER], u[F_A], u[F_B])
        arrivals[key] = arrivals.get(key, 0) + 1
        if arrivals[key] == s.splits:
            ctr[u[F_SIGNAL]] += 1
    else:
        ctr[u[F_SIGNAL]] += u[F_COUNT]


def simulate(s: Schedule) -> list[int]:
    """Run the schedule's counter protocol on the host: programs take turns, each running its
    next unit when the unit's wait is met (an attention split signals only when it is the last
    of its S to arrive; other units add F_COUNT). Returns the counters after the step (before
    the in-kernel reset). RuntimeError if no program can move (a deadlock) or a wait target is
    not met exactly by the end."""
    order = _run(s, lambda ready, units: ready[0])
    ctr = [0] * s.counters.count
    arrivals: dict = {}
    waits = []
    for i in order:
        u = s.units[i]
        if u[F_WAIT] != NO_WAIT:
            waits.append((u[F_WAIT], u[F_TARGET]))
        _step_protocol(s, u, ctr, arrivals)
    for idx, target in waits:
        if ctr[idx] != target:
            raise RuntimeError(f"counter {idx} ends at {ctr[idx]}, a unit waited for exactly {target}")
    return ctr


def _run(s: Schedule, pick) -> list[int]:
    """The global unit indices in one execution order the protocol allows: each step runs the
    next unit of the program `pick(ready, units)` chooses among those whose next unit's wait is
    met (ready: program ids, ascending). RuntimeError on a deadlock."""
    ctr = [0] * s.counters.count
    pos = [s.starts[p] for p in range(s.programs)]
    arrivals: dict = {}
    order = []
    while True:
        live = [p for p in range(s.programs) if pos[p] < s.starts[p + 1]]
        if not live:
            return order
        ready = [p for p in live if s.units[pos[p]][F_WAIT] == NO_WAIT
                 or ctr[s.units[pos[p]][F_WAIT]] >= s.units[pos[p]][F_TARGET]]
        if not ready:
            raise RuntimeError(f"schedule deadlocks at units {pos}")
        p = pick(ready, [s.units[pos[q]] for q in ready])
        u = s.units[pos[p]]
        _step_protocol(s, u, ctr, arrivals)
        order.append(pos[p])
        pos[p] += 1


_PHASE = {OP_QKV: 0, OP_ATT: 1, OP_O: 2, OP_GU: 3, OP_DOWN: 4, OP_HEAD: 5}


def linearize(s: Schedule, policy: str = "eager", seed: int = 0) -> Schedule:
    """A one-program schedule running s's units (with s's waits and signal counts) in one order
    s's programs could interleave them on a GPU: "eager" runs, at each step, the ready unit
    latest in the global order (later layers and phases as early as the counters allow: a
    missing dependency or a buffer reused too soon changes the result); "random" picks a ready
    program at random (seeded). The kernel run with it on one program must give s's results
    bit for bit (tests: the counters are sufficient)."""
    if policy == "eager":
        def pick(ready, units):
            keys = [(u[F_LAYER], _PHASE[u[F_OP]]) for u in units]
            return ready[max(range(len(ready)), key=lambda i: (keys[i], -i))]
    elif policy == "random":
        import random
        rng = random.Random(seed)

        def pick(ready, units):
            return rng.choice(ready)
    else:
        raise ValueError(f"policy: expected 'eager' or 'random', got {policy!r}")
    order = _run(s, pick)
    units = tuple(s.units[i] for i in order)
    return Schedule(s.geometry, s.tiles, s.rows, 1, s.splits, units, (0, len(units)), s.counters,
                    s.n_qkv, s.n_o, s.n_gu, s.n_down, s.n_head, s.head_programs)


__all__ = ["Geometry", "Tiles", "Counters", "Schedule", "build_schedule", "simulate", "linearize",
           "default_splits", "FIELDS", "NO_WAIT", "MAX_ROWS", "OP_QKV", "OP_ATT", "OP_O", "OP_GU", "OP_DOWN",
           "OP_HEAD", "OP_NAMES"]
