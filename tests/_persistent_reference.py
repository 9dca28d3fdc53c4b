"""The float32 torch reference of the persistent decode step (no graphrt kernel), shared by its
CPU and GPU tests (tests/kernels/test_persistent_step.py, test_persistent_formats.py,
test_persistent_formats_gpu.py): random paged KV caches, one slot's K / V, and the step itself."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from graphrt.attention.kvcache import PagedKVCache

PAGE, PAGES = 16, 12


def paged_caches(model, layout="NHD", seed=1):
    s, g = model.spec, torch.Generator().manual_seed(seed)
    shape = (PAGES, PAGE, s.num_kv_heads, s.head_dim) if layout == "NHD" else (PAGES, s.num_kv_heads, PAGE, s.head_dim)
    return [PagedKVCache(torch.randn(shape, generator=g).to(model.dtype), torch.randn(shape, generator=g).to(model.dtype),
                         layout=layout) for _ in range(s.num_layers)]


def kv_at(cache, page, slot):
    """[Hkv, D] k and v of one slot."""
    if cache.layout == "NHD":
        return cache.k[page, slot], cache.v[page, slot]
    return cache.k[page, :, slot], cache.v[page, :, slot]


def reference_step(model, caches, table, lens, tokens):
    """float32 torch decoder step: logits [B, V] of the live rows, and each live row's new
    (k, v) per layer ([L][B] of ([Hkv, D], [Hkv, D])). Reads the caches' keys < seq - 1."""
    s, w = model.spec, model.weights
    eps, d, hq, hkv = s.rms_norm_eps, s.head_dim, s.num_heads, s.num_kv_heads
    cs = model.cos_sin.float()

    def rms(x, g):
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * g.float()

    def rope(x, pos):                                            # x [h, D]
        c, sn = cs[pos, : d // 2], cs[pos, d // 2:]
        x1, x2 = x[:, : d // 2], x[:, d // 2:]
        return torch.cat([x1 * c - x2 * sn, x2 * c + x1 * sn], -1)

    logits, new_kv = [], [[None] * len(lens) for _ in w.layers]
    for b, (n, tok) in enumerate(zip(lens.tolist(), tokens.tolist())):
        if n == 0:
            logits.append(None)
            continue
        pos = n - 1
        x = w.embed[tok].float()
        for i, layer in enumerate(w.layers):
            h = rms(x, layer.input_norm)
            qkv = h @ layer.qkv.float().T + (0 if layer.qkv_bias is None else layer.qkv_bias.float())
            q = qkv[: hq * d].view(hq, d)
            k = qkv[hq * d:(hq + hkv) * d].view(hkv, d)
            v = qkv[(hq + hkv) * d:].view(hkv, d)
            if layer.q_norm is not None:
                q, k = rms(q, layer.q_norm), rms(k, layer.k_norm)
            q, k = rope(q, pos), rope(k, pos)
            new_kv[i][b] = (k, v)
            ks, vs = [], []
            for p in range(pos):
                kp, vp = kv_at(caches[i], int(table[b, p // PAGE]), p % PAGE)
                ks.append(kp.float())
                vs.append(vp.float())
            K = torch.stack(ks + [k]).transpose(0, 1).repeat_interleave(hq // hkv, 0)   # [Hq, n, D]
            Vv = torch.stack(vs + [v]).transpose(0, 1).repeat_interleave(hq // hkv, 0)
            a = F.scaled_dot_product_attention(q[:, None], K, Vv)[:, 0].reshape(-1)
            x = x + a @ layer.o.float().T
            gu = rms(x, layer.post_attn_norm) @ layer.gate_up.float().T
            gate, up = gu[: s.intermediate_size], gu[s.intermediate_size:]
            x = x + (F.silu(gate) * up) @ layer.down.float().T
        logits.append(rms(x, w.final_norm) @ w.lm_head.float().T)
    return logits, new_kv


def assert_bf16_step(step, out, err, logits, rows, atol: float = 0.05) -> None:
    """A bf16 persistent step against the float32 reference `logits` [rows, V]: no device flag,
    every counter back at zero, each row's logits within atol, its token the reference's argmax
    wherever the reference's top-2 margin exceeds atol."""
    assert int(err) == 0 and int(step.counters.abs().sum()) == 0
    for b in rows:
        torch.testing.assert_close(step.logits[b].float(), logits[b], rtol=0, atol=atol)
        top2 = logits[b].topk(2).values
        if float(top2[0] - top2[1]) > atol:
            assert int(out[b]) == int(logits[b].argmax())
