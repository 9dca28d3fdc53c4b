"""`graphrt serve` command line (graphrt/serve/cli.py, config.py, graphrt/cli.py) and the serving
benchmark's CPU smoke run (tools/bench_serve.py starts the real CLI in a subprocess)."""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from _checkpoints import write

pytest.importorskip("fastapi")
pytest.importorskip("uvicorn")

from graphrt import cli as graphrt_cli  # noqa: E402
from graphrt.serve import ServeConfig  # noqa: E402
from graphrt.serve.cli import main as serve_main  # noqa: E402
from graphrt.serve.config import load_serve_yaml  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


def test_serve_config_validates():
    with pytest.raises(ValueError, match="^max_waiting: must be an int >= 0, got -1"):
        ServeConfig(max_waiting=-1)
    with pytest.raises(ValueError, match="^served_model_name"):
        ServeConfig(served_model_name="")


def test_yaml_splits_engine_and_server_keys_and_names_unknown_ones(tmp_path):
    f = tmp_path / "s.yaml"
    f.write_text("max_batch: 4\nbackend: torch-splitkv\nmax_waiting: 3\nserved_model_name: m\n")
    eng, srv = load_serve_yaml(f, ("max_batch", "backend"))
    assert eng == {"max_batch": 4, "backend": "torch-splitkv"} and srv == {"max_waiting": 3, "served_model_name": "m"}
    f.write_text("max_batch: 4\nmax_batchh: 5\n")
    with pytest.raises(ValueError, match=r"unknown key\(s\) \['max_batchh'\]"):
        load_serve_yaml(f, ("max_batch",))
    f.write_text("- 1\n")
    with pytest.raises(ValueError, match="expected a mapping"):
        load_serve_yaml(f, ("max_batch",))
    with pytest.raises(ValueError, match="--config: no such file"):
        load_serve_yaml(tmp_path / "nope.yaml", ())


def test_graphrt_command_dispatch(capsys):
    with pytest.raises(SystemExit) as e:
        graphrt_cli.main([])
    assert e.value.code == 2 and "serve" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        graphrt_cli.main(["serve", "--help"])
    assert e.value.code == 0 and "--graph-cache" in capsys.readouterr().out


@pytest.mark.parametrize("argv,text", [
    (["--model", "/nonexistent/ckpt", "--device", "cpu"], "checkpoint: '/nonexistent/ckpt' is not a directory"),
    (["--model", ".", "--device", "cpu", "--port", "0"], "--port: must be in [1, 65535]"),
    (["--model", ".", "--device", "cpu", "--max-waiting", "-2"], "max_waiting: must be an int >= 0"),
    (["--model", ".", "--device", "cpu", "--graph-cache", "/nonexistent/cache"], "no such directory; not a graph cache"),
])
def test_serve_cli_bad_arguments_exit_2_with_one_line(capsys, argv, text):
    with pytest.raises(SystemExit) as e:
        serve_main(argv)
    assert e.value.code == 2 and text in capsys.readouterr().err


def test_bench_serve_cpu_smoke(tmp_path_factory, tmp_path):
    """The benchmark end to end on CPU: the real `graphrt serve` subprocess (its start-up log),
    streaming clients at N = 1, 2, and the HF generate baseline; every request completes."""
    ckpt = write(tmp_path_factory, "bench", arch="llama", dtype="float32", seed=5)
    spec = importlib.util.spec_from_file_location("bench_serve", ROOT / "tools" / "bench_serve.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    res = bench.main(["--model", str(ckpt), "--device", "cpu", "--variants", "graphrt,graphrt-hostplan,hf",
                      "--concurrency", "1,2", "--requests", "1", "--output-len", "4", "--prompt-lens", "3,9",
                      "--out-dir", str(tmp_path), "--name", "smoke", "--time-budget-s", "120"])
    for variant in ("graphrt", "hf"):
        for n in (1, 2):
            r = res["variants"][variant][n]
            assert r["requests"] == n and not r["errors"], r
            assert 0 < r["ttft_p50_ms"] <= r["ttft_p99_ms"] and 0 < r["tpot_p50_ms"] <= r["tpot_p99_ms"]
            assert r["tokens_per_s"] > 0
    assert "skipped" in res["variants"]["graphrt-hostplan"]
    saved = json.loads((tmp_path / "smoke.json").read_text())
    assert set(saved["variants"]) == {"graphrt", "graphrt-hostplan", "hf"}
    assert "| graphrt | 2 | 2 |" in (tmp_path / "smoke.md").read_text()
    assert set(res["graph_step_ms"]) == {1, 2} and all(v > 0 for v in res["graph_step_ms"].values())
    log = (tmp_path / "smoke_graphrt.log").read_text()
    for line in ("loading ", "weights: llama torch.float32", "tokenizer + runtime: ",
                 "engine: backend torch-splitkv", "serving 'bench'"):
        assert line in log, log


def test_capture_report_sums_the_runtime_capture_stats():
    from types import SimpleNamespace

    from graphrt.attention.graphs import CaptureStats
    from graphrt.serve.cli import capture_report
    argmax = SimpleNamespace(stats={1: CaptureStats(1, 10.0, 500.0, 2**20), 2: CaptureStats(2, 20.0, 100.0, 2**20)})
    sampled = SimpleNamespace(stats={1: CaptureStats(1, 30.0, 400.0, 2**21)})
    llm = SimpleNamespace(runtime=SimpleNamespace(graphs=argmax, sample_graphs=sampled),
                          checkpoint=SimpleNamespace(load_s=2.0))
    assert capture_report(llm, 5.0) == [
        "kernels (graph warm-up: compile or load from cache, first touch): 1.00 s",
        "graph capture: 3 graphs (2 per bucket) in 0.06 s, 4.0 MiB",
        "tokenizer + runtime construction: 1.94 s"]
    eager = SimpleNamespace(runtime=SimpleNamespace(graphs=None, sample_graphs=None),
                            checkpoint=SimpleNamespace(load_s=2.0))
    assert capture_report(eager, 3.5) == ["tokenizer + runtime: 1.50 s (no CUDA graphs: eager decode)"]
