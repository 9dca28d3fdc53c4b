"""Host cost of the engine loop per K-step block, with a null runtime on the CPU (no GPU).

The null runtime is a ModelRuntime whose device work is skipped: its public `decode` (host
checks, the copy into the slot state) and the engine's `decode_slots` run as written; the K model steps are replaced by writing canned tokens (real text of a byte-level BPE
tokenizer built locally, so detokenization does real work). Every engine.step() then costs what
the host spends per block: scheduler, input staging, runtime host path, detokenization, stop
checks, deltas. Used by `tools/bench_engine.py --host-cost`; works on older engines too (the
same runtime methods), which gives the before/after table.
"""
from __future__ import annotations

import statistics
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))


def _tokenizer(tmp: Path):
    from make_checkpoint import _corpus, build_tokenizer
    tok = build_tokenizer(tmp, vocab_size=4096, seed=0)
    ids = tok(" ".join(_corpus(1, 400))).input_ids
    return tok, ids


def null_runtime(*, max_batch: int, k: int, context: int, page_size: int, vocab: int, text_ids):
    from graphrt.attention.buffers import StaticBuffers
    from graphrt.attention.graphs import GraphRunner
    from graphrt.config import RuntimeConfig
    from graphrt.model.runtime import ModelRuntime
    from graphrt.model.slots import SlotState

    class NullRuntime(ModelRuntime):
        def __init__(self):                       # what decode / decode_slots read, no model
            c = RuntimeConfig(num_qo_heads=8, num_kv_heads=8, head_dim=64, page_size=page_size,
                              max_context_len=context + k, buckets={"max": max_batch},
                              dtype="float32", backend="reference")
            self.config, self.k, self.device = c, k, torch.device("cpu")
            self._pool = max_batch * c.max_pages_per_seq + 2
            self.model = SimpleNamespace(spec=SimpleNamespace(vocab_size=vocab))
            b = c.max_batch
            self.slots = SlotState.allocate(b, c.max_pages_per_seq, self.device)
            self.buffers = StaticBuffers(c, self.device, block_table=self.slots.block_table,
                                         seq_lens=self.slots.seq_lens)
            self.backend = SimpleNamespace(needs_host_inputs=False, capturable=False)
            self.graphs = GraphRunner(self.device)
            self.lock = threading.RLock()
            self.sampling, self._captured, self.keep_logits, self._logits = True, False, False, None
            self.processing, self.mixed = False, None
            self.out_tokens = torch.zeros((k, b), dtype=torch.int64)
            text = torch.tensor(text_ids, dtype=torch.int64)
            reps = -(-(k * b * 64) // len(text))
            self._text = text.repeat(reps)[:k * b * 64].view(64, k, b)   # canned tokens per block
            self._block = 0

        @property
        def num_pages(self) -> int:
            return self._pool

        def prefill(self, prompts, block_table, **kw):
            return torch.zeros((len(prompts), vocab), dtype=torch.float32)

        def _steps(self, size, sampled=False):
            self.out_tokens[:, :size].copy_(self._text[self._block % 64, :, :size])
            self._block += 1

    return NullRuntime()


def host_cost(*, batch: int, k: int, context: int = 8192, prompt_len: int = 4000, page_size: int = 16,
              blocks: int = 40, tokenizer=None, text_ids=None, sampled: bool = False) -> dict:
    """Host µs per engine.step() (one block) with `batch` requests decoding: wall-clock median
    and mean, and the median of the loop thread's CPU time (what the block cost the host, less
    the time the OS ran other processes: the development machine is shared)."""
    from graphrt import SamplingParams
    from graphrt.engine.engine import Engine
    from graphrt.worker.local import LocalExecutor
    rt = null_runtime(max_batch=batch, k=k, context=context, page_size=page_size,
                      vocab=len(tokenizer), text_ids=text_ids)
    eng = Engine(LocalExecutor(rt), tokenizer, eos_token_ids=(), max_model_len=context, overlap=True, seed=0)
    max_tokens = (blocks + 8) * k + 1
    params = SamplingParams(max_tokens=max_tokens, ignore_eos=True,
                            **(dict(temperature=0.8, top_p=0.9, seed=1) if sampled else dict(temperature=0.0)))
    vocab = len(tokenizer)
    streams = [eng.add_request([(7 * i + j) % (vocab - 3) + 3 for j in range(prompt_len)], params)
               for i in range(batch)]
    for _ in range(3):                              # admit + prefill everything, reach steady state
        eng.step()
    times, cpu = [], []
    for _ in range(blocks):
        t0, c0 = time.perf_counter(), time.thread_time()
        eng.step()
        times.append((time.perf_counter() - t0) * 1e6)
        cpu.append((time.thread_time() - c0) * 1e6)
        for s in streams:                            # the readers' side: drain, not timed
            while not s._q.empty():
                s._q.get_nowait()
    return {"batch": batch, "k": k, "host_us_median": statistics.median(times),
            "thread_cpu_us_median": statistics.median(cpu),
            "host_us_mean": statistics.fmean(times), "host_us_per_token": statistics.median(times) / (batch * k)}


def host_cost_table(batches, ks, *, tmp: Path, blocks: int = 40, sampled: bool = False) -> list[dict]:
    # one intra-op thread: the loop's host copies are small, and on a shared 2-core machine
    # torch's thread pool turns a 130 KB copy into milliseconds of waiting for a busy core
    torch.set_num_threads(1)
    tok, ids = _tokenizer(tmp)
    rows = []
    for k in ks:
        for b in batches:
            r = host_cost(batch=b, k=k, tokenizer=tok, text_ids=ids, blocks=blocks, sampled=sampled)
            rows.append(r)
            print(f"B={b:4d} K={k}  host {r['host_us_median']:9.1f} us/block (mean {r['host_us_mean']:9.1f}, "
                  f"thread CPU {r['thread_cpu_us_median']:9.1f})"
                  f"  {r['host_us_per_token']:6.2f} us/token", flush=True)
    return rows
