"""Reliability on CPU: lazy capture's failure paths, prefill validation,
capture idempotency, forked requests sharing a written page, concurrent use, and the guards a
green suite used not to notice (stale block-table columns, the K/V-slot overflow flag).

CUDA graphs need a GPU, so the graph lifecycle runs here through FakeGraphs: capture runs the step
once and keeps it, replay runs the kept step again on the same static buffers (what a CUDA graph
replay does), drop forgets it. Outputs are checked against reference_decode / eager runtimes.
"""
from __future__ import annotations

import threading

import pytest
import torch

import graphrt.model.runtime as model_runtime
import graphrt.attention.runtime as runtime
import graphrt.attention.verify as verify
from graphrt import DecodeRuntime, DeviceInputError, PagedKVCache, RuntimeConfig
from graphrt.attention.graphs import CaptureStats, GraphKey, GraphRunner
from graphrt.kernels.append_kv import ERR_KV_SLOT, append_kv
from graphrt.model.runtime import ModelRuntime
from graphrt.model import LlamaDecoder
from graphrt.model.llama import LlamaSpec
from graphrt.attention.reference import reference_decode

HQ, HKV, D, PAGE, CTX, POOL = 4, 2, 64, 16, 128, 40
WIDTH = CTX // PAGE  # 8


class FakeGraphs(GraphRunner):
    """The graph runner with only its CUDA part replaced (see the module docstring): the capture
    set-up (inputs filled and restored, page 0 kept, prepare) is the real one."""

    def __init__(self, device, **kw):
        super().__init__(device, **kw)
        self.captures, self.replays = [], []
        self.fail_capture = False

    enabled = property(lambda self: True)

    def _record(self, key, step, prepare):
        self.captures.append(key.bucket)
        if prepare is not None:
            prepare()
        step()
        if self.fail_capture:
            raise RuntimeError("capture failed")
        return _Replay(step, self.replays, key.bucket), CaptureStats(key.bucket, 0.0, 0.0, 0, key)


class _Replay:
    def __init__(self, step, log, bucket):
        self.step, self.log, self.bucket = step, log, bucket

    def replay(self):
        self.log.append(self.bucket)
        self.step()


def _in(rt, bucket) -> bool:
    return GraphKey("attention", bucket) in rt.graphs


def _config(**changes) -> RuntimeConfig:
    kw = dict(num_qo_heads=HQ, num_kv_heads=HKV, head_dim=D, page_size=PAGE, max_context_len=CTX,
              buckets=[1, 2, 4], dtype="float32", backend="torch-splitkv", kv_pool_pages=POOL)
    kw.update(changes)
    return RuntimeConfig(**kw)


def _batch(n, gen, lens):
    """q, block_table (distinct pages per row), seq_lens for n rows."""
    q = torch.randn((n, HQ, D), generator=gen)
    table = torch.randperm(POOL, generator=gen)[: n * WIDTH].to(torch.int32).view(n, WIDTH)
    return q, table, torch.tensor(lens, dtype=torch.int32)


def _reference(kv, q, table, lens):
    return reference_decode(q, kv.k, kv.v, table, lens, layout="NHD")


def _rel(out, ref) -> float:
    return float((out - ref).norm() / ref.norm())


# ---- lazy capture ------------------------------------------------------------------------------
@pytest.fixture
def lazy_rt(monkeypatch):
    """A lazy DecodeRuntime whose buckets 'capture' through FakeGraphs on CPU."""
    cfg = _config()
    rt = DecodeRuntime(cfg, PagedKVCache.allocate(cfg, POOL, "cpu"), "cpu", lazy=True)
    rt.graphs = FakeGraphs(rt.device)
    monkeypatch.setattr(rt, "_captures", lambda bucket: True)
    return rt


def _write_static(rt, q, table, lens):
    """The zero-copy path: the user writes the bucket's static inputs directly."""
    view = rt.static_inputs(q.shape[0])
    n = q.shape[0]
    view.query[:n] = q
    view.block_table[:n] = table
    view.seq_lens[:n] = lens
    view.seq_lens[n:] = 0
    return view


