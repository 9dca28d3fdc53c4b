"""Shared pieces of the int4 layout readers (int4_gptq.py, int4_awq.py, int4_ct.py): unpacking
int32 words into 4-bit codes and checking a tensor's header.

    codes = unpack_nibbles(words)                    # int32 [R, C] -> int64 [R, 8C], LSB first
    codes = unpack_nibbles(words, order=AWQ_ORDER)   # nibble i holds column 8c + order[i]
    expect(rd, name, (rows, cols), ("I32",))         # CheckpointError naming file, tensor, shape
"""
from __future__ import annotations

import torch

from graphrt.checkpoint.files import FILE_DTYPES, CheckpointError, TensorFiles

INT32 = ("I32",)
FLOATS = tuple(FILE_DTYPES)
LINEAR = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def unpack_nibbles(words: torch.Tensor, order: tuple[int, ...] | None = None) -> torch.Tensor:
    """words int32 [R, C] (host) -> int64 [R, 8C]: nibble i (bits 4i .. 4i+3) of words[r, c]
    lands in column 8c + i, or 8c + order[i] with `order` (a permutation of 0..7)."""
    shifts = torch.arange(0, 32, 4, dtype=torch.int64)
    nib = (words.to(torch.int64)[:, :, None] >> shifts) & 0xF             # [R, C, 8]: nibble i
    if order is not None:
        out = torch.empty_like(nib)
        out[:, :, list(order)] = nib
        nib = out
    return nib.reshape(words.shape[0], -1)


def expect(rd: TensorFiles, name: str, shape: tuple[int, ...], kinds: tuple[str, ...], why: str = "") -> None:
    """CheckpointError (one line: file, tensor, got, expected) unless the header matches."""
    f, got, kind = rd.header(name)
    if tuple(got) != tuple(shape) or kind not in kinds:
        raise CheckpointError(f"{f}: tensor {name!r} is {kind} {list(got)}; {why or 'the int4 layout'} "
                              f"implies {'/'.join(kinds)} {list(shape)}")


__all__ = ["FLOATS", "INT32", "LINEAR", "expect", "unpack_nibbles"]
