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
    GU    gate rows [n, n + gu_bn) and up rows [I + n, ...): RMSNorm prologue (the sums of
          squares from the O tiles), silu(gate) * up into the MLP scratch. Waits RES1[l];
          signals MLP[l].
    DOWN  a tile of down_bn rows of down: the residual add and sums of squares as O. Waits
          MLP[l]; signals RES2[l].

then HEAD tiles of head_bn vocabulary rows: the final RMSNorm prologue, logits (model dtype) and
each row's tile argmax; the last tile to arrive reduces them into the greedy tokens. HEAD waits
RES2[L - 1].

Every wait is on units earlier in the global order, and each program's list keeps that order,
so with all programs resident the step cannot deadlock (the earliest unfinished unit always has
its inputs); with one program the list is the global order and no wait ever spins. Units of a
phase are dealt round-robin over the programs, continuing where the phase before stopped.

Counters (int32, global memory, all zero between launches: the last program to finish zeroes
them): per layer QKV[l][0..Hkv), ATT[l], RES1[l], MLP[l], RES2[l]; then the split arrivals
ARR[b * Hkv + g], the LM-head tiles' arrival, and DONE (programs finished).
"""
from __future__ import annotations

from dataclasses import dataclass


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


OP_QKV, OP_ATT, OP_O, OP_GU, OP_DOWN, OP_HEAD = 1, 2, 3, 4, 5, 6
OP_NAMES = {OP_QKV: "qkv", OP_ATT: "attention", OP_O: "o", OP_GU: "gate_up", OP_DOWN: "down", OP_HEAD: "lm_head"}
# one unit row: what the kernel reads per unit (int64)
F_OP, F_LAYER, F_A, F_B, F_C, F_WAIT, F_TARGET, F_SIGNAL, F_PF0, F_PB0, F_PF1, F_PB1 = range(12)
FIELDS = 12
NO_WAIT = -1        # F_WAIT of a unit that waits for nothing (F_TARGET 0)
MAX_ROWS = 16       # decode rows of one step (the GEMV tile's M)


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
    block_k: the K columns of one weight load of a 16-row tile (a tile of n rows loads block_k *
    16 / n columns: the same registers; block_k >= every tile's rows); splits: KV splits per (row, kv head) (0: chosen
    by `build_schedule` to give about one attention unit per program); block_kv: keys per
    attention block; min_keys: keys per split at least (a multiple of block_kv)."""
    qkv_bn: int = 16
    o_bn: int = 16
    gu_bn: int = 16
    down_bn: int = 16
    head_bn: int = 32
    block_k: int = 256
    splits: int = 0
    block_kv: int = 32
    min_keys: int = 256

    def check(self, g: Geometry) -> None:
        for name in ("qkv_bn", "o_bn", "gu_bn", "down_bn", "head_bn", "block_k", "block_kv"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 16 or v & (v - 1):
                raise ValueError(f"tiles.{name}: expected a power of 2 >= 16, got {v!r}")
        widest = max(self.qkv_bn, self.o_bn, self.gu_bn, self.down_bn, self.head_bn)
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
    """units: FIELDS-int rows (lists), grouped by program; starts: P + 1 offsets; counters: the
    layout; splits: S of the attention units; tile counts of each GEMV (n_qkv, n_o, n_gu,
    n_down, n_head)."""
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
                   max_context_len: int = 4096, elem_bytes: int = 2) -> Schedule:
    """The step's units for `rows` decode rows (1..16) over `programs` programs (>= 1).
    elem_bytes: bytes per weight element (the L2 prefetch sizes of F_PB0 / F_PB1);
    max_context_len: bounds the default split count. F_PF0 / F_PF1 hold the weight tile's
    first element as (weight field, element offset within that weight); the launcher adds the
    weight's own offset (kernels/persistent/step.py)."""
    if isinstance(rows, bool) or not isinstance(rows, int) or not 1 <= rows <= MAX_ROWS:
        raise ValueError(f"rows: expected an int in [1, {MAX_ROWS}], got {rows!r}")
    if isinstance(programs, bool) or not isinstance(programs, int) or programs < 1:
        raise ValueError(f"programs: expected an int >= 1, got {programs!r}")
    tiles.check(g)
    splits = tiles.splits or default_splits(g, rows, programs, max_context_len, tiles.min_keys)
    c = Counters(g.layers, g.kv_heads, rows)
    L, H, I, K_ATT = g.layers, g.hidden, g.inter, g.heads * g.head_dim
    n_qkv, n_o = _cdiv(g.qkv_rows, tiles.qkv_bn), _cdiv(H, tiles.o_bn)
    n_gu, n_down = _cdiv(I, tiles.gu_bn), _cdiv(H, tiles.down_bn)
    n_head = _cdiv(g.vocab, tiles.head_bn)
    per_group = (g.group + 2) * g.head_dim // tiles.qkv_bn          # qkv tiles of one KV group
    phases = []                                                      # lists of unit rows

    def unit(op, layer, a=0, b=0, cc=0, wait=NO_WAIT, target=0, signal=NO_WAIT, pf=(), pb=()):
        pf, pb = list(pf) + [0, 0], list(pb) + [0, 0]
        return (op, layer, a, b, cc, wait, target, signal, pf[0], pb[0], pf[1], pb[1])

    for l in range(L):
        w_prev = (c.res2(l - 1), n_down) if l else (NO_WAIT, 0)
        phases.append([unit(OP_QKV, l, n0, wait=w_prev[0], target=w_prev[1], signal=c.qkv(l, _group_of_row(g, n0)),
                            pf=[n0 * H], pb=[min(tiles.qkv_bn, g.qkv_rows - n0) * H * elem_bytes])
                       for n0 in range(0, g.qkv_rows, tiles.qkv_bn)])
        phases.append([unit(OP_ATT, l, b, kvh, sp, wait=c.qkv(l, kvh), target=per_group, signal=c.att(l))
                       for b in range(rows) for kvh in range(g.kv_heads) for sp in range(splits)])
        phases.append([unit(OP_O, l, n0, wait=c.att(l), target=rows * g.kv_heads, signal=c.res1(l),
                            pf=[n0 * K_ATT], pb=[min(tiles.o_bn, H - n0) * K_ATT * elem_bytes])
                       for n0 in range(0, H, tiles.o_bn)])
        phases.append([unit(OP_GU, l, n0, wait=c.res1(l), target=n_o, signal=c.mlp(l),
                            pf=[n0 * H, (I + n0) * H], pb=[min(tiles.gu_bn, I - n0) * H * elem_bytes] * 2)
                       for n0 in range(0, I, tiles.gu_bn)])
        phases.append([unit(OP_DOWN, l, n0, wait=c.mlp(l), target=n_gu, signal=c.res2(l),
                            pf=[n0 * I], pb=[min(tiles.down_bn, H - n0) * I * elem_bytes])
                       for n0 in range(0, H, tiles.down_bn)])
    phases.append([unit(OP_HEAD, L, n0, n0 // tiles.head_bn, wait=c.res2(L - 1), target=n_down, signal=c.head,
                        pf=[n0 * H], pb=[min(tiles.head_bn, g.vocab - n0) * H * elem_bytes])
                   for n0 in range(0, g.vocab, tiles.head_bn)])
    per_program = [[] for _ in range(programs)]
    nxt = 0
    for phase in phases:
        for u in phase:
            per_program[nxt].append(u)
            nxt = (nxt + 1) % programs
    units, starts = [], [0]
    for lst in per_program:
        units += lst
        starts.append(len(units))
    return Schedule(g, tiles, rows, programs, splits, tuple(units), tuple(starts), c,
                    n_qkv, n_o, n_gu, n_down, n_head)