def _static(view):
    return [t.clone() for t in (view.query, view.block_table, view.seq_lens)]


def test_lazy_captures_verifies_then_replays(lazy_rt):
    gen = torch.Generator().manual_seed(0)
    q, table, lens = _batch(3, gen, [1, 17, 128])
    out = lazy_rt.decode(q, table, lens).clone()
    assert lazy_rt.graphs.captures == [4] and _in(lazy_rt, 4)   # captured on first use
    assert lazy_rt.graphs.replays                                    # verified, served by replay
    assert _rel(out, _reference(lazy_rt.kv_cache, q, table, lens)) < 1e-4
    q2, table2, lens2 = _batch(4, gen, [5, 16, 0, 100])
    out2 = lazy_rt.decode(q2, table2, lens2)
    assert lazy_rt.graphs.captures == [4]                            # no second capture
    assert _rel(out2, _reference(lazy_rt.kv_cache, q2, table2, lens2)) < 1e-4


def test_lazy_failed_verification_drops_graph_and_keeps_inputs(lazy_rt, monkeypatch):
    gen = torch.Generator().manual_seed(1)
    q, table, lens = _batch(4, gen, [3, 40, 128, 16])
    view = _write_static(lazy_rt, q, table, lens)
    written = _static(view)
    monkeypatch.setattr(verify, "verify_bucket", lambda rt, size, seed: 1.0)  # over tolerance
    for attempt in (1, 2):  # the next call must not replay the rejected graph silently
        with pytest.raises(RuntimeError, match="bucket 4: lazily captured graph failed verification"):
            lazy_rt.replay(view)
        assert not _in(lazy_rt, 4) and 4 not in lazy_rt.graphs.stats_by_bucket()
        assert lazy_rt.graphs.captures == [4] * attempt and not lazy_rt.graphs.replays
        assert all(torch.equal(a, b) for a, b in zip(_static(view), written))
    monkeypatch.undo()                     # verification passes again: a zero-copy retry is right
    monkeypatch.setattr(lazy_rt, "_captures", lambda bucket: True)
    out = lazy_rt.replay(view)
    assert _in(lazy_rt, 4)
    assert _rel(out, _reference(lazy_rt.kv_cache, q, table, lens)) < 1e-4


@pytest.mark.parametrize("where", ["capture", "verification"])
def test_lazy_exception_restores_inputs_and_drops_graph(lazy_rt, monkeypatch, where):
    gen = torch.Generator().manual_seed(2)
    q, table, lens = _batch(2, gen, [77, 9])
    view = _write_static(lazy_rt, q, table, lens)
    written = _static(view)
    real_verify = verify.verify_bucket
    if where == "capture":
        lazy_rt.graphs = FakeGraphs(lazy_rt.device)
        lazy_rt.graphs.fail_capture = True
    else:
        def verify_then_raise(rt, size, seed):
            real_verify(rt, size, seed=seed)       # leaves its own random batch in the buffers
            raise RuntimeError("verification failed")
        monkeypatch.setattr(verify, "verify_bucket", verify_then_raise)
    with pytest.raises(RuntimeError, match=f"{where} failed"):
        lazy_rt.replay(view)
    assert not _in(lazy_rt, 2) and 2 not in lazy_rt.graphs.stats_by_bucket()
    assert all(torch.equal(a, b) for a, b in zip(_static(view), written))
    lazy_rt.graphs.fail_capture = False
    monkeypatch.setattr(verify, "verify_bucket", real_verify)
    out = lazy_rt.replay(view)                     # zero-copy retry: nothing rewritten
    assert _rel(out, _reference(lazy_rt.kv_cache, q, table, lens)) < 1e-4


def test_decode_runtime_capture_twice_skips_captured_buckets(monkeypatch):
    cfg = _config()
    rt = DecodeRuntime(cfg, PagedKVCache.allocate(cfg, POOL, "cpu"), "cpu")
    rt.graphs = FakeGraphs(rt.device)
    monkeypatch.setattr(rt, "_captures", lambda bucket: True)
    monkeypatch.setattr(DecodeRuntime, "uses_graphs", property(lambda self: True))
    first = rt.capture()
    assert rt.capture() == first and sorted(first) == [1, 2, 4]
    assert rt.graphs.captures == [4, 2, 1]


