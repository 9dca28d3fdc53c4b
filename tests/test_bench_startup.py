"""tools/bench_startup.py's LLM and serve rows on CPU (the tiny shape, Triton's interpreter): one
fresh process per row, the StartupTimes split in the JSON, the serve row ready on /health (or
skipped with a note where fastapi / uvicorn are missing)."""
from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

TOOLS = Path(__file__).resolve().parent.parent / "tools"
if str(TOOLS) not in sys.path:
    sys.path.insert(0, str(TOOLS))

import bench_startup  # noqa: E402


def test_llm_and_serve_rows_on_cpu(tmp_path, capsys):
    out = tmp_path / "startup.json"
    assert bench_startup.main(["--what", "llm,serve", "--shapes", "tiny", "--device", "cpu", "--llm-modes", "cold",
                               "--first-tokens", "2", "--max-batch", "2", "--workdir", str(tmp_path / "w"),
                               "--out", str(out)]) == 0
    llm, serve = json.loads(out.read_text())["llm"]
    assert llm["row"] == "LLM tiny" and llm["mode"] == "cold" and llm["tokens"] == 2
    s = llm["startup"]
    assert llm["ready_s"] >= llm["torch_import_s"] + s["total_s"] > 0
    assert s["config_s"] + s["read_s"] <= s["weights_s"] and s["tokenizer_s"] <= s["engine_s"]
    assert llm["triton_compiled"] == 0                       # the interpreter compiles nothing
    if importlib.util.find_spec("fastapi") and importlib.util.find_spec("uvicorn"):
        assert serve["ready_s"] > 0 and serve["startup_line"].startswith("startup: ready in ")
    else:
        assert "not installed" in serve["skipped"]
    table = capsys.readouterr().out
    assert "LLM tiny" in table and "serve tiny" in table


def test_bad_choices_are_refused(capsys):
    import pytest
    for argv in (["--what", "llm,nope"], ["--what", "llm", "--llm-modes", "lukewarm"]):
        with pytest.raises(SystemExit):
            bench_startup.main(argv)
        assert "unknown" in capsys.readouterr().err
