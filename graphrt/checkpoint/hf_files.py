"""A checkpoint directory's small files, read with one-line errors that name the file and field.

config.json, generation_config.json, model.safetensors.index.json and the tokenizer files are
user-supplied: a truncated download, a hand edit or a wrong path must end in one
`CheckpointError` line ("<file>: <field>: <what is wrong>"), never a traceback from json,
transformers or safetensors. Each file is size-capped before it is parsed (`MAX_BYTES`: a
50 MB config.json is refused at once, not after a minute of parsing), and a symlink loop is
named as such, not reported as a missing file (`present`).
"""
from __future__ import annotations

import errno
import json
import math
from contextlib import contextmanager
from pathlib import Path

from graphrt.config import check_json_depth


class CheckpointError(ValueError):
    """The checkpoint directory cannot be loaded; the message names the file and tensor / field."""


def _one_line(e: BaseException) -> str:
    return " ".join(str(e).split())[:300] or type(e).__name__


MiB = 2**20
# the most bytes graphrt reads of each small file (real ones: config.json tens of kB, the largest
# tokenizer.json ~35 MB, a 671B model's index ~10 MB); other files: DEFAULT_MAX_BYTES
MAX_BYTES = {"config.json": 4 * MiB, "generation_config.json": 4 * MiB, "special_tokens_map.json": 4 * MiB,
             "tokenizer_config.json": 16 * MiB, "chat_template.jinja": 4 * MiB, "tokenizer.json": 128 * MiB,
             "model.safetensors.index.json": 64 * MiB, "vocab.json": 64 * MiB, "merges.txt": 64 * MiB,
             "tokenizer.model": 64 * MiB}
DEFAULT_MAX_BYTES = 16 * MiB


def present(file: Path) -> bool:
    """Whether `file` exists (following symlinks); CheckpointError for a symlink loop (which
    Path.exists / is_file report as missing) or a path that cannot be examined."""
    try:
        file.stat()
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise CheckpointError(f"{file}: a symlink loop (the link leads back to itself), not a file") from None
        if e.errno in (errno.ENOENT, errno.ENOTDIR):
            return False
        raise CheckpointError(f"{file}: cannot read: {_one_line(e)}") from None
    return True


def check_size(file: Path) -> int:
    """`file`'s size in bytes after `present` and regular-file checks; CheckpointError naming the
    file and its cap (MAX_BYTES) when larger, before anything reads it."""
    if not present(file):
        raise CheckpointError(f"{file}: missing")
    if not file.is_file():
        raise CheckpointError(f"{file}: not a regular file")
    size = file.stat().st_size
    cap = MAX_BYTES.get(file.name, DEFAULT_MAX_BYTES)
    if size > cap:
        raise CheckpointError(f"{file}: {size} bytes, over graphrt's cap of {cap} bytes ({cap // MiB} MiB) for "
                              f"{file.name}; not read")
    return size


def read_json(file: Path, *, kind: type | None = dict):
    """The JSON value in `file` (a `kind` when given); CheckpointError naming the file otherwise
    (size over its cap, a symlink loop, not a regular file, invalid JSON)."""
    check_size(file)
    try:
        text = file.read_text(encoding="utf-8")
        check_json_depth(text, str(file))
        value = json.loads(text)
    except json.JSONDecodeError as e:
        raise CheckpointError(f"{file}: invalid JSON at line {e.lineno}, column {e.colno}: {e.msg}") from None
    except (OSError, UnicodeDecodeError) as e:
        raise CheckpointError(f"{file}: cannot read: {_one_line(e)}") from None
    except ValueError as e:                        # nested too deep (check_json_depth names the file)
        raise CheckpointError(str(e)) from None
    if kind is not None and not isinstance(value, kind):
        raise CheckpointError(f"{file}: expected a JSON object, got {type(value).__name__}")
    return value


