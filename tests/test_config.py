"""RuntimeConfig / load_config: presets, derived values, digest/replace, and every ConfigError."""
from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

import graphrt
from graphrt import ConfigError, RuntimeConfig, load_config
from graphrt.config import bucket_rule, config_from_dict

ROOT = Path(__file__).resolve().parent.parent
PRESETS = sorted((ROOT / "configs").glob("*.yaml"))
RULE_256 = (1, 2, 4) + tuple(range(8, 257, 8))

# Derived values per known preset (any other preset still gets the generic checks).
EXPECTED = {
    "llama-3.1-8b": dict(num_qo_heads=32, num_kv_heads=8, head_dim=128, group_size=4,
                         max_context_len=32768, max_pages_per_seq=2048, buckets=RULE_256,
                         dtype="bfloat16", backend="flashinfer", pool_pages=8192),
    "llama-3.2-1b": dict(num_qo_heads=32, num_kv_heads=8, head_dim=64, group_size=4,
                         max_context_len=32768, max_pages_per_seq=2048, buckets=RULE_256,
                         dtype="bfloat16", backend="flashinfer", pool_pages=8192),
    "qwen2.5-7b": dict(num_qo_heads=28, num_kv_heads=4, head_dim=128, group_size=7,
                       max_context_len=32768, max_pages_per_seq=2048, buckets=RULE_256,
                       dtype="bfloat16", backend="flashinfer", pool_pages=8192),
    "qwen3-8b": dict(num_qo_heads=32, num_kv_heads=8, head_dim=128, group_size=4,
                     max_context_len=32768, max_pages_per_seq=2048, buckets=RULE_256,
                     dtype="bfloat16", backend="flashinfer", pool_pages=8192),
    "tiny": dict(num_qo_heads=4, num_kv_heads=2, head_dim=64, group_size=2, max_context_len=512,
                 max_pages_per_seq=32, buckets=(1, 2, 4, 8), dtype="float32",
                 backend="torch-splitkv", pool_pages=256),
}

# A valid config as plain data (the tiny preset's values); error cases edit a copy.
BASE = dict(name="t", num_qo_heads=4, num_kv_heads=2, head_dim=64, page_size=16, kv_layout="NHD",
            dtype="float32", max_context_len=512, buckets=[1, 2, 4, 8], backend="torch-splitkv")


def write_yaml(tmp_path: Path, data, name: str = "cfg.yaml") -> Path:
    path = tmp_path / name
    path.write_text(data if isinstance(data, str) else yaml.safe_dump(data))
    return path


DROP = object()  # with_changes(key=DROP) removes the key


def with_changes(**changes) -> dict:
    d = dict(BASE)
    for k, v in changes.items():
        if v is DROP:
            d.pop(k)
        else:
            d[k] = v
    return d


# ---- presets ------------------------------------------------------------------------------
def test_presets_found():
    assert len(PRESETS) >= 4, PRESETS
    assert {p.stem for p in PRESETS} >= set(EXPECTED)


