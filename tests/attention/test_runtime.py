"""DecodeRuntime on CPU (eager; the Triton prepare kernel runs under TRITON_INTERPRET=1).

Correctness against reference_decode for the CPU backends (torch-splitkv, reference and
triton-decode: graphrt's own kernel, interpreted), the zero-copy path, input validation (clear
error naming the field, and nothing written to the static buffers), the device-side guard, and
report().
"""
from __future__ import annotations

import pytest
import torch

import graphrt
from graphrt import BatchTooLargeError, DecodeRuntime, DeviceInputError, PagedKVCache, RuntimeConfig
from graphrt.attention.reference import reference_decode

HQ, HKV, D, PAGE, CTX, POOL = 4, 2, 64, 16, 256, 64
MAX_PAGES = CTX // PAGE                       # 16
BACKENDS = ["torch-splitkv", "reference", "triton-decode"]
SPECIAL_LENS = [1, 16, 17, 256]               # first token, page boundary, one past it, maximum


def make_config(**changes) -> RuntimeConfig:
    kw = dict(num_qo_heads=HQ, num_kv_heads=HKV, head_dim=D, page_size=PAGE, max_context_len=CTX,
              buckets=[1, 2, 4, 8], dtype="float32", backend="torch-splitkv")
    kw.update(changes)
    return RuntimeConfig(**kw)


@pytest.fixture(scope="module")
def cfg():
    return make_config()


@pytest.fixture(scope="module")
def kv(cfg):
    return PagedKVCache.allocate(cfg, POOL, "cpu")


def make_rt(cfg, kv, backend="torch-splitkv"):
    rt = DecodeRuntime(cfg, kv, "cpu", backend=backend)
    assert rt.capture() == {}          # CPU: nothing to capture, eager path
    assert not rt.uses_graphs
    return rt


@pytest.fixture(params=BACKENDS)
def rt(request, cfg, kv):
    return make_rt(cfg, kv, request.param)


def rel_err(out, ref) -> float:
    assert torch.isfinite(out).all(), "non-finite output"
    return float((out.float() - ref.float()).norm() / ref.float().norm().clamp_min(1e-30))


