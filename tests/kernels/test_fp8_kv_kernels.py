"""FP8 (e4m3) KV cache in the kernels: append_kv writes x / scale rounded to nearest even and
saturated at 448 (the same codes as torch's conversion, for any float values: the kernel rounds
in float32 before the cast, so the CPU interpreter agrees too), and the multi-query (verify) attention over FP8 pages equals
float32 attention over the dequantized pages (tight) and stays close to attention over the
float values before quantization (loose, printed). TRITON_INTERPRET=1 on CPU."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from graphrt.attention.kvcache import PagedKVCache
from graphrt.kernels.append_kv import append_kv
from graphrt.kernels.multiquery_attention import multiquery_attention
from graphrt.model.quant import FP8
from graphrt.model.quant.kv import dequantize_kv, kv_scales, quantize_kv

HQ, HKV, D, PAGE = 4, 2, 64, 16


def _shape(layout, pages):
    return (pages, PAGE, HKV, D) if layout == "NHD" else (pages, HKV, PAGE, D)


@pytest.mark.parametrize("layout", ["NHD", "HND"])
def test_append_kv_writes_scaled_e4m3(layout):
    g = torch.Generator().manual_seed(11)
    scale = kv_scales(0.03, 0.07)
    b = 3
    k = torch.randn(b, HKV, D, generator=g) * 3            # normals, subnormals, ties: all rounded
    v = torch.randn(b, HKV, D, generator=g) * 0.01          # mostly e4m3 subnormals after / 0.07
    k[0, 0, 0], v[1, 1, 5] = 1e4, -1e4                      # past 448 * scale: saturate, not NaN
    cache = PagedKVCache(torch.zeros(_shape(layout, 5), dtype=FP8), torch.zeros(_shape(layout, 5), dtype=FP8),
                         layout, scale)
    table = torch.tensor([[2, 0], [4, 1], [3, 0]], dtype=torch.int32)
    lens = torch.tensor([5, 18, 0], dtype=torch.int32)      # row 2: padding, writes nothing
    err = torch.zeros(1, dtype=torch.int32)
    append_kv(k, v, cache, table, lens, err, kv_scale=scale)
    assert int(err) == 0
    kc, vc = (cache.k, cache.v) if layout == "NHD" else (cache.k.transpose(1, 2), cache.v.transpose(1, 2))
    for r, (page, slot) in enumerate([(2, 4), (1, 1)]):
        for got, x, s in ((kc[page, slot], k[r], scale[0]), (vc[page, slot], v[r], scale[1])):
            want = (x / s).clamp(-448, 448).to(FP8)          # torch's rounding, saturated
            assert torch.equal(got.float(), want.float())
    assert float(kc[2, 4, 0, 0].float()) == 448.0 and float(vc[1, 1, 1, 5].float()) == -448.0
    assert int((cache.k.float() != 0).sum()) == 2 * HKV * D  # nothing else written
    with pytest.raises(ValueError, match="kv_scale: give a"):
        append_kv(k, v, cache, table, lens, err)


def _causal_reference(q, k_tok, v_tok, kv_lens):
    """float32 causal attention: q [B, Q, Hq, D], k_tok / v_tok [B, L, Hkv, D] per row."""
    b, nq, hq, d = q.shape
    out = torch.zeros(b, nq, hq, d)
    for r in range(b):
        n = int(kv_lens[r])
        kk = k_tok[r, :n].repeat_interleave(hq // HKV, 1).float()        # [n, Hq, D]
        vv = v_tok[r, :n].repeat_interleave(hq // HKV, 1).float()
        s = torch.einsum("qhd,khd->hqk", q[r].float(), kk) / d ** 0.5
        pos = torch.arange(n - nq, n)[:, None]
        s = s.masked_fill(torch.arange(n)[None, :] > pos, float("-inf"))
        out[r] = torch.einsum("hqk,khd->qhd", torch.softmax(s, -1), vv)
    return out


@pytest.mark.parametrize("layout,splits", [("NHD", 1), ("HND", 2)])
def test_multiquery_attention_reads_fp8_pages(layout, splits):
    g = torch.Generator().manual_seed(7)
    b, nq, pages = 2, 3, 8
    table = torch.tensor([[5, 1, 7, 0], [2, 6, 3, 4]], dtype=torch.int32)
    kv_lens = torch.tensor([20, 37], dtype=torch.int32)
    k_tok = torch.randn(b, 4 * PAGE, HKV, D, generator=g) * 2.0       # float values per token
    v_tok = torch.randn(b, 4 * PAGE, HKV, D, generator=g)
    scale = kv_scales(float(k_tok.abs().max()) / 448, float(v_tok.abs().max()) / 448)
    kf = torch.zeros(pages, PAGE, HKV, D)
    vf = torch.zeros(pages, PAGE, HKV, D)
    for r in range(b):
        kf[table[r].long()] = k_tok[r].view(4, PAGE, HKV, D)
        vf[table[r].long()] = v_tok[r].view(4, PAGE, HKV, D)
    k8, v8 = quantize_kv(kf, scale[0]), quantize_kv(vf, scale[1])
    if layout == "HND":
        k8, v8 = k8.transpose(1, 2).contiguous(), v8.transpose(1, 2).contiguous()
    cache = PagedKVCache(k8, v8, layout, scale)
    q = torch.randn(b, nq, HQ, D, generator=g)
    out = multiquery_attention(q, cache, table, kv_lens, splits=splits)
    nhd8 = (k8, v8) if layout == "NHD" else (k8.transpose(1, 2), v8.transpose(1, 2))
    deq = [dequantize_kv(x, s)[table.long()].flatten(1, 2) for x, s in zip(nhd8, scale)]  # [B, L, Hkv, D]
    tight = _causal_reference(q, deq[0], deq[1], kv_lens)
    torch.testing.assert_close(out, tight, rtol=1e-4, atol=1e-5)
    loose = _causal_reference(q, k_tok, v_tok, kv_lens)
    rel = float((out - loose).norm() / loose.norm())
    print(f"multiquery FP8 KV vs float KV ({layout}, splits={splits}): rel. error {rel:.4f}")
    assert rel < 0.08
    unscaled = SimpleNamespace(as_tuple=lambda: (k8, v8), layout=layout)   # FP8 pages, no scale
    with pytest.raises(ValueError, match="float8_e4m3fn pages need"):
        multiquery_attention(q, unscaled, table, kv_lens)