# ---- ModelRuntime ------------------------------------------------------------------------------
VOCAB = 64


def _model(seed=0) -> LlamaDecoder:
    spec = LlamaSpec(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_layers=2,
                     num_heads=HQ, num_kv_heads=HKV, head_dim=D, rms_norm_eps=1e-5,
                     rope_theta=10000.0, tie_word_embeddings=True, attention_bias=False)
    gen = torch.Generator().manual_seed(seed)
    shapes = {"embed_tokens.weight": (VOCAB, 64), "norm.weight": (64,)}
    layer = {"self_attn.q_proj": (HQ * D, 64), "self_attn.k_proj": (HKV * D, 64),
             "self_attn.v_proj": (HKV * D, 64), "self_attn.o_proj": (64, HQ * D),
             "mlp.gate_proj": (96, 64), "mlp.up_proj": (96, 64), "mlp.down_proj": (64, 96),
             "input_layernorm": (64,), "post_attention_layernorm": (64,)}
    for i in range(spec.num_layers):
        shapes.update({f"layers.{i}.{name}.weight": shape for name, shape in layer.items()})
    sd = {k: (0.2 * torch.randn(s, generator=gen) if len(s) == 2 else 1 + 0.1 * torch.randn(s, generator=gen))
          for k, s in shapes.items()}
    return LlamaDecoder.from_state_dict(spec, sd)


def _mrt(k=1, **changes) -> ModelRuntime:
    return ModelRuntime(_model(), _config(**changes), "cpu", steps_per_graph=k)


def test_model_capture_twice_returns_stats(monkeypatch):
    mrt = _mrt()
    mrt.graphs = FakeGraphs(mrt.device)
    monkeypatch.setattr(mrt, "device", torch.device("cuda"))   # take capture()'s graph path
    monkeypatch.setattr(mrt.backend, "capturable", True)
    first = mrt.capture()
    second = mrt.capture()                                     # used to raise "already captured"
    assert second == first and sorted(k.bucket for k in first) == [1, 2, 4]
    assert mrt.graphs.captures == [4, 2, 1]


def _caches(mrt):
    return [t.clone() for c in mrt.kv_caches for t in (c.k, c.v)]


def _prefill_case(mutate):
    gen = torch.Generator().manual_seed(3)
    prompts = [torch.randint(0, VOCAB, (n,), generator=gen) for n in (20, 5)]
    table = torch.tensor([[0, 1, 2], [3, 4, 5]], dtype=torch.int32)
    return mutate(prompts, table)


def _set(t, idx, value):
    t = t.clone()
    t[idx] = value
    return t


_WIDE = torch.arange(16, dtype=torch.int32).view(2, 8)
PREFILL_BAD = [  # (case, (prompts, table) -> bad (prompts, table), error pattern)
    ("page-id-minus-one", lambda p, t: (p, _set(t, (0, 1), -1)),
     r"block_table: page ids in \[-1, 3\], KV pool has 40"),
    ("page-id-past-pool", lambda p, t: (p, _set(t, (1, 0), POOL)),
     r"block_table: page ids in \[0, 40\], KV pool has 40"),
    ("table-too-narrow", lambda p, t: (p, t[:, :1]), r"block_table: 1 columns, prompt lengths needs 2 pages"),
    ("prompt-too-long", lambda p, t: ([torch.zeros(CTX + 1, dtype=torch.int64), p[1]], _WIDE),
     r"prompts\[0\]: length 129, allowed \[1, max_context_len=128\]"),
    ("prompt-empty", lambda p, t: ([p[0], p[1][:0]], t), r"prompts\[1\]: length 0"),
    ("prompt-int32", lambda p, t: ([p[0].int(), p[1]], t),
     r"prompts\[0\]: .*torch.int32.*expected \[T\] torch.int64"),
    ("prompt-ids-past-vocab", lambda p, t: ([p[0], _set(p[1], 2, VOCAB)], t),
     r"prompts\[1\]: ids in \[.*64\], vocabulary has 64"),
    ("table-int64", lambda p, t: (p, t.long()), r"block_table: dtype torch.int64, expected torch.int32"),
    ("table-rows", lambda p, t: (p, t[:1]), r"block_table: shape \(1, 3\), expected \[2, w\]"),
    ("table-too-wide", lambda p, t: (p, torch.zeros((2, WIDTH + 1), dtype=torch.int32)), r"max_pages_per_seq=8"),
    ("no-prompts", lambda p, t: ([], t[:0]), r"prompts: expected a non-empty list"),
    ("shared-page", lambda p, t: (p, _set(t, (1, 0), 1)), r"block_table: rows \[0, 1\] share page 1"),
]