def random_inputs(n, gen, *, step=0, width=MAX_PAGES, pool=POOL, lens=None):
    """q, block_table, seq_lens for n requests; the first rows cycle through SPECIAL_LENS."""
    q = torch.randn((n, HQ, D), generator=gen)
    if lens is None:
        lens = torch.randint(1, CTX + 1, (n,), generator=gen, dtype=torch.int32)
        for i in range(min(n, len(SPECIAL_LENS))):
            lens[i] = SPECIAL_LENS[(step + i) % len(SPECIAL_LENS)]
        lens = lens[torch.randperm(n, generator=gen)]
    else:
        lens = torch.tensor(lens, dtype=torch.int32)
    width = max(width, -(-int(lens.max()) // PAGE), 1)
    table = torch.randint(0, pool, (n, width), generator=gen, dtype=torch.int32)
    return q, table, lens


def reference(kv, q, table, lens, layout="NHD"):
    return reference_decode(q, kv.k, kv.v, table, lens, layout=layout)


def snapshot(rt):
    b = rt.buffers
    return {name: getattr(b, name).clone() for name in
            ("seq_lens", "block_table", "query", "output", "device_error", "paged_kv_indptr",
             "paged_kv_indices", "paged_kv_last_page_len")}


# ---- correctness ---------------------------------------------------------------------------
@pytest.mark.parametrize("n", [1, 3, 5, 8])
def test_decode_matches_reference(rt, kv, n):
    gen = torch.Generator().manual_seed(100 + n)
    seen = set()
    for step in range(4):  # repeated steps, fresh inputs each time; alternate full / minimal width
        q, table, lens = random_inputs(n, gen, step=step, width=MAX_PAGES if step % 2 == 0 else 0)
        seen.update(lens.tolist())
        rt.buffers.output.fill_(float("nan"))  # poison: every returned row must be written
        out = rt.decode(q, table, lens)
        assert out.shape == (n, HQ, D) and out.dtype == torch.float32
        assert rel_err(out, reference(kv, q, table, lens)) < 1e-4
        bucket = graphrt.pick_bucket((1, 2, 4, 8), n)
        assert torch.equal(rt.buffers.seq_lens[:n], lens)
        assert (rt.buffers.seq_lens[n:bucket] == 0).all()   # padded rows reset to empty requests
    assert set(SPECIAL_LENS) <= seen


def test_changing_batches_no_stale_state(rt, kv):
    """One runtime, batches of varying size / width / lengths; each step must match the reference."""
    gen = torch.Generator().manual_seed(7)
    for step, n in enumerate([8, 3, 5, 1, 8, 2, 7, 4, 8]):
        width = [MAX_PAGES, 0, 5][step % 3]
        if step % 3 == 2:  # short requests only, narrow table: stale wide columns must not leak in
            q, table, lens = random_inputs(n, gen, lens=[1 + (7 * i + step) % 80 for i in range(n)],
                                           width=width)
        else:
            q, table, lens = random_inputs(n, gen, step=step, width=width)
        out = rt.decode(q, table, lens).clone()
        assert out.shape == (n, HQ, D)
        assert rel_err(out, reference(kv, q, table, lens)) < 1e-4, (step, n)
        # the previous, larger batch's rows in this bucket are padding now: empty, zero output
        bucket = graphrt.pick_bucket((1, 2, 4, 8), n)
        assert (rt.buffers.seq_lens[n:bucket] == 0).all(), (step, n)
        assert (rt.buffers.output[n:bucket] == 0).all(), (step, n)


def test_same_inputs_same_output_after_other_steps(rt):
    gen = torch.Generator().manual_seed(11)
    q, table, lens = random_inputs(5, gen)
    first = rt.decode(q, table, lens).clone()
    rt.decode(*random_inputs(8, gen))
    rt.decode(*random_inputs(2, gen))
    again = rt.decode(q, table, lens).clone()
    assert torch.equal(first, again)


def test_output_view_only_n_rows(rt):
    gen = torch.Generator().manual_seed(3)
    q, table, lens = random_inputs(3, gen)
    out = rt.decode(q, table, lens)
    assert out.shape == (3, HQ, D)                       # not the bucket's 4 rows
    assert out.data_ptr() == rt.buffers.output.data_ptr()  # a view of the static output
    assert torch.equal(rt.buffers.output[3], torch.zeros(HQ, D))  # padded row: empty request


def test_zero_length_request_gives_zero_row(rt, kv):
    gen = torch.Generator().manual_seed(5)
    q, table, lens = random_inputs(3, gen, lens=[40, 0, 17])
    out = rt.decode(q, table, lens)
    assert torch.equal(out[1], torch.zeros(HQ, D))
    assert rel_err(out, reference(kv, q, table, lens)) < 1e-4


def test_dead_columns_not_validated(rt, kv):
    """Page ids past a request's last page are never read, so garbage there is accepted."""
    gen = torch.Generator().manual_seed(6)
    q, table, lens = random_inputs(3, gen, lens=[17, 1, 33])
    table[0, 2:] = 10_000
    table[1, 1:] = -5
    table[2, 3:] = POOL
    out = rt.decode(q, table, lens)
    assert rel_err(out, reference(kv, q, table, lens)) < 1e-4


@pytest.mark.parametrize("layout", ["HND", "NHD"])
def test_layouts(layout):
    c = make_config(kv_layout=layout)
    kv = PagedKVCache.allocate(c, POOL, "cpu", seed=1)
    rt = make_rt(c, kv)
    gen = torch.Generator().manual_seed(9)
    q, table, lens = random_inputs(6, gen)
    out = rt.decode(q, table, lens)
    assert rel_err(out, reference(kv, q, table, lens, layout=layout)) < 1e-4


def test_backends_agree(cfg, kv):
    a, b = make_rt(cfg, kv, "torch-splitkv"), make_rt(cfg, kv, "reference")
    gen = torch.Generator().manual_seed(12)
    q, table, lens = random_inputs(7, gen)
    assert rel_err(a.decode(q, table, lens), b.decode(q, table, lens)) < 1e-5
    assert a.backend.name == "torch-splitkv" and b.backend.name == "reference"


# ---- zero-copy path ------------------------------------------------------------------------
@pytest.mark.parametrize("n", [1, 3, 6, 8])
def test_zero_copy_path(rt, kv, n):
    gen = torch.Generator().manual_seed(200 + n)
    for step in range(2):
        q, table, lens = random_inputs(n, gen, step=step)
        view = rt.static_inputs(n)
        assert view.size == graphrt.pick_bucket((1, 2, 4, 8), n)
        view.query[:n] = q
        view.block_table[:n] = table
        view.seq_lens[:n] = lens
        view.seq_lens[n:] = 0
        view.output.fill_(float("nan"))
        out = rt.replay(view)[:n]
        assert rel_err(out, reference(kv, q, table, lens)) < 1e-4
        assert torch.equal(rt.replay(view)[n:], torch.zeros(view.size - n, HQ, D))
        rt.check_device_errors()  # valid inputs: no flag


def test_static_inputs_too_large(rt):
    with pytest.raises(BatchTooLargeError, match="largest bucket 8"):
        rt.static_inputs(9)


# ---- input validation: clear error, nothing written ---------------------------------------------
def _valid(n=3, seed=0):
    return random_inputs(n, torch.Generator().manual_seed(seed), lens=[20, 256, 1][:n] + [5] * (n - 3))


def _case(fn):
    """fn(q, table, lens) -> (q, table, lens) with one thing wrong."""
    def build():
        return fn(*_valid())
    return build


def _set(t, idx, value):
    t = t.clone()
    t[idx] = value
    return t


BAD_INPUTS = [
    # id, builder, exception, regex
    ("batch-too-large", lambda: _valid(9), BatchTooLargeError, r"batch size 9 exceeds the largest bucket 8"),
    ("empty-batch", lambda: (torch.zeros(0, HQ, D), torch.zeros(0, MAX_PAGES, dtype=torch.int32),
                             torch.zeros(0, dtype=torch.int32)), ValueError, r"batch size: must be >= 1"),
    ("seq_len-above-max", _case(lambda q, t, s: (q, t, _set(s, 0, CTX + 1))), ValueError,
     rf"seq_lens: values in \[1, {CTX + 1}\].*max_context_len={CTX}"),
    ("seq_len-negative", _case(lambda q, t, s: (q, t, _set(s, 2, -1))), ValueError, r"seq_lens: values in \[-1,"),
    ("block_table-int64", _case(lambda q, t, s: (q, t.long(), s)), ValueError, r"block_table: dtype torch.int64"),
    ("seq_lens-int64", _case(lambda q, t, s: (q, t, s.long())), ValueError, r"seq_lens: dtype torch.int64"),
    ("block_table-rows", _case(lambda q, t, s: (q, t[:2], s)), ValueError, r"block_table: shape \(2, 16\), expected \[3, w\]"),
    ("block_table-too-wide", _case(lambda q, t, s: (q, torch.cat([t, t[:, :1]], 1), s)), ValueError,
     r"block_table: shape \(3, 17\).*max_pages_per_seq=16"),
    ("block_table-no-columns", _case(lambda q, t, s: (q, t[:, :0], s)), ValueError, r"block_table: shape \(3, 0\)"),
    ("block_table-1d", _case(lambda q, t, s: (q, t[:, 0], s)), ValueError, r"block_table: shape \(3,\)"),
    ("block_table-too-few-columns", _case(lambda q, t, s: (q, t[:, :8], s)), ValueError,
     r"block_table: 8 columns, seq_lens needs 16 pages"),
    ("page-id-too-large", _case(lambda q, t, s: (q, _set(t, (1, 15), POOL), s)), ValueError,
     rf"block_table: page ids in \[\d+, {POOL}\], KV pool has {POOL} pages"),
    ("page-id-negative", _case(lambda q, t, s: (q, _set(t, (0, 1), -1), s)), ValueError,
     r"block_table: page ids in \[-1, .*KV pool has"),
    ("q-dtype", _case(lambda q, t, s: (q.double(), t, s)), ValueError, r"q: dtype torch.float64, config dtype is torch.float32"),
    ("q-dtype-bf16", _case(lambda q, t, s: (q.bfloat16(), t, s)), ValueError, r"q: dtype torch.bfloat16"),
    ("q-shape-head_dim", _case(lambda q, t, s: (q[..., :32], t, s)), ValueError, r"q: shape \(3, 4, 32\), expected \[n, 4, 64\]"),
    ("q-shape-heads", _case(lambda q, t, s: (q[:, :2], t, s)), ValueError, r"q: shape \(3, 2, 64\)"),
    ("q-2d", _case(lambda q, t, s: (q.flatten(1), t, s)), ValueError, r"q: shape \(3, 256\)"),
    ("q-device", _case(lambda q, t, s: (q.to("meta"), t, s)), ValueError, r"q: on meta, runtime device is cpu"),
    ("block_table-device", _case(lambda q, t, s: (q, t.to("meta"), s)), ValueError, r"block_table: on meta"),
    ("seq_lens-shape-short", _case(lambda q, t, s: (q, t, s[:2])), ValueError, r"seq_lens: shape \(2,\), expected \[3\]"),
    ("seq_lens-shape-2d", _case(lambda q, t, s: (q, t, s[:, None])), ValueError, r"seq_lens: shape \(3, 1\)"),
    ("q-not-tensor", _case(lambda q, t, s: (q.tolist(), t, s)), TypeError, r"q: expected a torch.Tensor, got list"),
    ("block_table-not-tensor", _case(lambda q, t, s: (q, t.numpy(), s)), TypeError, r"block_table: expected a torch.Tensor, got ndarray"),
    ("seq_lens-not-tensor", _case(lambda q, t, s: (q, t, s.tolist())), TypeError, r"seq_lens: expected a torch.Tensor, got list"),
]


def _fill_static_buffers(rt, seed=42):
    """Non-trivial contents everywhere, so that any write by a rejected call shows."""
    gen = torch.Generator().manual_seed(seed)
    b = rt.buffers
    b.seq_lens.copy_(torch.randint(1, CTX + 1, b.seq_lens.shape, generator=gen, dtype=torch.int32))
    b.block_table.copy_(torch.randint(0, POOL, b.block_table.shape, generator=gen, dtype=torch.int32))
    for t in (b.query, b.output):
        t.copy_(torch.randn(t.shape, generator=gen))
    for t in (b.paged_kv_indptr, b.paged_kv_indices, b.paged_kv_last_page_len):
        t.copy_(torch.randint(0, 1000, t.shape, generator=gen, dtype=torch.int32))


@pytest.mark.parametrize("build, exc, pattern", [c[1:] for c in BAD_INPUTS], ids=[c[0] for c in BAD_INPUTS])
def test_bad_input_rejected_before_any_write(cfg, kv, build, exc, pattern):
    # validation runs before any backend code, so one backend is enough here
    rt = DecodeRuntime(cfg, kv, "cpu")
    _fill_static_buffers(rt)
    before = snapshot(rt)
    q, table, lens = build()
    with pytest.raises(exc, match=pattern):
        rt.decode(q, table, lens)
    after = snapshot(rt)
    for name in before:
        assert torch.equal(before[name], after[name]), f"{name} was written"


def test_runtime_usable_after_bad_inputs(rt, kv):
    gen = torch.Generator().manual_seed(42)
    q, table, lens = random_inputs(8, gen)
    first = rt.decode(q, table, lens).clone()
    for _, build, exc, _ in BAD_INPUTS:
        with pytest.raises(exc):
            rt.decode(*build())
    rt.check_device_errors()  # host-rejected inputs never reached the device guard
    assert torch.equal(rt.decode(q, table, lens), first)
    q, table, lens = _valid()
    assert rel_err(rt.decode(q, table, lens), reference(kv, q, table, lens)) < 1e-4


def test_valid_baseline_of_bad_cases(rt):
    """The unmodified inputs the bad cases start from are accepted (so each case tests one fault)."""
    q, table, lens = _valid()
    assert rt.decode(q, table, lens).shape == (3, HQ, D)


@pytest.mark.parametrize("what, kv_fn, exc, pattern", [
    ("k-shape", lambda kv: PagedKVCache(kv.k[..., :32], kv.v, "NHD"), ValueError, r"kv_cache.k: shape \(64, 16, 2, 32\)"),
    ("v-shape", lambda kv: PagedKVCache(kv.k, kv.v[:, :8], "NHD"), ValueError, r"kv_cache.v: shape"),
    ("hnd-tensors", lambda kv: PagedKVCache(kv.k.transpose(1, 2), kv.v.transpose(1, 2), "NHD"), ValueError,
     r"kv_cache.k: shape \(64, 2, 16, 64\) does not match config \(NHD\) \(64, 16, 2, 64\)"),
    ("dtype", lambda kv: PagedKVCache(kv.k.half(), kv.v.half(), "NHD"), ValueError, r"kv_cache.k: dtype torch.float16"),
    ("v-dtype", lambda kv: PagedKVCache(kv.k, kv.v.double(), "NHD"), ValueError, r"kv_cache.v: dtype torch.float64"),
    ("layout", lambda kv: PagedKVCache(kv.k, kv.v, "HND"), ValueError, r"kv_cache.layout: HND, config kv_layout is NHD"),
    ("device", lambda kv: PagedKVCache(kv.k.to("meta"), kv.v.to("meta"), "NHD"), ValueError, r"kv_cache.k: on meta"),
], ids=["k-shape", "v-shape", "hnd-tensors", "dtype", "v-dtype", "layout", "device"])
def test_bad_kv_cache(cfg, kv, what, kv_fn, exc, pattern):
    with pytest.raises(exc, match=pattern):
        DecodeRuntime(cfg, kv_fn(kv), "cpu")


def test_kv_cache_for_other_layout_config(cfg, kv):
    with pytest.raises(ValueError, match=r"kv_cache.k: shape .* does not match config \(HND\)"):
        DecodeRuntime(cfg.replace(kv_layout="HND"), kv, "cpu")


def test_config_must_be_runtime_config(cfg, kv):
    with pytest.raises(TypeError, match="config: expected RuntimeConfig, got dict"):
        DecodeRuntime(cfg.to_dict(), kv, "cpu")


def test_unknown_backend_name(cfg, kv):
    with pytest.raises(ValueError, match=r"backend: 'nope'"):
        DecodeRuntime(cfg, kv, "cpu", backend="nope")


# ---- device-side guard ---------------------------------------------------------------------------
def _write_bad_batch(rt, n=4, seed=0):
    gen = torch.Generator().manual_seed(seed)
    q, table, lens = random_inputs(n, gen, lens=[33, 100, 50, 7][:n])
    lens[1] = CTX + 5                     # row 1: seq_len above max_context_len
    table[2, 2] = POOL + 3                # row 2: page id outside the pool (a live page: 50 tokens = 4 pages)
    view = rt.static_inputs(n)
    view.query[:n], view.block_table[:n], view.seq_lens[:n] = q, table, lens
    view.seq_lens[n:] = 0
    return view, q, table, lens


def test_device_guard(rt, kv):
    view, q, table, lens = _write_bad_batch(rt)
    view.output.fill_(float("nan"))
    out = rt.replay(view)[:4].clone()     # must not read out of bounds
    with pytest.raises(DeviceInputError, match=r"seq_lens.*block_table") as info:
        rt.check_device_errors()
    msg = str(info.value)
    assert f"max_context_len={CTX}" in msg and f"[0, {POOL})" in msg
    assert int(view.seq_lens[1]) == 0                     # offending row set empty
    assert int(view.block_table[2, 2]) == table[2, 2]     # input kept (K/V append skips it)...
    assert int(view.paged_kv_indices[int(view.paged_kv_indptr[2]) + 2]) == 0  # ...read as page 0
    assert torch.equal(view.seq_lens[[0, 2, 3]], lens[[0, 2, 3]])   # other rows untouched
    rt.check_device_errors()                              # flags were cleared: no second raise
    assert int(rt.buffers.device_error) == 0
    # sanitised rows: row 1 is empty; row 2 reads page 0 in place of the bad id; others exact
    fixed_table, fixed_lens = table.clone(), lens.clone()
    fixed_lens[1] = 0
    fixed_table[2, 2] = 0
    assert torch.equal(out[1], torch.zeros(HQ, D))
    assert rel_err(out, reference(kv, q, fixed_table, fixed_lens)) < 1e-4


def test_device_guard_flag_each_kind_alone(rt):
    view, *_ = _write_bad_batch(rt)
    view.block_table[2, 2] = 1            # only the seq_len fault left
    rt.replay(view)
    with pytest.raises(DeviceInputError) as info:
        rt.check_device_errors()
    assert "seq_lens" in str(info.value) and "block_table" not in str(info.value)

    view, *_ = _write_bad_batch(rt)
    view.seq_lens[1] = 3                  # only the page-id fault left
    rt.replay(view)
    with pytest.raises(DeviceInputError) as info:
        rt.check_device_errors()
    assert "block_table" in str(info.value) and "seq_lens" not in str(info.value)
    rt.check_device_errors()


def test_device_guard_negative_values(rt):
    view, *_ = _write_bad_batch(rt)
    view.seq_lens[1] = -3
    view.block_table[2, 2] = -1
    rt.replay(view)
    with pytest.raises(DeviceInputError, match=r"seq_lens.*block_table"):
        rt.check_device_errors()
    assert int(view.seq_lens[1]) == 0 and int(view.block_table[2, 2]) == -1
    assert int(view.paged_kv_indices[int(view.paged_kv_indptr[2]) + 2]) == 0


def test_device_guard_is_sticky_across_steps(rt, kv):
    """A flag raised by one step survives later good steps until checked."""
    view, *_ = _write_bad_batch(rt)
    rt.replay(view)
    gen = torch.Generator().manual_seed(1)
    q, table, lens = random_inputs(4, gen)
    out = rt.decode(q, table, lens)
    assert rel_err(out, reference(kv, q, table, lens)) < 1e-4
    with pytest.raises(DeviceInputError):
        rt.check_device_errors()
    rt.check_device_errors()


def test_device_guard_independent_of_program_order(rt, kv, monkeypatch):
    """GPU program order is unspecified: run the interpreter's grid backwards, the guard must still
    flag a bad seq_len in a row other than 0 (each program rewrites its own row in place)."""
    interp = pytest.importorskip("triton.runtime.interpreter")
    if torch.cuda.is_available():
        pytest.skip("interpreter-only test")
    builder = interp.interpreter_builder
    forward = builder.set_grid_idx
    calls = []

    def backwards(x, y, z):
        calls.append(x)
        forward(builder.grid_dim[0] - 1 - x, y, z)

    monkeypatch.setattr(builder, "set_grid_idx", backwards)
    view, q, table, lens = _write_bad_batch(rt)
    out = rt.replay(view)[:4].clone()
    assert calls, "the prepare kernel did not run through the interpreter"
    with pytest.raises(DeviceInputError, match=r"seq_lens.*block_table"):
        rt.check_device_errors()
    fixed_table, fixed_lens = table.clone(), lens.clone()
    fixed_lens[1] = 0
    fixed_table[2, 2] = 0
    assert rel_err(out, reference(kv, q, fixed_table, fixed_lens)) < 1e-4
    # and a valid batch decoded with the reversed order is right
    q, table, lens = random_inputs(8, torch.Generator().manual_seed(2))
    assert rel_err(rt.decode(q, table, lens), reference(kv, q, table, lens)) < 1e-4
    rt.check_device_errors()


# ---- report ---------------------------------------------------------------------------------------
def test_report(rt, cfg):
    rows = rt.report()
    assert [r["bucket"] for r in rows] == list(cfg.buckets)
    sizes = [r["buffer_bytes"] for r in rows]
    assert all(s > 0 for s in sizes)
    assert all(a < b for a, b in zip(sizes, sizes[1:]))
    assert sizes[-1] == rt.buffers.nbytes()
    for r in rows:
        assert r["backend"] == rt.backend.name
        assert r["capture_ms"] is None and r["graph_bytes"] is None  # eager on CPU


def test_bucket_backends_argument_is_checked(kv):
    cfg = RuntimeConfig(num_qo_heads=HQ, num_kv_heads=2, head_dim=D, page_size=16, max_context_len=CTX,
                        buckets=[1, 2, 4, 8], dtype="float32", backend="torch-splitkv")
    with pytest.raises(ValueError, match="bucket_backends: keys"):
        DecodeRuntime(cfg, kv, "cpu", bucket_backends={1: "reference"})
    with pytest.raises(ValueError, match="backend / bucket_backends"):
        DecodeRuntime(cfg, kv, "cpu", backend="reference",
                      bucket_backends={b: "reference" for b in cfg.buckets})
    with pytest.raises(ValueError, match="backend: 'nope'"):
        DecodeRuntime(cfg, kv, "cpu", bucket_backends={1: "nope", 2: "reference", 4: "reference",
                                                       8: "reference"})
    mixed = DecodeRuntime(cfg, kv, "cpu", bucket_backends={1: "reference", 2: "reference",
                                                           4: "torch-splitkv", 8: "torch-splitkv"})
    assert mixed.backend_for(1).name == "reference" and mixed.backend_for(8).name == "torch-splitkv"


@pytest.mark.parametrize("kwargs, err, words", [
    ({"parity_sets": 0}, ValueError, "parity_sets"), ({"parity_sets": True}, ValueError, "parity_sets"),
    ({"parity_sets": 2.0}, ValueError, "parity_sets"), ({"lazy": "yes"}, TypeError, "lazy"),
])
def test_runtime_keyword_arguments_are_checked(cfg, kv, kwargs, err, words):
    with pytest.raises(err, match=words):
        DecodeRuntime(cfg, kv, "cpu", **kwargs)
