"""Tensor parallelism on CPU (gloo, two spawned processes): TP=2 logits and greedy tokens equal
TP=1's (float32), each rank loads only its slices, bad TP sizes are refused, a dead rank ends
the run with an error. Each multi-process test has a hard timeout (launch's run_timeout_s)."""
from __future__ import annotations

import os
import signal
import time

import pytest
import torch

import _checkpoints
from graphrt import RuntimeConfig
from graphrt.checkpoint.loader import load_checkpoint
from graphrt.checkpoint.decoder import build_model
from graphrt.model.runtime import ModelRuntime
from graphrt.model.llama import LlamaDecoder
from graphrt.parallel import TensorParallel, check_tp_size, shard_runtime_config, shard_spec, shard_weights
from graphrt.parallel.driver import TPDriver, follow, rank_runtime
from graphrt.parallel.launch import RankError, launch

pytest.importorskip("safetensors")
pytest.importorskip("transformers")
K, STEPS = 2, 3          # K tokens per decode call, STEPS calls


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return _checkpoints.write(tmp_path_factory, "tp", shape="tiny-gqa", dtype="float32", seed=3)


@pytest.fixture(scope="module")
def ckpt_qwen2(tmp_path_factory):  # qkv biases, tied embeddings
    mod = _checkpoints.make_checkpoint_module()
    saved = mod.SHAPES["tiny-gqa"]
    mod.SHAPES["tiny-gqa"] = saved[:7] + (True,) + saved[8:]
    return mod.write_checkpoint(tmp_path_factory.mktemp("tpq"), "tiny-gqa", arch="qwen2",
                                dtype="float32", seed=4)


def _config(spec):
    return RuntimeConfig(num_qo_heads=spec.num_heads, num_kv_heads=spec.num_kv_heads,
                         head_dim=spec.head_dim, page_size=16, max_context_len=128, buckets=[1, 2, 4],
                         dtype="float32", backend="torch-splitkv", kv_pool_pages=48)


def _inputs():
    gen = torch.Generator().manual_seed(7)
    prompts = [torch.randint(0, 384, (n,), generator=gen) for n in (5, 19, 33)]
    table = torch.randperm(48, generator=gen)[:24].to(torch.int32).view(3, 8)
    return prompts, table


def _script(run, runtime=None):
    """Prefill, then STEPS K-step greedy decode calls through `run` (a ModelRuntime or a
    TPDriver, keep_logits=True): (prefill logits [n, V], tokens [STEPS*K, n], the last step's
    logits of every call [STEPS, n, V])."""
    prompts, table = _inputs()
    logits = run.prefill(prompts, table)
    tokens = logits.argmax(-1)
    seq = torch.tensor([p.numel() + 1 for p in prompts], dtype=torch.int32)
    out, last = [], []
    for _ in range(STEPS):
        step = run.decode(tokens, table, seq).clone()        # [K, n]
        out.append(step)
        last.append((runtime or run).last_logits(len(prompts)).clone())   # read on rank 0
        tokens, seq = step[-1].clone(), seq + K
    return logits, torch.cat(out), torch.stack(last)


def _reference(path):
    ck = load_checkpoint(path)
    mrt = ModelRuntime(build_model(ck), _config(ck.spec), "cpu", steps_per_graph=K, keep_logits=True)
    return _script(mrt)


def _tp_job(ctx, path):
    """Every rank: its shard from disk, its runtime; rank 0 drives, returns its results and
    every rank's tokens."""
    ck = load_checkpoint(path, rank=ctx.rank, world_size=ctx.world_size)
    model = build_model(ck, tp=ctx.tp)
    mrt = rank_runtime(model, _config(ck.spec), ctx.device, steps_per_graph=K, keep_logits=True)
    seen = []
    if ctx.rank == 0:
        drv = TPDriver(mrt, ctx.control)
        drv.capture()
        mine = _script(drv, drv.runtime)
        drv.shutdown()
        seen = [mine[1]]
    else:
        follow(mrt, ctx.control, on_result=lambda name, out: seen.append(out.clone())
               if name == "decode" else None)
    every = [None] * ctx.world_size
    torch.distributed.all_gather_object(every, torch.cat(seen), group=ctx.control)
    return (*mine, every) if ctx.rank == 0 else None


