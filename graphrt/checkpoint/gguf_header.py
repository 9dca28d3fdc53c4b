"""A GGUF file's header read directly: its metadata as Python values and its tensors' places.

    h = read_header(path)          # GGUFHeader (host; the file memory-mapped read-only)
    h.version                      # 2 or 3
    h.fields["general.architecture"]          # 'llama': str, int, float, bool, or a list of them
                                   # (and GGUFReader's GGUF.version / .tensor_count / .kv_count)
    t = h.tensors[0]               # TensorInfo: name, tensor_type, shape (ne0 first), n_elements,
    t.data                         #   n_bytes, data_offset (absolute); data: a NumPy view of its bytes

Layout (little-endian; the GGUF specification of the ggml project, versions 2 and 3): the magic
b"GGUF", version u32, tensor count u64, metadata count u64; each metadata pair a string key (u64
length + UTF-8 bytes), a value type u32 and the value (UINT8 0, INT8 1, UINT16 2, INT16 3, UINT32 4,
INT32 5, FLOAT32 6, BOOL 7, STRING 8, ARRAY 9 = element type u32 + count u64 + elements, UINT64 10,
INT64 11, FLOAT64 12); then per tensor its name, the dimension count u32, the dimensions u64 each
(ne0, the contiguous one, first), the ggml type u32 and the offset u64 of its data from the data
section, which starts at the end of the header rounded up to `general.alignment` (default 32).

`data` follows the `gguf` package's GGUFReader: F32 / F16 / F64 / I8..I64 tensors as that NumPy
type shaped [ne_{n-1}, ..., ne0]; every other type (BF16 and the quantized ones) as uint8 with the
last dimension in bytes ([..., ne0 / block * block_bytes]), which `gguf.quants.dequantize` reads.
This reader exists for speed: GGUFReader builds NumPy views per string of the vocabulary (seconds
for a 49k-token tokenizer); here strings are decoded from one buffer. A file that ends inside the
header, a bad magic, an unknown value or tensor type: ValueError with one line (the caller adds
the file's name).
"""
from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

MAGIC = b"GGUF"
DEFAULT_ALIGNMENT = 32
_SCALARS = {0: ("<B", 1), 1: ("<b", 1), 2: ("<H", 2), 3: ("<h", 2), 4: ("<I", 4), 5: ("<i", 4), 6: ("<f", 4),
            7: ("<?", 1), 10: ("<Q", 8), 11: ("<q", 8), 12: ("<d", 8)}
_NUMPY = {0: "<u1", 1: "<i1", 2: "<u2", 3: "<i2", 4: "<u4", 5: "<i4", 6: "<f4", 7: "<u1", 10: "<u8", 11: "<i8",
          12: "<f8"}
STRING, ARRAY = 8, 9
_TYPED = {"F32": np.float32, "F16": np.float16, "F64": np.float64, "I8": np.int8, "I16": np.int16,
          "I32": np.int32, "I64": np.int64}