def simulate(s: Schedule) -> list[int]:
    """Run the schedule's counter protocol on the host: programs take turns, each running its
    next unit when the unit's wait is met (an attention split signals only when it is the last
    of its S to arrive; the LM-head tiles signal nothing). Returns the counters after the step
    (before the in-kernel reset). RuntimeError if no program can move (a deadlock) or a wait
    target is not met exactly by the end."""
    ctr = [0] * s.counters.count
    pos = [s.starts[p] for p in range(s.programs)]
    arrivals: dict[tuple, int] = {}
    waits = []
    while any(pos[p] < s.starts[p + 1] for p in range(s.programs)):
        moved = False
        for p in range(s.programs):
            if pos[p] == s.starts[p + 1]:
                continue
            u = s.units[pos[p]]
            if u[F_WAIT] != NO_WAIT and ctr[u[F_WAIT]] < u[F_TARGET]:
                continue
            if u[F_WAIT] != NO_WAIT:
                waits.append((u[F_WAIT], u[F_TARGET]))
            if u[F_OP] == OP_ATT:
                key = (u[F_LAYER], u[F_A], u[F_B])
                arrivals[key] = arrivals.get(key, 0) + 1
                if arrivals[key] == s.splits:
                    ctr[u[F_SIGNAL]] += 1
            else:
                ctr[u[F_SIGNAL]] += 1
            pos[p] += 1
            moved = True
        if not moved:
            raise RuntimeError(f"schedule deadlocks at units {pos}")
    for idx, target in waits:
        if ctr[idx] != target:
            raise RuntimeError(f"counter {idx} ends at {ctr[idx]}, a unit waited for exactly {target}")
    return ctr


__all__ = ["Geometry", "Tiles", "Counters", "Schedule", "build_schedule", "simulate", "default_splits",
           "FIELDS", "NO_WAIT", "MAX_ROWS", "OP_QKV", "OP_ATT", "OP_O", "OP_GU", "OP_DOWN", "OP_HEAD", "OP_NAMES"]
