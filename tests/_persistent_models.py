"""Random bf16 decoders at Llama-3.2-1B / 3.1-8B layer shapes for the persistent step's GPU tests
(tests/kernels/test_persistent_step_gpu.py, tests/model/test_persistent_gpu.py): built straight
into the fused layout on the GPU, any layer count and vocabulary; their KV caches, steps, the
grid comparison and a captured ModelRuntime."""
from __future__ import annotations

import torch

from graphrt import RuntimeConfig
from graphrt.attention.kvcache import PagedKVCache
from graphrt.kernels.persistent import Geometry, PersistentStep, Tiles
from graphrt.model import LlamaDecoder, LlamaSpec
from graphrt.model.runtime import ModelRuntime
from graphrt.model.weights import LayerWeights, ModelWeights

PAGE, MAX_LEN = 16, 2048        # the GPU tests' KV page size and longest context
SHAPES = {"1b": (2048, 8192, 32, 8, 64, True), "8b": (4096, 14336, 32, 8, 128, False)}


def random_model(name: str, layers: int = 2, vocab: int = 128256) -> LlamaDecoder:
    h, inter, hq, hkv, d, tied = SHAPES[name]
    spec = LlamaSpec(vocab_size=vocab, hidden_size=h, intermediate_size=inter, num_layers=layers, num_heads=hq,
                     num_kv_heads=hkv, head_dim=d, rms_norm_eps=1e-5, rope_theta=500000.0,
                     tie_word_embeddings=tied, attention_bias=False, max_position_embeddings=4096)
    gen = torch.Generator(device="cuda").manual_seed(0)

    def rnd(*shape, scale=0.02):
        return torch.randn(shape, generator=gen, device="cuda", dtype=torch.bfloat16) * scale

    def norm(n):
        return 1 + rnd(n, scale=0.1)
    qkv = (hq + 2 * hkv) * d
    layer_w = [LayerWeights(norm(h), norm(h), rnd(qkv, h), None, None, None, rnd(h, hq * d), rnd(2 * inter, h),
                            rnd(h, inter)) for _ in range(layers)]
    embed = rnd(vocab, h, scale=1.0)
    weights = ModelWeights(embed, norm(h), embed if tied else rnd(vocab, h), tuple(layer_w))
    return LlamaDecoder(spec, weights)


def geometry(model) -> Geometry:
    s = model.spec
    return Geometry(s.num_layers, s.hidden_size, s.intermediate_size, s.num_heads, s.num_kv_heads, s.head_dim,
                    s.vocab_size)


def assert_logits_close(got: torch.Tensor, want: torch.Tensor) -> torch.Tensor:
    """Two bf16 paths' logits [rows, vocab] (~N(0, 45^2) here: a unit-variance tied embedding):
    within two bf16 steps at each row's largest |logit| (near 200 over 128k logits, a step of 1.0;
    summing in another order or rounding the hidden state at another point moves every logit by a
    share of it: the H100 runs saw at most 1.0-1.31), and no drift (the mean difference at most 1%
    of the mean |logit|). Returns the per-row max |difference|."""
    a, b = want.float(), got.float()
    d = (a - b).abs()
    step = torch.exp2(torch.floor(torch.log2(a.abs().amax(dim=-1, keepdim=True))) - 7)
    assert bool((d <= 2 * step).all()), f"max |logit diff| {float(d.max()):.4f} over 2 bf16 steps"
    assert float(d.mean()) <= 0.01 * float(a.abs().mean()), f"mean |logit diff| {float(d.mean()):.4f}"
    return d.amax(dim=-1)


def gpu_caches(model, rows):
    """Random bf16 paged KV caches, one per layer, for `rows` rows of MAX_LEN positions (GPU)."""
    s = model.spec
    pages = rows * MAX_LEN // PAGE
    gen = torch.Generator(device="cuda").manual_seed(1)
    shape = (pages, PAGE, s.num_kv_heads, s.head_dim)
    return [PagedKVCache(torch.randn(shape, generator=gen, device="cuda").bfloat16(),
                         torch.randn(shape, generator=gen, device="cuda").bfloat16()) for _ in range(s.num_layers)]


def make_step(model, caches, rows, programs, **kw):
    """A PersistentStep of `programs` programs for `rows` rows (MAX_LEN context)."""
    return PersistentStep(model.weights, caches, model.cos_sin, geometry=geometry(model), rows=rows,
                          eps=model.spec.rms_norm_eps, programs=programs, max_context_len=MAX_LEN, **kw)