@pytest.mark.parametrize("name,mutate,pattern", PREFILL_BAD, ids=[c[0] for c in PREFILL_BAD])
def test_prefill_rejects_bad_input_before_writing(name, mutate, pattern):
    mrt = _mrt()
    before = _caches(mrt)
    prompts, table = _prefill_case(mutate)
    with pytest.raises(ValueError, match=pattern):
        mrt.prefill(prompts, table)
    assert all(torch.equal(a, b) for a, b in zip(_caches(mrt), before))   # nothing written


def test_prefill_valid_baseline_and_dead_columns():
    mrt = _mrt()
    prompts, table = _prefill_case(lambda p, t: (p, _set(t, (1, 2), -7)))  # row 1 uses 1 page
    logits = mrt.prefill(prompts, table)
    assert logits.shape == (2, VOCAB) and torch.isfinite(logits).all()


# ---- forked requests ---------------------------------------------------------------------------
def test_decode_runtime_refuses_shared_written_page():
    cfg = _config()
    rt = DecodeRuntime(cfg, PagedKVCache.allocate(cfg, POOL, "cpu"), "cpu", check_forks=True)
    q = torch.randn((3, HQ, D))
    lens = torch.tensor([20, 18, 5], dtype=torch.int32)
    table = torch.tensor([[0, 1], [0, 2], [9, 9]], dtype=torch.int32)    # page 0: full shared prefix
    out = rt.decode(q, table, lens)
    assert _rel(out, _reference(rt.kv_cache, q, table, lens)) < 1e-4
    forked = _set(table, (1, 1), 1)                                      # rows 0, 1 write into page 1
    with pytest.raises(ValueError, match=r"rows \[0, 1\] share page 1, which row 0 writes"):
        rt.decode(q, forked, lens)
    prefix = torch.tensor([[0, 1, 6], [2, 3, 7], [1, 4, 8]], dtype=torch.int32)
    lens2 = torch.tensor([40, 20, 5], dtype=torch.int32)   # row 2 writes page 1, row 0's full prefix
    with pytest.raises(ValueError, match=r"rows \[0, 2\] share page 1, which row 2 writes"):
        rt.decode(q, prefix, lens2)
    # default (check_forks=False): this runtime only reads the cache, the caller owns the contract
    plain = DecodeRuntime(cfg, rt.kv_cache, "cpu")
    assert _rel(plain.decode(q, forked, lens), _reference(rt.kv_cache, q, forked, lens)) < 1e-4


@pytest.mark.parametrize("k", [1, 2])
def test_model_decode_refuses_shared_written_page(k):
    mrt = _mrt(k)
    tokens = torch.tensor([3, 7])
    lens = torch.tensor([20, 18], dtype=torch.int32)
    shared_prefix = torch.tensor([[0, 1, 5], [0, 2, 6]], dtype=torch.int32)  # page 0 read-only, shared
    mrt.decode(tokens, shared_prefix, lens)
    before = _caches(mrt)
    forked = torch.tensor([[0, 1, 5], [0, 1, 6]], dtype=torch.int32)         # both write page 1
    with pytest.raises(ValueError, match=r"rows \[0, 1\] share page 1, which row 0 writes"):
        mrt.decode(tokens, forked, lens)
    assert all(torch.equal(a, b) for a, b in zip(_caches(mrt), before))


