"""Per-row sampling parameters: the host-side inputs of one decode call and their static buffers.

`SamplingInputs` (one decode call, n rows, CPU or device tensors) is copied by
`SamplingBuffers.load` into static device buffers that a captured graph reads; the padded tail is
reset to greedy. The kernel (kernels/sample.py) advances `step` on the device, once per step of
a K-step graph; the caller passes each row's draw index again on the next call (the host owns it).
"""
from __future__ import annotations

from dataclasses import dataclass, fields

import torch

from graphrt.kernels.ops import KernelOps, default_ops
from graphrt.kernels.transfer import to_device

_DTYPES = {"temperature": torch.float32, "top_k": torch.int32, "top_p": torch.float32,
           "seed": torch.int64, "step": torch.int32}


@dataclass(frozen=True)
class SamplingInputs:
    """One decode call's per-row sampling parameters, each [n] (CPU, pinned CPU or device).

    temperature float32 (0 = greedy), top_k int32 (0 = off), top_p float32 in (0, 1] (1 = off),
    seed int64, step int32 (draw index of the row's first token in this call: tokens the request
    has sampled so far).
    """

    temperature: torch.Tensor
    top_k: torch.Tensor
    top_p: torch.Tensor
    seed: torch.Tensor
    step: torch.Tensor

    def check(self, n: int, device: torch.device) -> None:
        """ValueError naming the field when a shape, dtype or device does not fit n rows."""
        for f in fields(self):
            t = getattr(self, f.name)
            if not isinstance(t, torch.Tensor):
                raise TypeError(f"sampling.{f.name}: expected a torch.Tensor, got {type(t).__name__}")
            if tuple(t.shape) != (n,) or t.dtype != _DTYPES[f.name]:
                raise ValueError(f"sampling.{f.name}: {tuple(t.shape)} {t.dtype}, expected "
                                 f"[{n}] {_DTYPES[f.name]}")
            if t.device not in (device, torch.device("cpu")):
                raise ValueError(f"sampling.{f.name}: on {t.device}, expected {device} or cpu")


@dataclass(frozen=True)
class SamplingBuffers:
    """Static per-row sampling parameters on the runtime device, [B] each (see SamplingInputs).
    Allocated once at the largest bucket; `view(size)` gives the first `size` rows."""

    temperature: torch.Tensor
    top_k: torch.Tensor
    top_p: torch.Tensor
    seed: torch.Tensor
    step: torch.Tensor

    @classmethod
    def allocate(cls, max_batch: int, device: torch.device) -> "SamplingBuffers":
        return cls(**{name: torch.zeros(max_batch, dtype=dt, device=device)
                      for name, dt in _DTYPES.items()})

    def view(self, size: int) -> "SamplingBuffers":
        return SamplingBuffers(**{f.name: getattr(self, f.name)[:size] for f in fields(self)})

    def load(self, inputs: SamplingInputs, n: int) -> None:
        """Inputs -> rows [0, n) (non-blocking copies); padded tail rows [n, B) -> greedy."""
        for f in fields(self):
            getattr(self, f.name)[:n].copy_(getattr(inputs, f.name), non_blocking=True)
        self.temperature[n:].zero_()

    def sample(self, logits: torch.Tensor, out: torch.Tensor, *, ops: KernelOps | None = None) -> None:
        """logits [B, V] float32 -> out [B] int64; advances step (capturable). ops: the kernel
        set that draws (kernels/ops.py; None: Triton's)."""
        default_ops(ops).sample_tokens(logits, self.temperature, self.top_k, self.top_p, self.seed, self.step, out)



def sample_eager(logits: torch.Tensor, inputs: SamplingInputs, *, ops: KernelOps | None = None) -> torch.Tensor:
    """Outside a graph (e.g. a prefill's first token): logits [n, V] float32 -> [n] int64 tokens
    on logits' device; `inputs` is left unchanged (its step is copied, not advanced). ops: the
    kernel set that draws (None: Triton's)."""
    n, dev = logits.shape[0], logits.device
    inputs.check(n, dev)
    out = torch.empty(n, dtype=torch.int64, device=dev)
    args = {f.name: to_device(getattr(inputs, f.name), dev) for f in fields(inputs)}   # no host sync
    args["step"] = args["step"].clone()
    default_ops(ops).sample_tokens(logits.contiguous(), args["temperature"], args["top_k"], args["top_p"],
                                   args["seed"], args["step"], out)
    return out


__all__ = ["SamplingInputs", "SamplingBuffers", "sample_eager"]