@pytest.mark.parametrize("path", PRESETS, ids=[p.stem for p in PRESETS])
def test_preset_loads(path):
    cfg = load_config(path)
    assert isinstance(cfg, RuntimeConfig)
    assert cfg.name == path.stem
    # invariants every preset must satisfy
    assert cfg.max_pages_per_seq == -(-cfg.max_context_len // cfg.page_size)
    assert cfg.group_size * cfg.num_kv_heads == cfg.num_qo_heads
    assert list(cfg.buckets) == sorted(set(cfg.buckets)) and cfg.buckets[0] >= 1
    assert cfg.max_batch == cfg.buckets[-1]
    assert cfg.pool_pages >= cfg.max_pages_per_seq
    # the YAML round-trips through to_dict
    assert RuntimeConfig(**cfg.to_dict()) == cfg
    want = EXPECTED.get(path.stem)
    if want is not None:
        got = {k: getattr(cfg, k) for k in want}
        assert got == want


def test_llama_8b_buckets():
    cfg = load_config(ROOT / "configs" / "llama-3.1-8b.yaml")
    assert cfg.buckets[:6] == (1, 2, 4, 8, 16, 24)
    assert cfg.buckets[-1] == 256 and len(cfg.buckets) == 35
    assert cfg.max_pages_per_seq == 2048 and cfg.group_size == 4


# ---- bucket rule ------------------------------------------------------------------------
@pytest.mark.parametrize("max_batch, want", [
    (1, (1,)), (2, (1, 2)), (3, (1, 2, 3)), (4, (1, 2, 4)), (7, (1, 2, 4, 7)), (8, (1, 2, 4, 8)),
    (12, (1, 2, 4, 8, 12)), (16, (1, 2, 4, 8, 16)), (23, (1, 2, 4, 8, 16, 23)),
    (24, (1, 2, 4, 8, 16, 24)),
    (256, RULE_256),
])
def test_bucket_rule(max_batch, want):
    assert bucket_rule(max_batch) == want


def test_bucket_rule_256_shape():
    r = bucket_rule(256)
    assert len(r) == 35 and r[-1] == 256
    assert all(b % 8 == 0 for b in r[3:])
    assert all(b <= 256 for b in r)


def test_bucket_rule_in_config():
    cfg = RuntimeConfig(**with_changes(buckets={"max": 32}))
    assert cfg.buckets == (1, 2, 4, 8, 16, 24, 32)
    assert cfg.max_batch == 32


# ---- Python construction ----------------------------------------------------------------------
def test_python_construction_and_defaults():
    cfg = RuntimeConfig(num_qo_heads=8, num_kv_heads=2, head_dim=128, page_size=32,
                        max_context_len=1000, buckets=[1, 3, 6])
    assert cfg.buckets == (1, 3, 6) and isinstance(cfg.buckets, tuple)
    assert cfg.max_pages_per_seq == 32          # ceil(1000 / 32)
    assert cfg.max_context_len == 1000
    assert cfg.group_size == 4 and cfg.max_batch == 6
    assert (cfg.kv_layout, cfg.dtype, cfg.backend, cfg.planner, cfg.decode_kernel) == \
        ("NHD", "bfloat16", "reference", "device", "tensor-core")
    assert cfg.workspace_mb == 128 and cfg.kv_pool_pages is None and cfg.seed == 0
    assert cfg.pool_pages == max(4 * 32, 64)
    import torch
    assert cfg.torch_dtype is torch.bfloat16
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.page_size = 8  # type: ignore[misc]


def test_max_pages_per_seq_derives_context():
    cfg = RuntimeConfig(**with_changes(max_context_len=DROP, max_pages_per_seq=10))
    assert cfg.max_pages_per_seq == 10
    assert cfg.max_context_len == 160


def test_max_pages_per_seq_from_yaml(tmp_path):
    cfg = load_config(write_yaml(tmp_path, with_changes(max_context_len=DROP, max_pages_per_seq=3)))
    assert (cfg.max_pages_per_seq, cfg.max_context_len) == (3, 48)


# ---- digest / replace -------------------------------------------------------------------
def test_digest_stable():
    a = RuntimeConfig(**BASE)
    b = RuntimeConfig(**dict(reversed(list(BASE.items()))))  # same fields, other key order
    assert a.digest() == b.digest() == a.digest()
    assert re.fullmatch(r"[0-9a-f]{16}", a.digest())
    # equal after a YAML round trip, and the same in a fresh interpreter (no hash() salt)
    code = ("import json,sys; from graphrt.config import RuntimeConfig; "
            "print(RuntimeConfig(**json.loads(sys.argv[1])).digest())")
    env = dict(os.environ, PYTHONHASHSEED="12345")
    out = subprocess.run([sys.executable, "-c", code, json.dumps(BASE)], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == a.digest()


def test_digest_same_for_rule_and_explicit_buckets():
    assert RuntimeConfig(**with_changes(buckets={"max": 8})).digest() == \
        RuntimeConfig(**with_changes(buckets=[1, 2, 4, 8])).digest()


@pytest.mark.parametrize("change", [
    dict(page_size=32), dict(head_dim=128), dict(num_kv_heads=4), dict(num_qo_heads=8),
    dict(dtype="float16"), dict(kv_layout="HND"), dict(buckets=[1, 2, 4]),
    dict(max_context_len=1024), dict(seed=1), dict(name="other"), dict(workspace_mb=64),
    dict(kv_pool_pages=100), dict(backend="reference"), dict(planner="host"),
    dict(decode_kernel="cuda-core"),
], ids=lambda c: next(iter(c)))
def test_digest_changes(change):
    base = RuntimeConfig(**BASE)
    other = base.replace(**change)
    for k, v in change.items():
        got = getattr(other, k)
        assert got == (tuple(v) if isinstance(v, list) else v)
    assert other.digest() != base.digest()


def test_replace():
    base = RuntimeConfig(**BASE)
    r = base.replace(page_size=32)
    assert r.page_size == 32 and r.max_context_len == 512 and r.max_pages_per_seq == 16
    assert base.page_size == 16 and base.max_pages_per_seq == 32  # original untouched
    r = base.replace(max_pages_per_seq=4)
    assert r.max_pages_per_seq == 4 and r.max_context_len == 64
    r = base.replace(buckets={"max": 16})
    assert r.buckets == (1, 2, 4, 8, 16)
    assert base.replace() == base and base.replace().digest() == base.digest()
    with pytest.raises(ConfigError, match="head_dim"):
        base.replace(head_dim=100)


# ---- errors -------------------------------------------------------------------------------------
ERROR_CASES = [
    # id, data, regex the message must match
    ("unknown-key", with_changes(bogus_key=1), r"unknown key.*bogus_key"),
    ("missing-head_dim", with_changes(head_dim=DROP), r"missing required key.*head_dim"),
    ("missing-buckets", with_changes(buckets=DROP), r"missing required key.*buckets"),
    ("head_dim-str", with_changes(head_dim="128"), r"head_dim: expected a positive int.*'128'"),
    ("num_qo_heads-float", with_changes(num_qo_heads=32.0), r"num_qo_heads: expected a positive int.*float"),
    ("page_size-bool", with_changes(page_size=True), r"page_size: expected a positive int.*bool"),
    ("max_context_len-bool", with_changes(max_context_len=True), r"max_context_len: expected a positive int"),
    ("seed-str", with_changes(seed="0"), r"seed: expected an int"),
    ("name-int", with_changes(name=5), r"name: expected a string"),
    ("page_size-0", with_changes(page_size=0), r"page_size: must be > 0, got 0"),
    ("workspace_mb-neg", with_changes(workspace_mb=-1), r"workspace_mb: must be > 0, got -1"),
    ("num_kv_heads-0", with_changes(num_kv_heads=0), r"num_kv_heads: must be > 0"),
    ("max_context_len-0", with_changes(max_context_len=0), r"max_context_len: must be > 0"),
    ("max_pages_per_seq-0", with_changes(max_context_len=DROP, max_pages_per_seq=0), r"max_pages_per_seq: must be > 0"),
    ("kv_pool_pages-0", with_changes(kv_pool_pages=0), r"kv_pool_pages: must be > 0"),
    ("gqa-not-multiple", with_changes(num_qo_heads=6, num_kv_heads=4), r"num_qo_heads: 6 is not a multiple of num_kv_heads 4"),
    ("buckets-unsorted", with_changes(buckets=[1, 4, 2]), r"buckets: must be strictly increasing"),
    ("buckets-duplicate", with_changes(buckets=[1, 2, 2, 4]), r"buckets: must be strictly increasing"),
    ("buckets-empty", with_changes(buckets=[]), r"buckets: expected a non-empty list"),
    ("buckets-scalar", with_changes(buckets=8), r"buckets: expected a non-empty list"),
    ("buckets-zero", with_changes(buckets=[0, 1]), r"buckets\[0\]: must be > 0"),
    ("buckets-str-item", with_changes(buckets=[1, "2"]), r"buckets\[1\]: expected a positive int"),
    ("bucket-rule-key", with_changes(buckets={"maximum": 8}), r"buckets: a rule is \{max: N\}.*maximum"),
    ("bucket-rule-extra-key", with_changes(buckets={"max": 8, "min": 1}), r"buckets: a rule is \{max: N\}.*min"),
    ("bucket-rule-max-0", with_changes(buckets={"max": 0}), r"buckets\.max: must be > 0"),
    ("dtype", with_changes(dtype="int8"), r"dtype: 'int8' is not one of"),
    ("head_dim-96", with_changes(head_dim=96), r"head_dim: 96 is not one of \[64, 128, 256\]"),
    ("kv_layout", with_changes(kv_layout="NCHW"), r"kv_layout: 'NCHW' is not one of"),
    ("backend", with_changes(backend="cudnn"), r"backend: 'cudnn' is not one of"),
    ("planner", with_changes(planner="gpu"), r"planner: 'gpu' is not one of"),
    ("decode_kernel", with_changes(decode_kernel="fast"), r"decode_kernel: 'fast' is not one of"),
    ("context-both", with_changes(max_pages_per_seq=32), r"max_context_len / max_pages_per_seq: give exactly one"),
    ("context-neither", with_changes(max_context_len=DROP), r"max_context_len / max_pages_per_seq: give exactly one"),
    ("float32-flashinfer", with_changes(backend="flashinfer"), r"dtype: float32 runs only on the torch backends.*flashinfer"),
    ("float32-xqa", with_changes(backend="xqa"), r"dtype: float32"),
    ("xqa-page8", with_changes(dtype="bfloat16", backend="xqa", page_size=8), r"page_size \(backend xqa\): 8 is not one of"),
]


@pytest.mark.parametrize("data, pattern", [c[1:] for c in ERROR_CASES], ids=[c[0] for c in ERROR_CASES])
def test_yaml_errors_name_the_key(tmp_path, data, pattern):
    path = write_yaml(tmp_path, data)
    with pytest.raises(ConfigError, match=pattern) as info:
        load_config(path)
    assert str(path) in str(info.value)  # errors from a file name the file too
    assert isinstance(info.value, ValueError)


# the same checks hold when the config is built in Python (no YAML, no key-set checks involved)
PY_CASES = [c for c in ERROR_CASES if c[0] not in ("unknown-key", "missing-head_dim", "missing-buckets")]


@pytest.mark.parametrize("data, pattern", [c[1:] for c in PY_CASES], ids=[c[0] for c in PY_CASES])
def test_python_errors_name_the_key(data, pattern):
    with pytest.raises(ConfigError, match=pattern):
        RuntimeConfig(**data)


def test_xqa_valid_page_size_accepted():
    cfg = RuntimeConfig(**with_changes(dtype="bfloat16", backend="xqa", page_size=32))
    assert cfg.backend == "xqa" and cfg.page_size == 32


def test_float32_torch_backends_accepted():
    for backend in ("reference", "torch-splitkv"):
        assert RuntimeConfig(**with_changes(backend=backend)).dtype == "float32"


@pytest.mark.parametrize("text, what", [
    ("- 1\n- 2\n", "list"),
    ("just a string\n", "str"),
    ("", "NoneType"),
], ids=["list", "scalar", "empty"])
def test_top_level_not_mapping(tmp_path, text, what):
    path = write_yaml(tmp_path, text)
    with pytest.raises(ConfigError, match=rf"top level must be a mapping, got {what}"):
        load_config(path)


def test_config_from_dict_not_mapping():
    with pytest.raises(ConfigError, match="top level must be a mapping"):
        config_from_dict([1, 2])


def test_missing_file(tmp_path):
    missing = tmp_path / "nope.yaml"
    with pytest.raises(ConfigError, match=r"no such file.*nope\.yaml"):
        load_config(missing)
    with pytest.raises(ConfigError, match="no such file"):
        load_config(tmp_path)  # a directory is not a config file


def test_unknown_key_lists_allowed_keys(tmp_path):
    with pytest.raises(ConfigError) as info:
        load_config(write_yaml(tmp_path, with_changes(page_szie=16)))
    msg = str(info.value)
    assert "page_szie" in msg and "allowed keys" in msg and "'page_size'" in msg


def test_public_exports():
    assert graphrt.ConfigError is ConfigError and graphrt.load_config is load_config
    assert issubclass(ConfigError, ValueError)
