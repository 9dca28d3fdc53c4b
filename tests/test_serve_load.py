"""tools/serve_load.py's per-request records (bench_serve's load generator), and the bad arguments
profile_step --mixed / --decode-backend refuse (exit 2 naming the flag)."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tools"))

from serve_load import summarize  # noqa: E402


def test_summarize_keeps_each_request_in_send_order():
    rs = [{"ttft_s": 0.05, "tpot_s": 0.006, "tokens": 4, "sent_s": 0.010, "prompt_len": 32},
          {"ttft_s": 0.09, "tpot_s": 0.007, "tokens": 4, "sent_s": 0.002, "prompt_len": 1024}]
    out = summarize(rs, 1.0, [])
    assert out["per_request"] == [[2.0, 1024, 90.0], [10.0, 32, 50.0]]
    assert out["requests"] == 2 and out["ttft_p50_ms"] in (50.0, 90.0)
    assert "per_request" not in summarize([{"ttft_s": 0.1, "tpot_s": 0.01, "tokens": 2}], 1.0, [])


@pytest.mark.parametrize("argv,field", [(["--mixed", "-1"], "--mixed"), (["--chunk-at", "64"], "--chunk-at"),
                                        (["--decode-backend", "fused"], "--decode-backend")])
def test_profile_step_refuses_a_bad_chunk(argv, field, capsys):
    from profile_step import main
    with pytest.raises(SystemExit) as e:
        main(argv)
    assert e.value.code == 2 and field in capsys.readouterr().err
