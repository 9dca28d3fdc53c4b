"""What a device can run, refused before anything loads (graphrt/engine/device.py
check_device_support): on a CPU only float32 (bf16 / fp16 there diverged from float32 with
overflow warnings from the interpreter); a ValueError naming dtype, from `LLM` and its config."""
from __future__ import annotations

import pytest
import torch

from _checkpoints import write
from graphrt.engine.device import check_device_support

CPU = torch.device("cpu")


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_llm_on_cpu_refuses_other_dtypes(tmp_path_factory, dtype):
    from graphrt import LLM
    ckpt = write(tmp_path_factory, "dtype", arch="llama", dtype="float32", seed=2)
    with pytest.raises(ValueError, match=f"^dtype: '{dtype}' on the CPU; graphrt runs float32 only"):
        LLM(ckpt, device="cpu", dtype=dtype)
    if not torch.cuda.is_available():                     # the default device of a CPU host, too
        with pytest.raises(ValueError, match=f"^dtype: '{dtype}' on the CPU"):
            LLM(ckpt, dtype=dtype)


def test_check_device_support_rules():
    check_device_support(CPU, None)
    check_device_support(CPU, "float32")
    with pytest.raises(ValueError, match="^dtype: 'bfloat16' on the CPU"):
        check_device_support(CPU, "bfloat16")
