"""tools/quantize_int4.py: GPTQ beats round-to-nearest on the calibration activations' output error
(the objective GPTQ minimises), the written checkpoint is a GPTQ file graphrt loads (act-order,
v1 and v2 zeros) with the tool's own codes, and bad arguments are argparse errors (exit 2)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from _checkpoints import write

TOOLS = Path(__file__).resolve().parents[1] / "tools"
sys.path.insert(0, str(TOOLS))

import quantize_int4  # noqa: E402


@pytest.mark.parametrize("sym,act_order", [(False, False), (True, True)])
def test_gptq_output_error_below_rtn(sym, act_order):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(512, 128, generator=g) @ torch.randn(128, 128, generator=g)   # correlated inputs
    x[:, :8] *= 10                                                                 # a few salient channels
    w = torch.randn(64, 128, generator=g)
    h = x.T @ x
    out = {}
    for name, hh, ao in (("rtn", None, False), ("gptq", h, act_order)):
        codes, scale, zero, g_idx = quantize_int4.quantize_layer(w, hh, 32, sym, ao, 0)
        gi = g_idx.long()
        q = (codes.float() - zero[:, gi]) * scale[:, gi]
        out[name] = float(((x @ (w - q).T) ** 2).sum())
        assert codes.min() >= 0 and codes.max() <= 15
        assert torch.equal(torch.bincount(gi), torch.full((4,), 32))
    assert out["gptq"] < 0.8 * out["rtn"], out


def test_written_checkpoint_loads(tmp_path_factory, tmp_path):
    from graphrt.checkpoint.loader import load_checkpoint
    from graphrt.model.quant.int4 import Int4Weight
    src = write(tmp_path_factory, "q4tool", arch="llama", dtype="bfloat16")
    for fmt in ("gptq", "gptq_v2"):
        out = tmp_path / fmt
        assert quantize_int4.main([str(src), str(out), "--group-size", "32", "--act-order", "--format", fmt,
                                   "--calib-files", "3", "--calib-window", "48", "--device", "cpu"]) == 0
        q = json.loads((out / "config.json").read_text())["quantization_config"]
        assert q["checkpoint_format"] == fmt and q["desc_act"] and q["bits"] == 4
        ck = load_checkpoint(out, dtype=torch.float32)
        w = ck.weights["layers"][0]["down"]
        assert isinstance(w, Int4Weight) and w.perm is not None
        f = load_checkpoint(src, dtype=torch.float32).weights["layers"][0]["down"]
        err = (w.dequantize() - f).abs() / w.scale.float().amax()
        assert float(err.mean()) < 1.0                        # close to the float weights it came from


@pytest.mark.parametrize("args,match", [(["--method", "rtn", "--act-order"], "--act-order needs --method gptq"),
                                        (["--group-size", "48"], "--group-size: invalid choice"),
                                        (["--calib-files", "0"], "--calib-files must be >= 1")])
def test_bad_arguments_exit_2(tmp_path, args, match):
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "config.json").write_text("{}")
    r = subprocess.run([sys.executable, str(TOOLS / "quantize_int4.py"), str(tmp_path / "src"), str(tmp_path / "o"),
                        *args], capture_output=True, text=True)
    assert r.returncode == 2 and match in r.stderr
