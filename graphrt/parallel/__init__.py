"""Tensor parallelism: one model across the GPUs of a host (torch.distributed; NCCL on GPU, gloo on CPU).

    group.py     TensorParallel: rank, world size and the process group the model's collectives use
    shard.py     which slice of every weight a rank owns; per-rank spec / runtime config
    launch.py    one process per rank, process groups with timeouts, a watchdog (no hangs)
    workers.py   rank 0 in this process + spawned workers (LLM(..., tensor_parallel=n))
    driver.py    rank 0 broadcasts each prefill / decode call; workers replay the same graphs
    executor.py  TPExecutor: graphrt/worker's Executor protocol over the ranks (what TP lacks: caps)
    allreduce.py the route of each all-reduce by message size: NCCL or a one-shot kernel (CUDA)
    flashinfer_allreduce.py  FlashInfer's one-shot all-reduce (lazy import, NCCL fallback)
    random_weights.py  a random model built straight into one rank's shard (benchmarks, tests)
"""
from graphrt.parallel.group import TensorParallel
from graphrt.parallel.shard import check_tp_size, shard_runtime_config, shard_spec, shard_weights

__all__ = ["TensorParallel", "check_tp_size", "shard_runtime_config", "shard_spec", "shard_weights"]
