"""The user docs: the README's doc table lists every doc, its set-up commands are the ones the
project supports, the CPU install pulls no CUDA package (FlashInfer only in the `gpu` extra), the
docs speak to users about graphrt, not about the place it is built in, and every path they name
exists. The product apart from the lab: no file under tools/ or docs/results/ named after a round
or a date, tools/device/ at most 12 files each documented in docs/DEVELOPING.md, docs/benchmarks.md
at most 400 lines, organised by question, naming every benchmark tool."""
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


# the product apart from the lab: no file named after a round or a date, the device scripts few and
# documented, the benchmarks doc short and by question, every path the docs name present
LAB_NAME = re.compile(r"(^|[_\-.])(round\d*[a-z]?|final\d*)([_\-.]|$)|\d{4}-\d{2}-\d{2}", re.IGNORECASE)
QUESTIONS = ("The step and its floor", "Attention", "Speculation", "Serving", "Prefill and first tokens",
             "Start-up", "FP8", "Tensor parallel")


def _tracked(under: str) -> list[Path]:
    return [p for p in (ROOT / under).rglob("*") if p.is_file() and "__pycache__" not in p.parts]


def test_no_file_named_after_a_round_or_a_date():
    bad = [str(p.relative_to(ROOT)) for d in ("tools", "docs/results") for p in _tracked(d)
           if any(LAB_NAME.search(part) for part in p.relative_to(ROOT / d).parts)]
    assert not bad, bad


def test_device_scripts_are_few_and_documented():
    developing = (ROOT / "docs" / "DEVELOPING.md").read_text()
    files = _tracked("tools/device")
    assert len(files) <= 12, sorted(p.name for p in files)
    missing = [p.name for p in files if f"tools/device/{p.name}" not in developing]
    assert not missing, f"tools/device/ files docs/DEVELOPING.md does not name: {missing}"


def test_benchmarks_doc_is_short_by_question_and_names_every_tool():
    text = (ROOT / "docs" / "benchmarks.md").read_text()
    assert len(text.splitlines()) <= 400
    headings = re.findall(r"^## (.+)$", text, flags=re.M)
    assert [h for h in headings if h in QUESTIONS] == list(QUESTIONS), headings
    tools = [p.name for p in (ROOT / "tools").glob("bench_*.py")]
    assert [t for t in tools if f"tools/{t}" not in text] == []


def _expand(path: str) -> list[str]:
    m = re.search(r"\{([^{}]*)\}", path)
    if not m:
        return [path]
    return [x for alt in m.group(1).split(",") for x in _expand(path[:m.start()] + alt + path[m.end():])]


def test_paths_the_docs_name_exist():
    missing = []
    for path in [ROOT / "README.md", *DOCS]:
        for ref in re.findall(r"((?:docs/results|tools)/[A-Za-z0-9_./{},*+-]*[A-Za-z0-9_/}*])", path.read_text()):
            for p in _expand(ref):
                if not (list(ROOT.glob(p)) if "*" in p else (ROOT / p).exists()):
                    missing.append(f"{path.relative_to(ROOT)}: {p}")
    assert not missing, "\n".join(missing)