@pytest.mark.parametrize("which", ["ckpt", "ckpt_qwen2"])
def test_tp2_matches_tp1(which, request):
    path = request.getfixturevalue(which)
    ref_logits, ref_tokens, ref_last = _reference(path)
    logits, tokens, last, every = launch(_tp_job, 2, args=(str(path),), timeout_s=60, run_timeout_s=120)
    torch.testing.assert_close(logits, ref_logits, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(last, ref_last, rtol=1e-4, atol=1e-5)
    assert torch.equal(tokens, ref_tokens)
    assert all(torch.equal(t, ref_tokens) for t in every)     # identical tokens on every rank


def test_shard_weights_match_loader_slices(ckpt):
    full = load_checkpoint(ckpt)
    spec = full.spec
    fused = build_model(full).weights
    for rank in range(2):
        part = load_checkpoint(ckpt, rank=rank, world_size=2)
        ours = build_model(part, tp=TensorParallel(rank, 2, None)).weights
        want = shard_weights(spec, fused, rank, 2)
        for a, b in zip(ours.layers, want.layers):
            for name in ("qkv", "o", "gate_up", "down", "input_norm"):
                assert torch.equal(getattr(a, name), getattr(b, name)), name
        assert torch.equal(ours.embed, want.embed) and torch.equal(ours.lm_head, want.lm_head)
        # independent of shard_weights: rank's q heads are rows of HF q_proj
        d, lq = spec.head_dim, spec.num_heads // 2 * spec.head_dim
        assert torch.equal(ours.layers[0].qkv[:lq], fused.layers[0].qkv[rank * lq:(rank + 1) * lq])
        assert torch.equal(ours.layers[1].o, fused.layers[1].o[:, rank * lq:(rank + 1) * lq])
        assert d * spec.num_heads == 2 * lq


def test_sharded_loading_reads_only_rank_slices(ckpt, monkeypatch):
    import safetensors
    real = safetensors.safe_open
    counts = {"full": 0, "slice": 0}

    class Counting:
        def __init__(self, *a, **kw):
            self.h = real(*a, **kw)

        def __enter__(self):
            self.h.__enter__()
            return self

        def __exit__(self, *exc):
            return self.h.__exit__(*exc)

        def keys(self):
            return self.h.keys()

        def get_tensor(self, name):
            t = self.h.get_tensor(name)
            counts["full"] += t.numel()
            return t

        def get_slice(self, name):
            sl = self.h.get_slice(name)
            outer = self

            class S:
                def get_shape(self):
                    return sl.get_shape()

                def get_dtype(self):
                    return sl.get_dtype()

                def __getitem__(self, idx):
                    t = sl[idx]
                    counts["slice"] += t.numel()
                    return t
            return S()

    monkeypatch.setattr(safetensors, "safe_open", Counting)
    spec = load_checkpoint(ckpt).spec
    total = counts["full"] + counts["slice"]
    counts.update(full=0, slice=0)
    part = load_checkpoint(ckpt, rank=1, world_size=2)
    local = sum(t.numel() for layer in part.weights["layers"] for t in layer.values() if t is not None)
    local += part.weights["embed"].numel() + part.weights["final_norm"].numel()
    local += 0 if spec.tie_word_embeddings else part.weights["lm_head"].numel()
    assert counts["full"] + counts["slice"] == local          # exactly the rank's elements
    replicated = spec.num_layers * 2 * spec.hidden_size + spec.hidden_size   # norms
    assert counts["full"] == replicated                        # only norms read whole
    assert local < 0.55 * total and part.nbytes == local * 4


def test_bad_tp_sizes_refused(ckpt):
    spec = load_checkpoint(ckpt).spec                           # 4 heads, 2 KV heads
    with pytest.raises(ValueError, match=r"tensor_parallel: 4 does not divide num_kv_heads=2"):
        check_tp_size(spec, 4)
    with pytest.raises(ValueError, match=r"3 does not divide num_kv_heads=2"):
        load_checkpoint(ckpt, rank=0, world_size=3)
    with pytest.raises(ValueError, match=r"rank: 2 is not in \[0, world_size=2\)"):
        load_checkpoint(ckpt, rank=2, world_size=2)
    with pytest.raises(ValueError, match=r"tensor_parallel: 3 does not divide num_qo_heads=4"):
        shard_runtime_config(_config(spec), 3)
    with pytest.raises(ValueError, match=r"tensor_parallel: expected an int >= 1"):
        shard_spec(spec, 0)
    full = load_checkpoint(ckpt)
    with pytest.raises(ValueError, match=r"world_size 2 does not match the checkpoint's shard"):
        build_model(full, tp=TensorParallel(0, 2, None))
    part = load_checkpoint(ckpt, rank=0, world_size=2)
    model = build_model(part, tp=TensorParallel(0, 2, None))
    with pytest.raises(ValueError, match=r"this tensor-parallel rank's heads"):
        ModelRuntime(model, _config(spec), "cpu")
    with pytest.raises(ValueError, match=r"shape \(384, 128\), expected \(192, 128\)"):
        LlamaDecoder(spec, build_model(full).weights, tp=TensorParallel(0, 2, None))


def _dying_job(ctx, path):
    ck = load_checkpoint(path, rank=ctx.rank, world_size=ctx.world_size)
    mrt = rank_runtime(build_model(ck, tp=ctx.tp), _config(ck.spec), ctx.device, steps_per_graph=K)
    if ctx.rank == 1:
        follow(mrt, ctx.control, on_result=lambda name, out: os.kill(os.getpid(), signal.SIGKILL))
    drv = TPDriver(mrt, ctx.control)
    prompts, table = _inputs()
    drv.prefill(prompts, table)                  # rank 1 dies after this call
    seq = torch.tensor([p.numel() + 1 for p in prompts], dtype=torch.int32)
    while True:                                  # would block in a collective without the watchdog
        drv.decode(torch.zeros(3, dtype=torch.int64), table, seq)


def test_killed_rank_ends_the_run(ckpt):
    t0 = time.monotonic()
    with pytest.raises(RankError, match=r"rank 1 died \(exit code -9\)"):
        launch(_dying_job, 2, args=(str(ckpt),), timeout_s=20, run_timeout_s=90)
    assert time.monotonic() - t0 < 60


def test_random_weights_shards_are_slices_of_one_model():
    import dataclasses
    from graphrt.model.spec import LlamaSpec
    from graphrt.parallel.random_weights import random_weights
    spec = LlamaSpec(vocab_size=64, hidden_size=32, intermediate_size=48, num_layers=2, num_heads=4,
                     num_kv_heads=2, head_dim=8, rms_norm_eps=1e-5, rope_theta=1e4,
                     tie_word_embeddings=False, attention_bias=True)
    full = random_weights(spec, dtype=torch.float32, device="cpu", seed=1)
    for rank in range(2):
        got = random_weights(spec, dtype=torch.float32, device="cpu", seed=1, rank=rank, world_size=2)
        want = shard_weights(spec, full, rank, 2)
        for a, b in zip(got.layers, want.layers):
            for f in dataclasses.fields(a):
                x, y = getattr(a, f.name), getattr(b, f.name)
                assert (x is None and y is None) or torch.equal(x, y), f.name
        assert torch.equal(got.embed, want.embed) and torch.equal(got.lm_head, want.lm_head)
        assert got.layers[0].qkv.shape == (2 * 8 + 2 * 8, 32)     # 2 q heads + 1 k + 1 v head


def test_llm_tensor_parallel_matches_single_process(ckpt):
    from graphrt.engine import LLM, SamplingParams
    kw = dict(device="cpu", max_batch=4, steps_per_graph=2, max_model_len=64)
    prompts = ["Hello world", [5, 6, 7, 8, 9], "the graph token"]
    params = [SamplingParams(max_tokens=6, temperature=0.0), SamplingParams(max_tokens=6, temperature=0.0),
              SamplingParams(max_tokens=6, temperature=0.9, seed=5)]
    ref = [o.token_ids for o in LLM(ckpt, **kw).generate(prompts, params)]
    with pytest.raises(ValueError, match=r"tensor_parallel: 4 does not divide num_kv_heads=2"):
        LLM(ckpt, tensor_parallel=4, **kw)
    llm = LLM(ckpt, tensor_parallel=2, tp_timeout_s=30, **kw)
    try:
        got = [o.token_ids for o in llm.generate(prompts, params)]
        assert got == ref and all(len(t) == 6 for t in got)
        assert llm.runtime.runtime.config.num_kv_heads == 1          # rank 0 holds one KV head
    finally:
        llm.shutdown()
    assert all(p.exitcode == 0 for p in llm._workers.procs)


def test_llm_dead_worker_raises_rank_error(ckpt):
    from graphrt.engine import LLM, SamplingParams
    llm = LLM(ckpt, device="cpu", tensor_parallel=2, tp_timeout_s=20, max_batch=2, steps_per_graph=2,
              max_model_len=64)
    try:
        os.kill(llm._workers.procs[0].pid, signal.SIGKILL)
        llm._workers.procs[0].join(10)
        time.sleep(0.5)                                  # the watchdog polls every 0.2 s
        t0 = time.monotonic()
        with pytest.raises(RankError, match=r"rank 1 died \(exit code -9\)"):
            llm.generate("Hello", SamplingParams(max_tokens=4, temperature=0.0))
        assert time.monotonic() - t0 < 20
    finally:
        llm.shutdown()


def test_serve_tensor_parallel_flag_refuses_bad_size(ckpt, capsys):
    pytest.importorskip("fastapi")
    from graphrt.serve.cli import build_parser, main
    assert build_parser().parse_args(["--model", "m", "--tensor-parallel", "2"]).tensor_parallel == 2
    with pytest.raises(SystemExit) as e:
        main(["--model", str(ckpt), "--device", "cpu", "--tensor-parallel", "3"])
    assert e.value.code == 2
    assert "tensor_parallel: 3 does not divide num_kv_heads=2" in capsys.readouterr().err
