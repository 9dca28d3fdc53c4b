"""A GGUF file's tensors under the HF names the loaders place, dequantized one tensor at a time.

    tensors = GGUFTensors(open_gguf(file), arch)     # the interface of files.TensorFiles
    tensors.names                                    # HF names: "model.layers.0.self_attn.q_proj.weight", ...
    file, shape, kind = tensors.header(name)         # shape in HF order [out, in]; kind "F32" | "F16" | "BF16"
    t = tensors.tensor(name, rows=(a, b))            # float32 host tensor (rows / columns of it)
    tensors.tensor(name, out=dest)                   # ... written into the loader's destination

Every type `gguf.quants.dequantize` handles is read (F32, F16, BF16, Q4_0 ... Q8_0, the K-quants,
the IQ types, TQ, MXFP4 ...) to float32. The types people download (F32 / F16 / BF16, Q4_0, Q4_1,
Q5_0, Q5_1, Q8_0, Q2_K ... Q6_K) go through graphrt's torch dequantizer (gguf_quants.py: vectorised
over blocks, on torch's CPU threads, equal bit for bit to the package's); the rest through the
package's NumPy code (one core). Only the raw bytes of the rows asked for are read and
dequantized (a row is a run of whole blocks); columns are cut at block boundaries, then trimmed.
The loader passes its destination as `out`: a float32 host one (a CPU load) takes the
dequantized blocks directly, any other gets the float32 tensor cast into it on its device.
`header` reports "F16" / "BF16" for tensors stored so and "F32" for the rest (what the loader
takes as the checkpoint's dtype when none is given). A type the package cannot dequantize is one
CheckpointError naming the tensor, checked before any device memory is allocated (the loader
reads every header first).

llama.cpp stores a Llama model's q and k projection rows permuted (its converter interleaves the
two RoPE halves of each head: rows (h, 2, D/2) -> (h, D/2, 2)) to run GPT-J-style rotation; graphrt
and transformers rotate halves (rotate_half), so `tensor` undoes it for the llama architecture
(q with the query heads, k with the KV heads; biases too). Qwen2 / Qwen3 are stored unpermuted.
GGUF lists dimensions fastest first (ne0 = columns); `header` gives them in torch order.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from graphrt.checkpoint.gguf_file import GGUFFile
from graphrt.checkpoint.gguf_quants import BLOCKS, dequantize, fits
from graphrt.checkpoint.hf_files import CheckpointError, copy_into, reading

GLOBAL_NAMES = {"token_embd.weight": "model.embed_tokens.weight", "output_norm.weight": "model.norm.weight",
                "output.weight": "lm_head.weight"}
LAYER_NAMES = {"attn_norm.weight": "input_layernorm.weight", "ffn_norm.weight": "post_attention_layernorm.weight",
               "attn_q.weight": "self_attn.q_proj.weight", "attn_k.weight": "self_attn.k_proj.weight",
               "attn_v.weight": "self_attn.v_proj.weight", "attn_output.weight": "self_attn.o_proj.weight",
               "attn_q.bias": "self_attn.q_proj.bias", "attn_k.bias": "self_attn.k_proj.bias",
               "attn_v.bias": "self_attn.v_proj.bias",
               "attn_q_norm.weight": "self_attn.q_norm.weight", "attn_k_norm.weight": "self_attn.k_norm.weight",
               "ffn_gate.weight": "mlp.gate_proj.weight", "ffn_up.weight": "mlp.up_proj.weight",
               "ffn_down.weight": "mlp.down_proj.weight"}
CONSUMED = ("rope_freqs.weight",)          # read into the config (gguf_file.GGUFFile.config)
FLOAT_KINDS = {"F32": "F32", "F16": "F16", "BF16": "BF16"}


def hf_name(gguf_name: str) -> str:
    """The HF tensor name for a GGUF one; names graphrt does not map are kept as they are."""
    if gguf_name in GLOBAL_NAMES:
        return GLOBAL_NAMES[gguf_name]
    parts = gguf_name.split(".", 2)
    if len(parts) == 3 and parts[0] == "blk" and parts[1].isdigit() and parts[2] in LAYER_NAMES:
        return f"model.layers.{parts[1]}.{LAYER_NAMES[parts[2]]}"
    return gguf_name


def unpermute_rope_rows(t: torch.Tensor, heads: int) -> torch.Tensor:
    """Undo llama.cpp's q / k row permutation: t [heads * D, ...] with each head's rows in
    (D/2, 2) order -> (2, D/2) order (rotate_half's halves). Any dtype and device."""
    rows = t.shape[0]
    if rows % (2 * heads):
        raise ValueError(f"heads: {rows} rows are not {heads} heads of an even head_dim")
    return t.reshape(heads, rows // heads // 2, 2, *t.shape[1:]).transpose(1, 2).reshape(t.shape)


class GGUFTensors:
    """files.TensorFiles's interface over one GGUF file (see the module doc). Host only."""

    def __init__(self, gguf: GGUFFile, raw: dict):
        self.gguf, self.path = gguf, gguf.file
        self._llama = gguf.arch == "llama"
        self._heads = {"self_attn.q_proj": raw["num_attention_heads"], "self_attn.k_proj": raw["num_key_value_heads"]}
        self.files = {hf_name(n): n for n in gguf.tensors if n not in CONSUMED}   # HF name -> GGUF name
        self._dequantizes: dict[int, bool] = {}

    @property
    def names(self) -> set[str]:
        return set(self.files)

    def file(self, name: str) -> Path:
        if name not in self.files:
            raise CheckpointError(f"{self.path}: tensor {name!r} missing from the GGUF file")
        return self.path

    def _tensor(self, name: str):
        self.file(name)
        return self.gguf.tensors[self.files[name]]

    def _can_dequantize(self, qtype) -> bool:
        """gguf.quants.dequantize handles `qtype` (tried once on one zero block)."""
        if qtype.name in BLOCKS:
            return True
        if int(qtype) not in self._dequantizes:
            from gguf.quants import GGML_QUANT_SIZES, dequantize
            _, type_size = GGML_QUANT_SIZES[qtype]
            try:
                dequantize(np.zeros((1, type_size), dtype=np.uint8), qtype)
                self._dequantizes[int(qtype)] = True
            except NotImplementedError:
                self._dequantizes[int(qtype)] = False
        return self._dequantizes[int(qtype)]

    def header(self, name: str) -> tuple[Path, tuple[int, ...], str]:
        """(file, shape [torch order], dtype name the loader reads: F32 / F16 / BF16); reads no data.
        CheckpointError for a type gguf cannot dequantize."""
        t = self._tensor(name)
        qtype = t.tensor_type
        if not self._can_dequantize(qtype):
            import gguf
            raise CheckpointError(f"{self.path}: tensor {t.name!r} has type {qtype.name}, which gguf "
                                  f"{getattr(gguf, '__version__', '')} cannot dequantize".replace("  ", " "))
        return self.path, tuple(int(d) for d in reversed(t.shape)), FLOAT_KINDS.get(qtype.name, "F32")

    def tensor(self, name: str, rows: tuple[int, int] | None = None,
               cols: tuple[int, int] | None = None, *, out: torch.Tensor | None = None) -> torch.Tensor:
        """The tensor dequantized to float32 on the host (q / k rows unpermuted for llama), or rows
        [a, b) / columns [a, b) of it (a 1-D tensor's `rows` are its elements). With `out` (a tensor
        of that shape, any dtype and device) written into it and `out` returned: a contiguous
        float32 host `out` takes the dequantized blocks directly, no float32 copy in between."""
        _, shape, _ = self.header(name)
        t = self._tensor(name)
        kind = t.tensor_type.name
        proj = name.rsplit(".", 1)[0].split(".", 3)[-1] if name.startswith("model.layers.") else ""
        heads = self._heads[proj] if self._llama and proj in self._heads else None
        with reading(self.path, f"tensor {t.name!r} data ({kind})"):
            if kind in BLOCKS and len(shape) > 1:
                res = self._blocks(t, shape, kind, heads, rows, cols, out)
            else:
                res = self._whole(t, shape, kind, heads, rows, cols)
        return res if out is None or res is out else copy_into(out, res, self.path, name)

    @staticmethod
    def _whole(t, shape, kind, heads, rows, cols) -> torch.Tensor:
        """A 1-D tensor (norms, biases: small) or a type without a torch dequantizer (the package's
        NumPy code, one core): all of it dequantized, then unpermuted and cut."""
        if kind in BLOCKS:
            out = dequantize(torch.from_numpy(np.array(t.data.view(np.uint8).reshape(-1))), kind)
        else:
            from gguf.quants import dequantize as numpy_dequantize
            arr = numpy_dequantize(t.data, t.tensor_type).reshape(shape)
            out = torch.from_numpy(arr if arr.flags.writeable else arr.copy())
        if heads is not None:
            out = unpermute_rope_rows(out, heads)
        if rows is not None:
            out = out[rows[0]:rows[1]]
        return out if cols is None else out[:, cols[0]:cols[1]]

    @staticmethod
    def _blocks(t, shape, kind, heads, rows, cols, out) -> torch.Tensor:
        """A 2-D tensor through the torch dequantizer: only the raw blocks holding rows [a, b) and
        columns [a, b) are read from the memory-mapped file (q / k rows unpermuted as raw rows
        first); into `out` when it fits (no columns trimmed off the blocks)."""
        weights, size = BLOCKS[kind]
        a, b = (0, shape[-1]) if cols is None else cols
        first, last = a // weights, -(-b // weights)                       # the blocks holding columns [a, b)
        data = t.data.view(np.uint8).reshape(*shape[:-1], -1)[..., first * size:last * size]
        if heads is None:
            raw = torch.from_numpy(np.array(data if rows is None else data[rows[0]:rows[1]]))
        else:
            raw = unpermute_rope_rows(torch.from_numpy(np.array(data)), heads)
            raw = raw if rows is None else raw[rows[0]:rows[1]]
        trim = (a - first * weights, b - first * weights)
        direct = out is not None and trim == (0, (last - first) * weights) and \
            fits(out, (raw.shape[0], trim[1]), raw.device)
        res = dequantize(raw, kind, out=out if direct else None)           # uint8 [rows, bytes] -> float32
        return res if trim == (0, (last - first) * weights) else res[:, trim[0]:trim[1]]


__all__ = ["GGUFTensors", "hf_name", "unpermute_rope_rows"]
