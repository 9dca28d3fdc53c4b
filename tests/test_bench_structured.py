"""tools/bench_structured.py on CPU: a smoke run over the tiny shape (free, JSON-constrained, and a
free stream beside a constrained one: TPOT rows, their ratios, the table) and its bad flags
(exit 2, one line naming the flag)."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

TOOLS = Path(__file__).resolve().parent.parent / "tools"
if str(TOOLS) not in sys.path:
    sys.path.insert(0, str(TOOLS))

import bench_structured  # noqa: E402

pytest.importorskip("xgrammar")


def test_smoke_run_writes_rows_and_ratios(tmp_path):
    out = tmp_path / "res" / "structured"
    assert bench_structured.main(["--shapes", "tiny", "--device", "cpu", "--tokens", "4", "--reps", "1",
                                  "--cases", "free", "json", "free+free", "free+json",
                                  "--workdir", str(tmp_path / "w"), "--out", str(out)]) == 0
    data = json.loads(out.with_suffix(".json").read_text())
    cases = {r["case"]: r for r in data["rows"]}
    assert set(cases) == {"free", "json", "free+free", "free+json"}
    assert cases["free+json"]["streams"] == ["free", "json"] and len(cases["free+json"]["tpot_ms"]) == 2
    assert cases["free"]["tokens"] == [4] and all(t > 0 for r in data["rows"] for t in r["tpot_ms"])
    assert {x["what"] for x in data["ratios"]} == {"json / free", "free+json / free+free"}
    assert "| json / free |" in out.with_suffix(".md").read_text()


@pytest.mark.parametrize("args, flag", [
    (["--shapes", "3b"], "--shapes"), ([], "--shapes"), (["--shapes", "tiny", "--tokens", "1"], "--tokens"),
    (["--shapes", "tiny", "--reps", "0"], "--reps"),
])
def test_bad_flags_exit_2_naming_them(args, flag, capsys):
    assert bench_structured.main(args) == 2
    err = capsys.readouterr().err
    assert flag in err and len(err.strip().splitlines()) == 1


def test_a_model_that_is_not_a_checkpoint_is_refused(tmp_path, capsys):
    assert bench_structured.main([str(tmp_path)]) == 2
    assert "models:" in capsys.readouterr().err
    assert bench_structured.main([str(tmp_path / "missing.gguf"), "--chat"]) == 2       # a .gguf that is not there
    err = capsys.readouterr().err
    assert "models:" in err and "missing.gguf" in err and len(err.strip().splitlines()) == 1
    with pytest.raises(SystemExit) as e:                                               # an unknown --spec
        bench_structured.main(["--shapes", "tiny", "--spec", "eagle"])
    assert e.value.code == 2


def test_ratios_name_what_launching_ahead_gains():
    """`serial / ahead`: the default engine's TPOT (--spec none: the next forward launched by the
    next block) over --spec none-ahead's (launched right after the draw), per case it applies to."""
    row = lambda spec, case, t: {"model": "m", "spec": spec, "case": case, "tpot_ms": [t]}  # noqa: E731
    rows = [row("none", "free", 1.0), row("none", "json", 1.2), row("none-ahead", "free", 1.0),
            row("none-ahead", "json", 1.5)]
    got = {(r["spec"], r["what"]): r["ratio"] for r in bench_structured.ratios(rows)}
    assert got[("none", "json serial / ahead")] == pytest.approx(1.2 / 1.5)
    assert got[("none", "json / free")] == pytest.approx(1.2)
    assert got[("none-ahead", "json / free")] == pytest.approx(1.5)
    assert not any("serial" in w for s, w in got if s == "none-ahead")
