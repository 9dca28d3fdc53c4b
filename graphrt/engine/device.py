"""Default device and Triton mode for the entry points (`LLM`, `graphrt serve`).

    dev = resolve_device(None)        # cuda if torch sees a GPU, else cpu
    select_triton_mode(dev)           # cpu: Triton's interpreter, before graphrt's kernels load

Triton decides at decoration time whether a kernel is compiled for a GPU driver or run by its
interpreter (`TRITON_INTERPRET=1`), so the choice must be made before any `graphrt.kernels`
module is imported. `import graphrt` imports no kernel; the entry points call
`select_triton_mode` first thing. Nothing here runs at import.
"""
from __future__ import annotations

import os
import sys

import torch

INTERPRET_VAR = "TRITON_INTERPRET"
_TRUE = ("1", "true", "on", "yes")


def resolve_device(device) -> torch.device:
    """None / "auto" -> cuda when available, else cpu; "cuda", "cuda:N", "cpu" or a torch.device
    as given. Raises ValueError for anything else, or cuda without CUDA."""
    if device is None or device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if not isinstance(device, (str, torch.device)) or str(device).split(":")[0] not in ("cuda", "cpu"):
        raise ValueError(f"device: {device!r} is not 'cuda', 'cpu' or 'auto'")
    dev = torch.device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError("device: 'cuda' requested but CUDA is not available (use device='cpu' or leave it out)")
    return dev


def check_device_support(device: torch.device, dtype: str | None) -> None:
    """What a device can run, checked before anything loads. CPU: float32 only (the interpreted
    kernels and the torch references are float32; bf16 / fp16 there diverge from float32): a
    ValueError naming dtype. CUDA: FlashInfer and Triton must be installed (FlashInferMissing /
    TritonMissing, ImportErrors with the install line; a CPU needs neither)."""
    if device.type == "cpu" and dtype not in (None, "float32"):
        raise ValueError(f"dtype: {dtype!r} on the CPU; graphrt runs float32 only there "
                         f"(leave dtype out, or use device='cuda')")
    if device.type == "cuda":
        from graphrt.attention.flashinfer_import import require_flashinfer
        from graphrt.kernels.triton_import import require_triton
        require_flashinfer(f"device {str(device)!r}")
        require_triton(f"device {str(device)!r}")


def available_bytes(device: torch.device) -> int:
    """Memory a new allocation on `device` can take now: CUDA's free memory, or the host's
    MemAvailable (/proc/meminfo; else free physical pages)."""
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def compiled_kernels_loaded() -> list[str]:
    """Names of modules already imported with Triton functions bound to a GPU driver (a
    JITFunction rather than the interpreter's): graphrt's kernel modules, and Triton's own
    language helpers (`tl.sum`, `tl.max`, ... are decorated when Triton is first imported).
    Imports nothing: a Triton that is not loaded yet has bound nothing."""
    jit = sys.modules.get("triton.runtime.jit")
    if jit is None:
        return []
    found = []
    for name, mod in list(sys.modules.items()):
        if mod is not None and (name.startswith("graphrt.kernels.") or name == "triton.language.standard"):
            if any(isinstance(v, jit.JITFunction) for v in list(vars(mod).values())):
                found.append(name)
    return sorted(found)


def select_triton_mode(device: torch.device) -> None:
    """On a CPU device, run graphrt's Triton kernels through Triton's interpreter: sets
    TRITON_INTERPRET=1 in this process unless it is already set. Raises ValueError (one line
    saying what to do) when the interpreter was switched off explicitly or the kernels were
    already imported for a GPU driver. A CUDA device changes nothing."""
    if device.type != "cpu":
        return
    value = os.environ.get(INTERPRET_VAR)
    if value is not None and value.strip().lower() not in _TRUE:
        raise ValueError(f"device: 'cpu' runs graphrt's Triton kernels through the interpreter, but "
                         f"{INTERPRET_VAR}={value!r} is set: unset it or set {INTERPRET_VAR}=1")
    bound = compiled_kernels_loaded()
    if bound:
        raise ValueError(f"device: 'cpu' needs Triton's interpreter, but {bound[0]} was imported for a GPU "
                         f"driver first: set {INTERPRET_VAR}=1 in the environment (or before importing triton "
                         f"or graphrt's kernels)")
    os.environ[INTERPRET_VAR] = "1"


__all__ = ["available_bytes", "resolve_device", "check_device_support", "select_triton_mode", "compiled_kernels_loaded", "INTERPRET_VAR"]
