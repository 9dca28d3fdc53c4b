"""The decoder's hidden-state recording (record= / hidden_out=) on CPU float32, against HF
transformers' hidden states: verify_step (rows b * Q + j) and prefill (unchunked and chunked
through ModelRuntime), id L = the final norm's input; off, it adds no op at all; bad input."""
from __future__ import annotations

from collections import Counter

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from graphrt import RuntimeConfig
from graphrt.attention.kvcache import PagedKVCache
from graphrt.model import LlamaDecoder
from graphrt.model.runtime import ModelRuntime

transformers = pytest.importorskip("transformers")
H, L, VOCAB, POOL = 128, 2, 64, 48


def runtime_config():
    return RuntimeConfig(num_qo_heads=4, num_kv_heads=2, head_dim=64, page_size=16, max_context_len=128,
                         buckets=[1, 2, 4], dtype="float32", backend="torch", kv_pool_pages=POOL)


def page_table():
    """[3, 8] int32: 24 distinct pages of the pool in random order."""
    return torch.randperm(POOL, generator=torch.Generator().manual_seed(2))[:24].to(torch.int32).view(3, 8)


@pytest.fixture(scope="module")
def hf():
    torch.manual_seed(3)
    cfg = transformers.LlamaConfig(vocab_size=VOCAB, hidden_size=H, intermediate_size=128, head_dim=64,
                                   num_hidden_layers=L, num_attention_heads=4, num_key_value_heads=2,
                                   max_position_embeddings=256, tie_word_embeddings=False)
    return transformers.LlamaForCausalLM(cfg).eval()


def _hf_states(hf, tokens: list[int]) -> torch.Tensor:
    """[T, (L + 1) H]: HF's stream entering layers 0 .. L - 1, then the final norm's input."""
    seen = []
    hook = hf.model.norm.register_forward_pre_hook(lambda m, args: seen.append(args[0]))
    with torch.no_grad():
        out = hf(torch.tensor([tokens]), output_hidden_states=True)
    hook.remove()
    return torch.cat([out.hidden_states[i][0] for i in range(L)] + [seen[0][0]], -1)


def _caches():
    return [PagedKVCache.allocate(runtime_config(), POOL, "cpu", seed=5 + i) for i in range(L)]


def _verify(model, tokens, **kw):
    b = tokens.shape[0]
    return model.verify_step(tokens, torch.zeros(b, dtype=torch.int32), _caches(), page_table(),
                             torch.zeros(1, dtype=torch.int32), **kw)


def test_verify_records_every_row_like_hf(hf):
    model = LlamaDecoder.from_hf(hf)
    tokens = torch.randint(0, VOCAB, (2, 4), generator=torch.Generator().manual_seed(1))
    out = torch.full((8, 3 * H), float("nan"))
    logits = _verify(model, tokens, record=(0, 1, 2), hidden_out=out)
    for b in range(2):
        want = _hf_states(hf, tokens[b].tolist())
        assert torch.allclose(out.view(2, 4, -1)[b], want, atol=2e-4, rtol=1e-4)
    part = torch.zeros(8, 2 * H)
    _verify(model, tokens, record=(1, 2), hidden_out=part)           # a subset: column blocks in order
    assert torch.equal(part, out[:, H:])
    assert torch.equal(_verify(model, tokens), logits)               # recording changes no logit


class _Ops(TorchDispatchMode):
    """aten ops issued, and Triton launches by kernel name; the interpreter's own copies of a
    kernel's arguments (on CPU) are not counted: they are no op of the model's."""

    def __init__(self):
        super().__init__()
        self.ops = Counter()
        self.quiet = False

    def __enter__(self):
        import triton.runtime.interpreter as interp
        run, outer = interp.InterpretedFunction.run, self

        def counted(fn, *a, **kw):
            outer.ops["triton." + fn.fn.__name__] += 1
            outer.quiet = True
            try:
                return run(fn, *a, **kw)
            finally:
                outer.quiet = False
        self._restore = (interp.InterpretedFunction, run)
        interp.InterpretedFunction.run = counted
        return super().__enter__()

    def __exit__(self, *exc):
        cls, run = self._restore
        cls.run = run
        return super().__exit__(*exc)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if not self.quiet:
            self.ops[str(func.overloadpacket)] += 1
        return func(*args, **(kwargs or {}))


