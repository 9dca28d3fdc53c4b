"""The user docs: the README's doc table lists every doc, its set-up commands are the ones the
project supports, the CPU install pulls no CUDA package (FlashInfer only in the `gpu` extra), and
the docs speak to users about graphrt, not about the place it is built in."""
from __future__ import annotations

import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()
DOCS = sorted((ROOT / "docs").rglob("*.md"))
CPU_SETUP = 'pip install torch==2.13.0 && pip install -e ".[test]" && graphrt-capture --config configs/tiny.yaml'
GPU_INSTALL = 'pip install -e ".[gpu,test]"'
# words about where graphrt is built, not about graphrt: no tracker numbers, no "this machine"
PLACE = re.compile(r"\bissues? \d+|\bthis machine\b|\bsessions?\b|\bhelpers?\b|\bthe lead\b|\blead's\b|"
                   r"pip index of this project", re.IGNORECASE)


def _doc_table() -> set[str]:
    part = README.split("## Documentation", 1)[1]
    return set(re.findall(r"^\| `(docs/[^`]+)` \|", part, flags=re.M))


def test_doc_table_lists_every_doc():
    listed = _doc_table()
    top = {f"docs/{p.name}" for p in DOCS if p.parent.name == "docs"}
    assert top - listed == set(), f"docs missing from the README's doc table: {sorted(top - listed)}"
    assert all((ROOT / d).exists() for d in listed), listed
    if any(p.parent.name != "docs" for p in DOCS):
        assert "docs/results/" in listed


def test_setup_commands():
    assert CPU_SETUP in README and "\n    python -m pytest -q\n" in README
    assert GPU_INSTALL in README                       # FlashInfer through the gpu extra,
    assert 'pip install "flashinfer-python' not in README   # not installed by hand


def test_cpu_install_pulls_no_cuda_package():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    cpu = project["dependencies"] + extras["test"] + extras["serve"]
    assert not [d for d in cpu if re.match(r"(flashinfer|nvidia-|cuda-)", d)], cpu
    assert any(d.startswith("flashinfer-python") for d in extras["gpu"])


def test_docs_speak_to_users():
    bad = []
    for path in [ROOT / "README.md", *DOCS]:
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if PLACE.search(line):
                bad.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()}")
    assert not bad, "\n".join(bad)
