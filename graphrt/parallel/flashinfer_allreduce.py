"""FlashInfer's one-shot all-reduce (the TensorRT-LLM kernel over CUDA IPC peer memory): the
only module of graphrt that touches `flashinfer.comm`.

    oneshot = open_oneshot(tp, max_tokens=16, hidden=4096, dtype=torch.bfloat16, device=dev)
    if oneshot is not None and oneshot.accepts(x):
        y = oneshot(x)                       # [T, H] sum over the ranks, a new tensor; capturable

FlashInfer >= 0.6 (read against 0.7.x): `flashinfer.comm.create_allreduce_fusion_workspace(
backend="trtllm", world_size, rank, max_token_num, hidden_dim, dtype)` builds the IPC workspace
(a collective over the default process group: every rank calls it together) and
`flashinfer.comm.allreduce_fusion(input, workspace, pattern=AllReduceFusionPattern.kAllReduce,
output=..., use_oneshot=True)` runs it. The "trtllm" backend is chosen explicitly: it reads
peers' buffers over NVLink through CUDA IPC handles; the "mnnvl" backend (NVLink multicast /
fabric memory) is never asked for, so multicast stays off.

Every failure to set it up (no FlashInfer, an older FlashInfer without this API, a world size
or dtype it refuses, a workspace error) returns None after one WARNING naming the reason: the
caller then uses NCCL for every message. Import is lazy (inside open_oneshot).
"""
from __future__ import annotations

import logging

import torch

log = logging.getLogger("graphrt.parallel")

DTYPES = (torch.bfloat16, torch.float16)


class OneShot:
    """A FlashInfer workspace for [<= max_tokens, hidden] messages of one dtype on one device."""

    def __init__(self, comm, workspace, *, max_tokens: int, hidden: int, dtype: torch.dtype, device):
        self._comm, self._workspace = comm, workspace
        self.max_tokens, self.hidden, self.dtype, self.device = max_tokens, hidden, dtype, torch.device(device)

    def accepts(self, x: torch.Tensor) -> bool:
        """x [T, hidden] contiguous, T <= max_tokens, in the workspace's dtype and device."""
        return (x.dim() == 2 and x.shape[1] == self.hidden and 0 < x.shape[0] <= self.max_tokens
                and x.dtype == self.dtype and x.device == self.device and x.is_contiguous())

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.empty_like(x)                # the graph's pool inside a capture
        self._comm.allreduce_fusion(input=x, workspace=self._workspace,
                                    pattern=self._comm.AllReduceFusionPattern.kAllReduce,
                                    output=out, use_oneshot=True)
        return out


def open_oneshot(tp, *, max_tokens: int, hidden: int, dtype: torch.dtype, device) -> OneShot | None:
    """Every rank at once (a collective): the one-shot all-reduce for this group, or None
    (logged at WARNING with the reason; NCCL then carries every all-reduce)."""
    def fallback(why: str) -> None:
        log.warning("tensor parallel: FlashInfer one-shot all-reduce unavailable (%s); NCCL for every "
                    "all-reduce", why)

    if torch.device(device).type != "cuda":
        return fallback(f"device {device} is not CUDA")
    if dtype not in DTYPES:
        return fallback(f"dtype {dtype} (the kernel takes {[str(d) for d in DTYPES]})")
    try:
        from graphrt.attention.flashinfer_import import import_flashinfer
        comm = import_flashinfer("one-shot all-reduce", "flashinfer.comm")
    except Exception as e:                                  # FlashInferMissing, or a broken install
        return fallback(f"import flashinfer.comm: {type(e).__name__}: {e}")
    missing = [n for n in ("create_allreduce_fusion_workspace", "allreduce_fusion", "AllReduceFusionPattern")
               if not hasattr(comm, n)]
    if missing:
        version = getattr(__import__("flashinfer"), "__version__", "?")
        return fallback(f"flashinfer {version} has no flashinfer.comm.{', '.join(missing)}")
    try:
        ws = comm.create_allreduce_fusion_workspace(backend="trtllm", world_size=tp.world_size, rank=tp.rank,
                                                    max_token_num=max_tokens, hidden_dim=hidden, dtype=dtype)
        one = OneShot(comm, ws, max_tokens=max_tokens, hidden=hidden, dtype=dtype, device=device)
        x = torch.full((1, hidden), float(tp.rank + 1), dtype=dtype, device=device)
        got = one(x)                                        # checked once against the exact sum
        want = tp.world_size * (tp.world_size + 1) / 2
        if not bool((got == want).all()):
            return fallback(f"a check sum gave {got.flatten()[:4].tolist()}, expected {want}")
    except Exception as e:                                  # the library's own error, whatever its type
        return fallback(f"{type(e).__name__}: {e}")
    return one


__all__ = ["OneShot", "open_oneshot"]
