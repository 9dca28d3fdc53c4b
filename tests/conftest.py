"""Test setup: Triton kernels run through the interpreter on CPU-only machines; `gpu` tests skip there;
shared fixtures (`ckpt_8b`: the 8B-shaped random checkpoint of the GPU tests)."""
import os

import pytest
import torch

HAS_CUDA = torch.cuda.is_available()
if not HAS_CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before any graphrt kernel is imported
_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
if _WORKERS > 1:  # an xdist worker: the machine's cores shared among the workers, not oversubscribed
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // _WORKERS))


def pytest_xdist_auto_num_workers(config):
    """`-n auto` (pyproject's addopts): one worker per core (at most 8) on a CPU-only machine; on a
    CUDA machine one process, so the GPU tests neither share the card nor time each other."""
    if HAS_CUDA:
        return 0
    return max(1, min(8, os.cpu_count() or 1))


def pytest_collection_modifyitems(config, items):
    if HAS_CUDA:
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(scope="session")
def ckpt_8b(tmp_path_factory):
    """A random bf16 Llama-3.1-8B-shaped HF checkpoint with 2 layers (about 2.9 GB on disk, 4096-id
    tokenizer), written once per session for the GPU tests that read it (never written to)."""
    from _checkpoints import write
    return write(tmp_path_factory, "llama8b", shape="llama-3.1-8b", arch="llama", dtype="bfloat16",
                 num_layers=2, max_shard_mb=1024, tokenizer_vocab=4096)