def compare_grids(model, rows, programs_a, programs_b, launches, prefetch, splits=4, stages=(0, 0)):
    """Launch two steps of `programs_a` / `programs_b` programs (GEMV weight rings of stages[0] /
    stages[1] chunks) on the same inputs, both with S = splits: equal bit for bit."""
    caches_one, caches_grid = gpu_caches(model, rows), gpu_caches(model, rows)
    one = make_step(model, caches_one, rows, programs_a, prefetch=prefetch, tiles=Tiles(splits=splits),
                    stages=stages[0])
    grid = make_step(model, caches_grid, rows, programs_b, prefetch=prefetch, tiles=Tiles(splits=splits),
                     stages=stages[1])
    table = torch.arange(rows * MAX_LEN // PAGE, dtype=torch.int32, device="cuda").view(rows, -1)
    gen = torch.Generator(device="cuda").manual_seed(rows)
    err = torch.zeros(1, dtype=torch.int32, device="cuda")
    out1, out2 = (torch.zeros(rows, dtype=torch.int64, device="cuda") for _ in range(2))
    for it in range(launches):                            # changing lengths, some padding rows
        lens = torch.randint(0, MAX_LEN - 1, (rows,), generator=gen, device="cuda", dtype=torch.int32)
        if it % 5 == 0:
            lens[0] = 0
        tokens = torch.randint(0, model.spec.vocab_size, (rows,), generator=gen, device="cuda")
        one.launch(tokens, lens, table, out1, err)
        grid.launch(tokens, lens, table, out2, err)
        torch.cuda.synchronize()
        live = lens > 0
        assert torch.equal(one.logits[live], grid.logits[live]), f"launch {it}: logits differ"
        assert torch.equal(out1[live], out2[live]), f"launch {it}: tokens differ"
        assert int(grid.counters.abs().sum()) == 0 and int(one.counters.abs().sum()) == 0 and int(err) == 0
    for c1, c2 in zip(caches_one, caches_grid):            # the appended K/V too
        assert torch.equal(c1.k, c2.k) and torch.equal(c1.v, c2.v)


def sms() -> int:
    """The GPU's SM count."""
    return torch.cuda.get_device_properties(0).multi_processor_count


def teacher_forced(seq, per, rows: int, blocks: int):
    """Both runtimes (the kernel sequence `seq`, the persistent step `per`) prefill the same random
    prompts of `rows` rows (seeded by rows), then decode `blocks` blocks on the sequence's tokens,
    lengths growing by one a block: yields (block, seq tokens, per tokens, seq logits, per logits),
    the logits float32 [rows, V] copies."""
    gen = torch.Generator().manual_seed(rows)
    lens0 = torch.randint(3, 1500, (rows,), generator=gen)
    prompts = [torch.randint(0, 128256, (int(n),), generator=gen) for n in lens0]
    table = torch.arange(rows * 128, dtype=torch.int32).view(rows, 128)
    for m in (seq, per):
        m.prefill(prompts, table)
    lens = lens0.to(torch.int32)
    tok = torch.randint(0, 128256, (rows,), generator=gen)
    for block in range(blocks):
        lens = lens + 1
        a = seq.decode(tok, table, lens).clone()
        b = per.decode(tok, table, lens).clone()
        yield block, a, b, seq.last_logits(rows).clone().float(), per.last_logits(rows).clone().float()
        tok = a[0]


def runtime(model, backend, k, buckets=(1, 4, 16)):
    """A captured bf16 ModelRuntime of a 1B-shaped model on the GPU (decode_backend `backend`, K = k),
    FlashInfer attention (with the default "reference" backend, eager only, capture()
    captures nothing and plans nothing: the persistent plan would be built at the first decode)."""
    cfg = RuntimeConfig(num_qo_heads=32, num_kv_heads=8, head_dim=64, page_size=16, max_context_len=2048,
                        buckets=list(buckets), dtype="bfloat16", backend="flashinfer",
                        kv_pool_pages=16 * 2048 // 16 + 1)
    mrt = ModelRuntime(model, cfg, "cuda", steps_per_graph=k, keep_logits=True, decode_backend=backend,
                       splitk=1)
    mrt.capture()
    return mrt
