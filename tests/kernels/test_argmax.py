"""kernels/argmax.greedy_tokens under TRITON_INTERPRET=1 against torch.argmax: float32 / bf16 /
fp16 logits, vocabularies that do not fill the last chunk, equal maxima inside a chunk and in
different chunks (the lowest id wins, as torch's), rows of -inf, strided rows, batch sizes 1-9."""
from __future__ import annotations

import pytest
import torch

from graphrt.kernels.argmax import greedy_tokens


def _check(x, **kw):
    out = torch.full((x.shape[0],), -7, dtype=torch.int64)
    assert greedy_tokens(x, out, kernel=True, **kw) is out
    assert torch.equal(out, torch.argmax(x, dim=-1)), (out, torch.argmax(x, dim=-1))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("vocab,chunk", [(1000, 64), (4096, 4096), (5000, 4096), (37, 16)])
def test_matches_torch_argmax(dtype, vocab, chunk):
    g = torch.Generator().manual_seed(vocab)
    for b in (1, 3, 9):
        _check(torch.randn(b, vocab, generator=g).to(dtype), chunk=chunk)


def test_ties_go_to_the_lowest_id_within_and_across_chunks():
    x = torch.randn(6, 1000, generator=torch.Generator().manual_seed(1)).to(torch.bfloat16)
    x[0, [5, 9]] = 50.0                      # one chunk
    x[1, [70, 10, 999]] = 50.0               # three chunks, the lowest id in the first
    x[2, [999, 640]] = 50.0                  # the last (partial) chunk and an earlier one
    x[3] = 1.0                               # the whole row equal: id 0
    x[4] = float("-inf")                     # all -inf: id 0, as torch.argmax
    x[5, :64] = float("-inf")                # the first chunk all -inf
    _check(x, chunk=64)


def test_strided_rows_and_empty_batch():
    base = torch.randn(4, 3, 300, generator=torch.Generator().manual_seed(2))
    _check(base[:, -1], chunk=64)            # [4, 300] with row stride 900 (a verify's last position)
    assert greedy_tokens(torch.empty(0, 10), torch.empty(0, dtype=torch.int64), kernel=True).numel() == 0


def test_cpu_default_is_torch_and_bad_input_names_the_field():
    x = torch.randn(2, 50)
    out = torch.empty(2, dtype=torch.int64)
    assert torch.equal(greedy_tokens(x, out), torch.argmax(x, dim=-1))
    for bad, field, kw in ((x.t(), "logits", {}), (x[0], "logits", {}),
                           (x, "out", {"out": torch.empty(3, dtype=torch.int64)}),
                           (x, "out", {"out": torch.empty(2, dtype=torch.int32)}),
                           (x, "chunk", {"chunk": 48})):
        with pytest.raises(ValueError, match=field):
            greedy_tokens(bad, kw.pop("out", out), kernel=True, **kw)


@pytest.mark.gpu
def test_cuda_kernels_match_torch_and_capture():
    """On the GPU (the decode graphs' path): bf16 logits of a 128k vocabulary, planted ties
    across chunks, eager and replayed from a captured CUDA graph."""
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    g = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(16, 128256, generator=g, device="cuda").to(torch.bfloat16)
    x[3, [4095, 4096, 100000]] = 30.0
    x[7] = float("-inf")
    out = torch.empty(16, dtype=torch.int64, device="cuda")
    assert torch.equal(greedy_tokens(x, out), torch.argmax(x, dim=-1))
    out.zero_()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        greedy_tokens(x, out)
    x.copy_(torch.randn(16, 128256, generator=g, device="cuda").to(torch.bfloat16))
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, torch.argmax(x, dim=-1))
