"""Test helper: make an HF Llama-family model compute graphrt's bf16 W8A8 decode arithmetic.

    mirror_w8a8(hf)           # hf float32 (dequantized per-channel FP8 weights): graphrt's rounding points
    mirror_w8a8(hf_bf16, ws)  # hf in bf16: the same FP8 GEMMs, everything else HF's bf16 arithmetic

graphrt's W8A8 step (graphrt/model/llama.py, kernels/fp8.py, norm.py, activation.py, rope_append.py)
rounds at these points, and only there:
- every linear layer but the LM head reads its input quantized per row to e4m3: scale
  s = max(amax / 448, 1e-12) of the float32 row (RMSNorm and SiLU-mul quantize their float32
  result; the attention output is bf16 first), q = e4m3(clamp(x / s, +-448)), ties to even;
- the FP8 GEMM (unit scales) writes the UNSCALED product acc = q @ w8.T in bf16; the consumer
  multiplies acc * s_row * s_col in float32 (rope_append, add+RMSNorm, SiLU-mul);
- q, k, v after RoPE are bf16 (the q buffer, the paged K/V cache); the attention output is bf16;
- the residual stream is bf16 after each add (add+RMSNorm stores it, then normalises the stored
  row); the final norm's output is bf16 (the bf16 LM head reads it).
`mirror_w8a8` puts exactly these on an HF model in float32: then only float32 summation order
(and the GPU's attention / FP8 GEMM accumulation) separates it from graphrt. On a bf16 model it
replaces only the linear layers (same e4m3 rounding, same GEMM arithmetic in float32 from
`weights`, the float32 dequantized weights); every other op then rounds wherever HF's bf16
arithmetic rounds: the yardstick of what bf16 arithmetic alone does to W8A8 logits.
"""
from __future__ import annotations

import torch

FP8_MAX = 448.0
ATTN = "graphrt_w8a8_bf16_qkv"      # HF attention implementation: sdpa over bf16-rounded q, k, v


def bf16(x: torch.Tensor) -> torch.Tensor:
    """x rounded to bf16, in x's dtype."""
    return x.to(torch.bfloat16).to(x.dtype)


def quantize_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [..., K] -> (codes [..., K] float32 holding e4m3 values, scale [..., 1] float32) with
    x ~ codes * scale: scale = max(amax / 448, 1e-12) of the float32 row."""
    xf = x.float()
    s = (xf.abs().amax(-1, keepdim=True) / FP8_MAX).clamp(min=1e-12)
    return (xf / s).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn).float(), s


def channel_codes(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A dequantized per-channel FP8 weight w [N, K] (float32 values code * scale[n]) -> (codes
    [N, K] float32 e4m3 values, scale [N] float32): each row's largest code is 448, so
    scale = amax / 448 (to a float32 ulp) and the codes are recovered exactly by rounding."""
    codes, s = quantize_rows(w)
    return codes, s[:, 0]


def w8a8_linear(x: torch.Tensor, codes: torch.Tensor, col_scale: torch.Tensor) -> torch.Tensor:
    """graphrt's W8A8 GEMM and its consumer's scale multiply: x [..., K] -> [..., N] float32 =
    bf16(q @ codes.T) * s_row * s_col (q, s_row = quantize_rows(x)); products of e4m3 values are
    exact in float32, sums in float32."""
    q, s = quantize_rows(x)
    acc = bf16(q @ codes.T)
    return acc * s * col_scale


def _linear_hook(attn_out: bool):
    """Forward hook: the layer's output replaced by graphrt's W8A8 arithmetic on its input."""
    def hook(mod, args, out):
        x = bf16(args[0]) if attn_out else args[0]               # o_proj: the bf16 attention output
        y = w8a8_linear(x, mod._w8a8_codes, mod._w8a8_scale)
        if mod.bias is not None:
            y = y + mod.bias.float()
        return y.to(out.dtype)
    return hook


def _register_attention() -> None:
    from transformers import AttentionInterface
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    def attend(module, query, key, value, attention_mask, **kw):
        return sdpa_attention_forward(module, bf16(query), bf16(key), bf16(value), attention_mask, **kw)
    AttentionInterface.register(ATTN, attend)


def mirror_w8a8(hf, weights: dict | None = None) -> None:
    """Install graphrt's W8A8 rounding points on `hf` (forward hooks, one attention
    implementation; see the module docstring). weights: {linear module name: float32 [N, K]
    dequantized weight} for a bf16 `hf` (default: each module's own weight, right for float32)."""
    f32 = next(hf.parameters()).dtype == torch.float32
    for name, mod in hf.named_modules():
        if isinstance(mod, torch.nn.Linear) and name != "lm_head":
            w = mod.weight if weights is None else weights[name]
            codes, cs = channel_codes(w.detach().to(mod.weight.device, torch.float32))
            mod.register_buffer("_w8a8_codes", codes, persistent=False)
            mod.register_buffer("_w8a8_scale", cs, persistent=False)
            mod.register_forward_hook(_linear_hook(name.endswith("o_proj")))
    if not f32:
        return                                                   # bf16: HF rounds everything else
    _register_attention()
    if hasattr(hf, "set_attn_implementation"):
        hf.set_attn_implementation(ATTN)
    else:                                                        # older transformers
        hf.config._attn_implementation = ATTN
    for layer in hf.model.layers:
        def stash(m, args, kwargs):
            m._w8a8_residual = args[0] if args else kwargs["hidden_states"]

        def residual_bf16(m, args, out, layer=layer):
            # HF adds residual + attn_out in float32; graphrt stores that sum in bf16: return
            # bf16(r + o) - r (exact in float32: both bf16 values), so HF's sum is the bf16 one
            r = layer._w8a8_residual
            o = out[0] if isinstance(out, tuple) else out
            o = bf16(r + o) - r
            return (o,) + tuple(out[1:]) if isinstance(out, tuple) else o
        layer.register_forward_pre_hook(stash, with_kwargs=True)
        layer.self_attn.register_forward_hook(residual_bf16)
        layer.register_forward_hook(
            lambda m, args, out: (bf16(out[0]),) + tuple(out[1:]) if isinstance(out, tuple) else bf16(out))
    hf.model.norm.register_forward_hook(lambda m, args, out: bf16(out))