def test_model_decode_checks_every_page_the_k_steps_write():
    lens = torch.tensor([16, 20], dtype=torch.int32)       # row 0's 2nd step goes into column 1
    table = torch.tensor([[5, 7], [7, 8]], dtype=torch.int32)  # ... page 7: row 1's full prefix
    _mrt(1).decode(torch.tensor([3, 7]), table, lens)      # one step: row 0 writes page 5 only
    with pytest.raises(ValueError, match=r"rows \[0, 1\] share page 7, which row 0 writes"):
        _mrt(2).decode(torch.tensor([3, 7]), table, lens)


# ---- concurrent use ----------------------------------------------------------------------------
def _race(pause_in_step, call_a, call_b):
    """Run call_a in thread A and call_b in thread B, with B starting while A is inside its step
    (pause_in_step waits there up to 1 s for B to finish). Returns (result_a, result_b)."""
    in_step, b_done = threading.Event(), threading.Event()
    results, errors = {}, []

    def pause():
        if threading.current_thread().name == "A" and not in_step.is_set():
            in_step.set()
            b_done.wait(timeout=1.0)   # with the lock B cannot finish: A resumes after 1 s

    def run(name, call, before=None):
        try:
            if before:
                before()
            results[name] = call()
        except BaseException as e:  # surfaced below
            errors.append(e)
        finally:
            if name == "B":
                b_done.set()

    pause_in_step(pause)
    a = threading.Thread(target=run, name="A", args=("A", call_a))
    b = threading.Thread(target=run, name="B", args=("B", call_b, lambda: in_step.wait(5)))
    a.start(), b.start()
    a.join(30), b.join(30)
    if errors:
        raise errors[0]
    return results["A"], results["B"]


def test_decode_runtime_threads_serialise(monkeypatch):
    cfg = _config()
    rt = DecodeRuntime(cfg, PagedKVCache.allocate(cfg, POOL, "cpu"), "cpu")
    gen = torch.Generator().manual_seed(4)
    qa, ta, la = _batch(3, gen, [100, 7, 33])
    qb, tb, lb = _batch(3, gen, [16, 128, 1])
    run = rt.backend.run

    def hook(pause):
        def paused_run(view):
            pause()
            run(view)
        monkeypatch.setattr(rt.backend, "run", paused_run)

    out_a, out_b = torch.empty_like(qa), torch.empty_like(qb)
    got_a, got_b = _race(hook, lambda: rt.decode(qa, ta, la, out=out_a),
                         lambda: rt.decode(qb, tb, lb, out=out_b))
    assert got_a is out_a and got_b is out_b
    assert _rel(out_a, _reference(rt.kv_cache, qa, ta, la)) < 1e-4
    assert _rel(out_b, _reference(rt.kv_cache, qb, tb, lb)) < 1e-4


def test_decode_runtime_lock_held_while_reading_view():
    cfg = _config()
    rt = DecodeRuntime(cfg, PagedKVCache.allocate(cfg, POOL, "cpu"), "cpu")
    gen = torch.Generator().manual_seed(5)
    batches = [_batch(2, gen, [int(x) for x in torch.randint(1, CTX + 1, (2,), generator=gen)])
               for _ in range(8)]
    errors = []

    def worker(mine):
        try:
            for q, t, s in mine:
                with rt.lock:
                    out = rt.decode(q, t, s).clone()
                assert _rel(out, _reference(rt.kv_cache, q, t, s)) < 1e-4
        except BaseException as e:  # surfaced below
            errors.append(e)
    threads = [threading.Thread(target=worker, args=(batches[i::2],)) for i in range(2)]
    [t.start() for t in threads], [t.join(60) for t in threads]
    assert not errors, errors


