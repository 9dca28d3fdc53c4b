"""tools/bench_real_model.py: bad flags exit 2 naming the flag; the whole tool end to end on CPU
(--smoke) over a tiny Llama GGUF (tests/_gguf_files.py) writes its JSON and table."""
from __future__ import annotations

import json

import pytest

from _checkpoints import tool_module, write
from _gguf_files import write_gguf



def _tool():
    return tool_module("bench_real_model")


@pytest.mark.parametrize("args, flag", [
    (["--gguf", "missing.gguf"], "--gguf"), (["--streams", "1,x"], "--streams"), (["--streams", "0"], "--streams"),
    (["--prompts", "0"], "--prompts"), (["--tokens", "1"], "--tokens"), (["--max-tokens", "0"], "--max-tokens")])
def test_bad_flags_exit_2_naming_the_flag(tmp_path, capsys, args, flag):
    real = tmp_path / "m.gguf"
    real.write_bytes(b"GGUF")
    argv = args if args[0] == "--gguf" else ["--gguf", str(real), *args]
    with pytest.raises(SystemExit) as e:
        _tool().parse_args(argv)
    assert e.value.code == 2 and flag in capsys.readouterr().err


def test_smoke_on_cpu_writes_json_and_table(tmp_path_factory, tmp_path):
    pytest.importorskip("transformers")
    src = write(tmp_path_factory, "bench_real_src", arch="llama", dtype="float32", seed=6)
    cfg = json.loads((src / "config.json").read_text())
    cfg.pop("rope_scaling")                           # transformers' GGUF reader skips rope_freqs
    (src / "config.json").write_text(json.dumps(cfg))
    gguf = write_gguf(src, tmp_path / "tiny.Q8_0.gguf", qtype="Q8_0")
    out = tmp_path / "r.json"
    assert _tool().main(["--gguf", str(gguf), "--smoke", "--device", "cpu", "--out", str(out)]) == 0
    res = json.loads(out.read_text())
    assert res["agreement"]["graphrt"]["of"] == 2 and res["agreement"]["graphrt"]["agree"] == 2
    got = {(r["variant"], r["workload"], r["streams"]) for r in res["rates"]}
    assert got == {(v, "chat", 1) for v in ("graphrt", "graphrt-ngram", "hf-generate")}
    assert all(r["tokens_per_s_per_stream"] > 0 for r in res["rates"])
    assert "| graphrt | chat |" in out.with_suffix(".md").read_text()


def test_llama_bench_row_from_its_json_and_a_failure_in_one_line(tmp_path, capsys):
    tool = _tool()
    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"GGUF")
    ok = tmp_path / "llama-bench"
    ok.write_text('#!/bin/sh\necho \'[{"n_gen": 128, "avg_ts": 123.5, "stddev_ts": 1.5, "build_commit": "abc", '
                  '"build_number": 7, "backends": "CUDA", "gpu_info": "GPU"}]\'\n')
    ok.chmod(0o755)
    r = tool.llama_bench(ok, gguf, 128)
    assert r["tokens_per_s"] == 123.5 and r["stdev"] == 1.5 and r["build"] == "abc (7)"
    assert r["command"].split()[1:] == ["-m", str(gguf), "-ngl", "99", "-p", "0", "-n", "128", "-r", "5", "-o", "json"]
    res = {"streams": [1, 8], "rates": [{"variant": "graphrt", "workload": "chat", "streams": s,
                                         "tokens_per_s_per_stream": 10.0 * s} for s in (1, 8)],
           "agreement": {}, "llama_cpp": r}
    assert "| llama.cpp (llama-bench tg) | generation | 123.5 | - |" in tool.table(res).splitlines()
    bad = tmp_path / "bad-bench"
    bad.write_text("#!/bin/sh\necho 'error: unable to load model' >&2\nexit 1\n")
    bad.chmod(0o755)
    r = tool.llama_bench(bad, gguf, 128)
    assert r["error"] == "rc 1: error: unable to load model"
    assert "llama.cpp" not in tool.table({**res, "llama_cpp": r})
    with pytest.raises(SystemExit) as e:
        tool.parse_args(["--gguf", str(gguf), "--llama-bench", str(tmp_path / "missing")])
    assert e.value.code == 2 and "--llama-bench" in capsys.readouterr().err