def test_recording_off_adds_no_op(hf):
    """Off: the same ops, op for op. On: no launch more (the RMSNorm that forms a recorded state
    stores it too), only the column views of hidden_out."""
    model = LlamaDecoder.from_hf(hf, kernels="triton")                # the kernels it counts
    tokens = torch.randint(0, VOCAB, (2, 3), generator=torch.Generator().manual_seed(2))
    counts = []
    for kw in ({}, {"record": ()}, {"record": (0, 2), "hidden_out": torch.zeros(6, 2 * H)}):
        with _Ops() as m:
            _verify(model, tokens, **kw)
        counts.append(m.ops)
    assert counts[0] == counts[1]                                     # off: the same ops, op for op
    assert counts[0]["triton._rms_norm_kernel"] == 2 * L + 1          # the loop's norms were counted
    extra = counts[2] - counts[0]
    assert set(extra) <= {"aten.slice"} and not counts[0] - counts[2], extra


@pytest.mark.parametrize("chunk", [None, 4])
def test_prefill_records_every_prompt_token(hf, chunk):
    prompts = [torch.randint(0, VOCAB, (n,), generator=torch.Generator().manual_seed(n)) for n in (5, 2, 6)]
    out = torch.zeros(13, 3 * H)
    table = page_table()
    if chunk is None:                                                 # one pass, torch attention
        logits = LlamaDecoder.from_hf(hf).prefill(prompts, _caches(), table, record=(0, 1, 2), hidden_out=out)
    else:                                                             # chunks of 4 tokens, ragged
        mrt = ModelRuntime(LlamaDecoder.from_hf(hf), runtime_config(), "cpu", prefill_chunk_tokens=chunk)
        logits = mrt.prefill(prompts, table, record=(0, 1, 2), hidden_out=out)
    start = 0
    for p in prompts:
        want = _hf_states(hf, p.tolist())
        assert torch.allclose(out[start:start + p.numel()], want, atol=2e-4, rtol=1e-4)
        start += p.numel()
    assert logits.shape == (3, VOCAB)


def test_bad_record_arguments_name_the_field(hf):
    model = LlamaDecoder.from_hf(hf)
    tokens = torch.zeros((1, 2), dtype=torch.int64)
    with pytest.raises(ValueError, match="record: expected distinct ascending ints in \\[0, 2\\]"):
        _verify(model, tokens, record=(2, 1), hidden_out=torch.zeros(2, 2 * H))
    with pytest.raises(ValueError, match="record"):
        _verify(model, tokens, record=(0, 3), hidden_out=torch.zeros(2, 2 * H))
    with pytest.raises(ValueError, match="hidden_out: expected \\[2, 256\\] torch.float32"):
        _verify(model, tokens, record=(0, 1), hidden_out=torch.zeros(3, 2 * H))
    with pytest.raises(ValueError, match="hidden_out: given without record"):
        _verify(model, tokens, hidden_out=torch.zeros(2, H))
    for bad in (-1, 1.5, True):                                      # verify_step(offset=): a host int >= 0
        with pytest.raises(ValueError, match="^offset: "):
            _verify(model, tokens, offset=bad)


def test_bad_host_table_names_the_field(hf):
    """LlamaDecoder.prefill(host_table=): the block table's copy on the host (checks and plans read
    it there instead of reading the device); a wrong shape, dtype or device is refused by name,
    and a right one gives the same logits as reading block_table itself."""
    model = LlamaDecoder.from_hf(hf)
    prompts = [torch.arange(5) % VOCAB, torch.arange(3) % VOCAB]
    table = page_table()[:2]
    ref = model.prefill(prompts, _caches(), table)
    assert torch.equal(model.prefill(prompts, _caches(), table, host_table=table.clone()), ref)
    for bad in (table[:1].clone(), table.long(), table.tolist(), table.T.contiguous()):
        with pytest.raises(ValueError, match="host_table"):
            model.prefill(prompts, _caches(), table, host_table=bad)