def test_model_runtime_threads_serialise(monkeypatch):
    mrt, solo = _mrt(2), _mrt(2)
    ta = torch.tensor([[0, 1, 2], [3, 4, 5]], dtype=torch.int32)
    tb = torch.tensor([[10, 11, 12], [13, 14, 15]], dtype=torch.int32)
    la, lb = torch.tensor([30, 9], dtype=torch.int32), torch.tensor([2, 40], dtype=torch.int32)
    xa, xb = torch.tensor([5, 9]), torch.tensor([60, 1])
    want_a = solo.decode(xa, ta, la).clone()
    want_b = solo.decode(xb, tb, lb).clone()
    assert not torch.equal(want_a, want_b)   # a mix-up would show
    step = mrt.model.decode_step

    def hook(pause):
        def paused_step(ctx, tokens):
            pause()
            return step(ctx, tokens)
        monkeypatch.setattr(mrt.model, "decode_step", paused_step)

    out_a, out_b = torch.empty_like(want_a), torch.empty_like(want_b)
    _race(hook, lambda: mrt.decode(xa, ta, la, out=out_a), lambda: mrt.decode(xb, tb, lb, out=out_b))
    assert torch.equal(out_a, want_a) and torch.equal(out_b, want_b)
    assert all(torch.equal(a, b) for a, b in zip(_caches(mrt), _caches(solo)))


def test_out_argument_is_checked():
    cfg = _config()
    rt = DecodeRuntime(cfg, PagedKVCache.allocate(cfg, POOL, "cpu"), "cpu")
    q, t, s = _batch(2, torch.Generator().manual_seed(6), [3, 4])
    with pytest.raises(ValueError, match=r"out: expected a \[2, 4, 64\] torch.float32"):
        rt.decode(q, t, s, out=torch.empty(3, HQ, D))
    with pytest.raises(ValueError, match=r"out: expected \[1, 2\] torch.int64"):
        _mrt().decode(torch.tensor([1, 2]), t, s, out=torch.empty(1, 2))


# ---- guards the suite must notice --------------------------------------------------------------
def test_decode_resets_stale_block_table_columns():
    """A narrow table leaves -1 (an invalid id the device guard flags) past its width, never the
    previous batch's page ids (on a GPU with device seq_lens they would be read silently: see
    test_gpu.py::test_stale_block_table_columns_are_flagged)."""
    cfg = _config()
    rt = DecodeRuntime(cfg, PagedKVCache.allocate(cfg, POOL, "cpu"), "cpu")
    mrt = _mrt()
    gen = torch.Generator().manual_seed(7)
    q, wide, lens = _batch(4, gen, [128, 128, 128, 128])
    rt.decode(q, wide, lens)
    mrt.decode(torch.tensor([1, 2, 3, 4]), wide, lens)
    narrow, short = wide[:3, :2], torch.tensor([20, 32, 1], dtype=torch.int32)
    rt.decode(q[:3], narrow, short)
    mrt.decode(torch.tensor([1, 2, 3]), narrow, short)
    for static in (rt.buffers.block_table, mrt.buffers.block_table):
        assert torch.equal(static[:3, :2], narrow)
        assert (static[:3, 2:] == -1).all()


def test_kv_slot_overflow_flag_is_set_by_the_append_kernel():
    """Row 0's new token falls past its 2-column table: the kernel must flag it and write nothing
    (without the check it would read row 1's first page id and overwrite that page)."""
    mrt = _mrt()
    cache = mrt.kv_caches[0]
    table = torch.tensor([[4, 5], [6, 7]], dtype=torch.int32)
    lens = torch.tensor([2 * PAGE + 1, 0], dtype=torch.int32)      # slot 32: column 2 of 2
    before = (cache.k.clone(), cache.v.clone())
    k, v = torch.randn(2, HKV, D), torch.randn(2, HKV, D)
    error = mrt.buffers.device_error
    assert int(error) == 0
    append_kv(k, v, cache, table, lens, error)
    assert int(error) & ERR_KV_SLOT
    assert torch.equal(cache.k, before[0]) and torch.equal(cache.v, before[1])
    with pytest.raises(DeviceInputError, match="K/V slot fell past the block table's width"):
        mrt.check_device_errors()
    assert int(error) == 0                                          # read and cleared
