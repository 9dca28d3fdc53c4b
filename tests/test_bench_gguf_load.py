"""tools/bench_gguf_load.py: bad flags exit 2 naming the flag; the tool end to end on CPU over a tiny
synthetic GGUF (per-type rows bit-equal to the gguf package, the whole-file rows) writes its JSON."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from _checkpoints import tool_module



def _tool():
    return tool_module("bench_gguf_load")


@pytest.mark.parametrize("args, flag", [
    (["--types", "Q4_0,IQ4_NL"], "--types"), (["--file-type", "F16"], "--file-type"), (["--cols", "100"], "--cols"),
    (["--repeats", "0"], "--repeats"), (["--gguf", "missing.gguf"], "--gguf"), (["--shape", "huge"], "--shape"),
    (["--layers", "0"], "--layers")])
def test_bad_flags_exit_2_naming_the_flag(capsys, args, flag):
    with pytest.raises(SystemExit) as e:
        _tool().parse_args(args)
    assert e.value.code == 2 and flag in capsys.readouterr().err


def test_smoke_on_cpu_writes_json(tmp_path, capsys):
    out = tmp_path / "gguf.json"
    _tool().main(["--types", "Q4_1,Q6_K", "--rows", "4", "--cols", "512", "--repeats", "1", "--shape", "tiny",
                  "--workdir", str(tmp_path), "--out", str(out)])
    res = json.loads(out.read_text())
    assert [r["type"] for r in res["types"]] == ["Q4_1", "Q6_K"]
    assert all(r["bit_equal"] and r["torch_host_mws"] > 0 and r["numpy_mws"] > 0 for r in res["types"])
    f = res["file"]
    assert f["bytes"] == Path(f["file"]).stat().st_size and f["weights"] > 0 and f["dtype"] == "torch.float32"
    assert f["load_cold_s"] > 0 and f["read_cold_s"] > 0
    assert "load_checkpoint cold" in capsys.readouterr().out