@dataclass(frozen=True)
class TensorInfo:
    """One tensor's place in the file: shape in GGUF order (ne0 first), type (a
    gguf.GGMLQuantizationType), absolute byte offset and length; `data` a read-only NumPy view."""
    name: str
    tensor_type: object
    shape: tuple
    n_elements: int
    n_bytes: int
    data_offset: int
    _buf: object = field(repr=False, compare=False)

    @property
    def data(self) -> np.ndarray:
        raw = np.frombuffer(self._buf, dtype=np.uint8, count=self.n_bytes, offset=self.data_offset)
        dims = tuple(reversed(self.shape))
        typed = _TYPED.get(self.tensor_type.name)
        if typed is not None:
            return raw.view(typed).reshape(dims)
        from gguf import GGML_QUANT_SIZES
        block, size = GGML_QUANT_SIZES[self.tensor_type]
        return raw.reshape(*dims[:-1], dims[-1] // block * size)


@dataclass
class GGUFHeader:
    """The parsed header: version, metadata {key: value}, tensors in file order, the data section's
    start, and the file's size."""
    version: int
    fields: dict
    tensors: list
    data_start: int
    size: int


class _Cursor:
    """Reads little-endian values from a buffer, failing with 'truncated' past its end."""

    def __init__(self, buf, size: int):
        self.buf, self.size, self.pos = buf, size, 0

    def need(self, n: int, what: str) -> int:
        if n < 0 or self.pos + n > self.size:
            raise ValueError(f"truncated: {what} needs bytes up to {self.pos + n}, the file has {self.size}")
        p = self.pos
        self.pos += n
        return p

    def scalar(self, fmt: str, width: int, what: str):
        return struct.unpack_from(fmt, self.buf, self.need(width, what))[0]

    def string(self, what: str) -> str:
        n = self.scalar("<Q", 8, what)
        p = self.need(n, what)
        return bytes(self.buf[p:p + n]).decode("utf-8", errors="replace")

    def value(self, vtype: int, what: str):
        if vtype in _SCALARS:
            return self.scalar(*_SCALARS[vtype], what)
        if vtype == STRING:
            return self.string(what)
        if vtype == ARRAY:
            etype = self.scalar("<I", 4, what)
            count = self.scalar("<Q", 8, what)
            if etype in _NUMPY:
                width = _SCALARS[etype][1]
                p = self.need(count * width, what)
                out = np.frombuffer(self.buf, dtype=_NUMPY[etype], count=count, offset=p).tolist()
                return [bool(v) for v in out] if etype == 7 else out
            if etype == STRING:
                return self._strings(count, what)
            return [self.value(etype, what) for _ in range(count)]      # arrays of arrays: rare
        raise ValueError(f"{what}: unknown value type {vtype}")

    def _strings(self, count: int, what: str) -> list[str]:
        out, buf, unpack = [], self.buf, struct.unpack_from
        pos, size = self.pos, self.size
        for _ in range(count):
            if pos + 8 > size:
                raise ValueError(f"truncated: {what} ends past the file's {size} bytes")
            n = unpack("<Q", buf, pos)[0]
            pos += 8
            if pos + n > size:
                raise ValueError(f"truncated: {what} ends past the file's {size} bytes")
            out.append(bytes(buf[pos:pos + n]).decode("utf-8", errors="replace"))
            pos += n
        self.pos = pos
        return out


def read_header(path) -> GGUFHeader:
    """Parse `path`'s header (see the module doc); ValueError (one line) for a malformed file."""
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
    path = Path(path)
    with open(path, "rb") as f:
        size = f.seek(0, 2)
        if size < 24:
            raise ValueError(f"truncated: {size} bytes, shorter than a GGUF header")
        buf = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    c = _Cursor(buf, size)
    if bytes(buf[0:4]) != MAGIC:
        raise ValueError(f"not a GGUF file (magic {bytes(buf[0:4])!r}, expected {MAGIC!r})")
    c.pos = 4
    version = c.scalar("<I", 4, "version")
    if version not in (2, 3):
        raise ValueError(f"GGUF version {version} is not supported (2 or 3; a big-endian file reads as a "
                         f"huge version)")
    n_tensors = c.scalar("<Q", 8, "tensor count")
    n_fields = c.scalar("<Q", 8, "metadata count")
    fields = {"GGUF.version": version, "GGUF.tensor_count": n_tensors, "GGUF.kv_count": n_fields}   # as GGUFReader
    for i in range(n_fields):
        key = c.string(f"metadata key {i}")
        fields[key] = c.value(c.scalar("<I", 4, f"metadata {key!r}"), f"metadata {key!r}")
    infos = []
    for i in range(n_tensors):
        name = c.string(f"tensor name {i}")
        n_dims = c.scalar("<I", 4, f"tensor {name!r}")
        if n_dims > 8:
            raise ValueError(f"tensor {name!r}: {n_dims} dimensions")
        dims = tuple(c.scalar("<Q", 8, f"tensor {name!r}") for _ in range(n_dims))
        raw_type = c.scalar("<I", 4, f"tensor {name!r}")
        offset = c.scalar("<Q", 8, f"tensor {name!r}")
        try:
            qtype = GGMLQuantizationType(raw_type)
        except ValueError:
            raise ValueError(f"tensor {name!r}: unknown ggml type {raw_type}") from None
        infos.append((name, qtype, dims, offset))
    align = fields.get("general.alignment", DEFAULT_ALIGNMENT)
    if not isinstance(align, int) or align < 1:
        raise ValueError(f"metadata 'general.alignment': {align!r}")
    start = -(-c.pos // align) * align
    tensors, seen = [], set()
    for name, qtype, dims, offset in infos:
        if name in seen:
            raise ValueError(f"tensor {name!r} appears twice")
        seen.add(name)
        n = int(np.prod(dims, dtype=np.int64)) if dims else 1
        block, type_size = GGML_QUANT_SIZES[qtype]
        if dims and dims[0] % block:
            raise ValueError(f"tensor {name!r}: {dims[0]} columns are not whole {qtype.name} blocks of {block}")
        tensors.append(TensorInfo(name, qtype, dims, n, n * type_size // block, start + offset, buf))
    return GGUFHeader(version, fields, tensors, start, size)


__all__ = ["GGUFHeader", "TensorInfo", "read_header"]