# config.json fields LlamaSpec reads: required positive ints, optional ones, positive numbers
_REQUIRED_INTS = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads")
_OPTIONAL_INTS = ("num_key_value_heads", "head_dim", "max_position_embeddings")
_NUMBERS = ("rms_norm_eps", "rope_theta")
ACTIVATIONS = ("silu", "swish")           # what graphrt's MLP runs (SwiGLU); transformers' names for it
ROPE_THETA = (1.0, 1e12)                  # (exclusive, inclusive): theta <= 1 gives no rotation spectrum
ROPE_TYPES = ("default", "llama3")


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def check_config(raw: dict, file: Path) -> None:
    """Types and ranges of the config.json fields graphrt uses, before transformers sees them."""
    for name in _REQUIRED_INTS + _OPTIONAL_INTS:
        if name not in raw or (raw[name] is None and name in _OPTIONAL_INTS):
            if name in _REQUIRED_INTS:
                raise CheckpointError(f"{file}: {name}: missing")
            continue
        v = raw[name]
        if not _is_int(v) or v < 1:
            raise CheckpointError(f"{file}: {name}: expected an int >= 1, got {v!r}")
    for name in _NUMBERS:
        v = raw.get(name)
        if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0
                              or v == float("inf")):
            raise CheckpointError(f"{file}: {name}: expected a finite number > 0, got {v!r}")
    act = raw.get("hidden_act", "silu")
    if act not in ACTIVATIONS:
        raise CheckpointError(f"{file}: hidden_act: {act!r} is not supported; graphrt runs SiLU "
                              f"(SwiGLU MLP), one of {list(ACTIVATIONS)}")
    _check_rope(raw, file)
    if "tie_word_embeddings" in raw and not isinstance(raw["tie_word_embeddings"], bool):
        raise CheckpointError(f"{file}: tie_word_embeddings: expected true or false, got "
                              f"{raw['tie_word_embeddings']!r}")
    heads = raw["num_attention_heads"]
    kv = raw.get("num_key_value_heads") or heads
    if heads % kv:
        raise CheckpointError(f"{file}: num_key_value_heads: {kv} does not divide num_attention_heads {heads}")
    if not raw.get("head_dim") and raw["hidden_size"] % heads:
        raise CheckpointError(f"{file}: hidden_size: {raw['hidden_size']} is not a multiple of "
                              f"num_attention_heads {heads} (and no head_dim is given)")


def _finite(v) -> bool:
    return not isinstance(v, bool) and isinstance(v, (int, float)) and math.isfinite(v)


def _check_rope(raw: dict, file: Path) -> None:
    """rope_theta in ROPE_THETA; rope_scaling / rope_parameters (transformers 5) of a type graphrt
    computes, with the fields that type needs in range."""
    params = raw.get("rope_parameters")
    if params is not None and not isinstance(params, dict):
        raise CheckpointError(f"{file}: rope_parameters: expected an object, got {params!r}")
    lo, hi = ROPE_THETA
    for key, theta in (("rope_theta", raw.get("rope_theta")),
                       ("rope_parameters.rope_theta", (params or {}).get("rope_theta"))):
        if theta is not None and not (_finite(theta) and lo < theta <= hi):
            raise CheckpointError(f"{file}: {key}: expected a number in ({lo:g}, {hi:g}], got {theta!r}")
    for key in ("rope_scaling", "rope_parameters"):
        s = raw.get(key)
        if s is None:
            continue
        if not isinstance(s, dict):
            raise CheckpointError(f"{file}: {key}: expected an object or null, got {s!r}")
        kind = s.get("rope_type", s.get("type", "default"))
        if kind not in ROPE_TYPES:
            raise CheckpointError(f"{file}: {key}.rope_type: {kind!r} is not supported; graphrt computes "
                                  f"{list(ROPE_TYPES)}")
        if kind != "llama3":
            continue
        for name, ok, want in (
                ("factor", lambda v: _finite(v) and 1 <= v <= 1024, "a number in [1, 1024]"),
                ("low_freq_factor", lambda v: _finite(v) and v > 0, "a number > 0"),
                ("high_freq_factor", lambda v: _finite(v) and v > s.get("low_freq_factor", 0),
                 "a number > low_freq_factor"),
                ("original_max_position_embeddings", lambda v: _is_int(v) and v >= 1, "an int >= 1")):
            if name not in s or not ok(s[name]):
                raise CheckpointError(f"{file}: {key}.{name}: expected {want}, got {s.get(name)!r}")


def eos_ids(value, file: Path, vocab_size: int) -> tuple[int, ...]:
    """eos_token_id (an int or a list of ints, each in [0, vocab_size)) -> a tuple."""
    ids = value if isinstance(value, list) else [value]
    for i in ids:
        if not _is_int(i) or not 0 <= i < vocab_size:
            raise CheckpointError(f"{file}: eos_token_id: expected ids in [0, {vocab_size}), got {value!r}")
    return tuple(ids)


@contextmanager
def reading(file: Path, what: str = ""):
    """Turn any error raised while a library reads `file` into one CheckpointError line."""
    try:
        yield
    except CheckpointError:
        raise
    except Exception as e:                             # safetensors, transformers, tokenizers, OS
        where = f"{what}: " if what else ""
        raise CheckpointError(f"{file}: {where}{type(e).__name__}: {_one_line(e)}") from None


def copy_into(out, t, file: Path, name: str):
    """Tensor `t` copied into `out` (a reader's caller's destination: any dtype, any device) and
    `out` returned; a shape that differs is one CheckpointError naming the tensor (copy_ would
    broadcast some silently)."""
    if tuple(out.shape) != tuple(t.shape):
        raise CheckpointError(f"{file}: tensor {name!r}: read shape {list(t.shape)}, its destination has "
                              f"{list(out.shape)}")
    return out.copy_(t)


__all__ = ["CheckpointError", "MAX_BYTES", "present", "check_size", "read_json", "check_config", "eos_ids", "reading",
           "copy_into"]
