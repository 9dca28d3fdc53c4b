"""Host cost of the engine per block and per request, over a stub executor (no GPU, no model).

The stub (`StubExecutor`) implements the Executor protocol (graphrt/worker/protocol.py) with
no device work, answering at once with outputs shaped as the real one returns them: a drawing
prefill -> Result(tokens [1, m] int64); a plain block -> [K, n] int64; a speculative block ->
Result(tokens [R, n, k + 1] int64 with -1 past each round's emitted count, emitted [R, n] int32,
proposed [R, n] int32); the sticky device-error flag [1] int32; measure_costs -> StepCosts under
which the policy speculates. The tokens are real text of a byte-level BPE built locally (so detokenization
and stop strings do real work). All time measured is then the engine's host time: scheduler,
input batch (the stub stages each launch's slot changes as the local executor does, then drops
the update), policy and block clock, read-back, stop checks, detokenization, deltas, streams.

    python tools/bench_engine_host.py --out engine_host.json              # the whole table
    PYTHONPATH=/work/main python tools/bench_engine_host.py --out before.json   # another tree's engine

Per configuration (method none / ngram / draft x bs 1, 4, 16 x text plain / stop strings):
  block_us     steady state: wall µs per Engine.step() (one decode block launched, one read back),
               readers on threads draining the streams (as tools/bench_prefix.py's Reader);
               median over --blocks (each figure: the fastest of --repeat runs)
  token_us     block_us / tokens streamed per block
  cpu_us       the loop thread's CPU µs per step (median; less the time other processes ran)
  call_us      one LLM.generate of bs prompts x --gen tokens (the path bench_spec_trained.py
               times): wall µs per call, median over --calls
  call_token_us  call_us / tokens generated per call
  first_us     a request's admission + prefill launch + first token streamed (add_request to the
               first delta seen by a reader, the engine stepped on the reader's thread), median
Speculative blocks: k = 4, R = 4, emitted counts cycling 1..5 (3 tokens a round on average).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))

EMITTED = (3, 1, 5, 2, 4, 3, 2, 4)      # a round's emitted tokens, cycled per (block, row, round)
VARIANTS = 16                           # canned blocks cycled


class StubExecutor:
    """The Executor protocol (graphrt/worker/protocol.py) with no device work: every call returns
    canned, correctly shaped host tensors at once. method: None, "ngram" or "draft"."""

    def __init__(self, *, max_batch: int, k_steps: int, method: str | None, spec_k: int, rounds: int,
                 context: int, page_size: int, text_ids: list[int], vocab: int):
        from graphrt.config import RuntimeConfig
        from graphrt.speculative.config import SpeculativeConfig
        from graphrt.worker.caps import Capabilities
        from graphrt.worker.input_batch import InputBatch
        from graphrt.worker.launch import Result
        self._result = Result
        config = RuntimeConfig(num_qo_heads=8, num_kv_heads=8, head_dim=64, page_size=page_size,
                               max_context_len=context + 64, buckets={"max": max_batch},
                               dtype="float32", backend="reference")
        spec_ks = () if method is None else tuple(sorted({1, 2, spec_k}))
        self.caps = Capabilities(
            config=config, device=torch.device("cpu"), num_pages=max_batch * config.max_pages_per_seq + 2,
            vocab_size=vocab, model_key="stub", steps_per_graph=k_steps,
            speculative=None if method is None else SpeculativeConfig(method="ngram", num_tokens=spec_k),
            spec_ks=spec_ks, spec_rounds=rounds if method else 0,
            history_width=config.max_context_len if method else None, draft_state=method == "draft",
            device_errors=True)
        self.error_flag = torch.zeros(1, dtype=torch.int32)
        self._batch = InputBatch(max_batch=max_batch, max_pages_per_seq=config.max_pages_per_seq,
                                 history_width=self.caps.history_width)
        b = max_batch
        text = torch.tensor(text_ids, dtype=torch.int64)
        need = VARIANTS * b * max(k_steps, rounds * (spec_k + 1))
        text = text.repeat(-(-need // len(text)))
        self._decode = [text[i * k_steps * b:(i + 1) * k_steps * b].view(k_steps, b) for i in range(VARIANTS)]
        self._spec = {}
        for kk in spec_ks:
            outs = []
            for v in range(VARIANTS):
                toks = text[v * rounds * b * (kk + 1):(v + 1) * rounds * b * (kk + 1)].view(rounds, b, kk + 1).clone()
                em = torch.tensor([[min(EMITTED[(v + 3 * c + r) % len(EMITTED)], kk + 1) for c in range(b)]
                                   for r in range(rounds)], dtype=torch.int32)
                toks[torch.arange(kk + 1)[None, None, :] >= em[:, :, None].long()] = -1
                outs.append((toks, em, torch.full((rounds, b), kk, dtype=torch.int32)))
            self._spec[kk] = outs
        self._first = text[:b]
        self._n = 0

    def capture(self) -> dict:
        return {}

    def _stage(self, changes) -> None:
        """A launch's slot changes staged as LocalExecutor._apply does (the update dropped)."""
        self._batch.record(changes)
        self._batch.flush(lambda update: None)

    def prefill(self, launch):
        self._stage(launch.changes)
        return self._result(None if launch.slots is None else self._first[:len(launch.slots)][None])

    def stage_chunk(self, slot, tokens, start, *, table_row=None) -> None:
        raise ValueError("mixed_tokens: the stub carries no chunks")

    def run(self, block):
        self._stage(block.changes)
        self._n += 1
        if not block.k:
            return self._result(self._decode[self._n % VARIANTS][:, :block.n])
        toks, em, prop = self._spec[block.k][self._n % VARIANTS]
        return self._result(toks[:, :block.n], em[:, :block.n], prop[:, :block.n])

    def prefill_graphed(self, new_tokens: int) -> bool:
        return False

    def check_device_errors(self) -> None:
        pass

    def write_token_mask(self, slots, bits, active) -> None:
        self.caps.refuse("structured_outputs", self.caps.structured, "the stub executor keeps no token masks")

    def measure_costs(self):
        """Graph costs under which speculation at k = 4 wins, above any host wall time per round
        or step here (so the policy's choice does not depend on this machine's speed)."""
        from graphrt.speculative.policy import StepCosts
        bs = list(self.caps.config.buckets)
        return StepCosts(decode_us={b: 2000.0 for b in bs},
                         verify_us={b: {kk + 1: 2200.0 for kk in self.caps.spec_ks} for b in bs})


def _tokenizer(tmp: Path):
    from make_checkpoint import _corpus, build_tokenizer
    tok = build_tokenizer(tmp, vocab_size=4096, seed=0)
    return tok, tok(" ".join(_corpus(1, 400))).input_ids


def _engine(method, bs, tok, ids, *, context=8192):
    from graphrt.engine.engine import Engine
    ex = StubExecutor(max_batch=bs, k_steps=4, method=method, spec_k=4, rounds=4, context=context,
                      page_size=16, text_ids=ids, vocab=len(tok))
    eng = Engine(ex, tok, eos_token_ids=(), max_model_len=context, overlap=True, seed=0)
    if eng.policy is not None:       # the bench times speculative blocks from the first: a draft
        eng.policy.prior_trusted = True   # model's cautious cold start (default_policy) runs them plain
    return eng


def _params(stop: bool, max_tokens: int):
    from graphrt import SamplingParams
    return SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True,
                          **({"stop": ["@@never", "zzqx"]} if stop else {}))


def _prompt(i: int, n: int, vocab: int) -> list[int]:
    return [(7 * i + 13 * j) % (vocab - 3) + 3 for j in range(n)]


class Reader(threading.Thread):
    """Reads one stream on its own thread (tools/bench_prefix.py's Reader)."""

    def __init__(self, stream):
        super().__init__(daemon=True)
        self.stream, self.tokens, self.first = stream, 0, None

    def run(self):
        for d in self.stream:
            if self.first is None and d.token_ids:
                self.first = time.perf_counter()
            self.tokens += len(d.token_ids)


def steady(method, bs, stop, tok, ids, *, blocks: int, prompt_len: int) -> dict:
    """µs per Engine.step() in the steady state, readers on threads (the engine stepped here)."""
    eng = _engine(method, bs, tok, ids)
    params = _params(stop, 6000)
    readers = [Reader(eng.add_request(_prompt(i, prompt_len, len(tok)), params)) for i in range(bs)]
    eng._thread = threading.Thread(target=None)     # `threaded`: the readers block on their queues
    for r in readers:                               # while this thread steps the engine (the
        r.start()                                   # engine thread's role)
    for _ in range(4):                              # admit + prefill everything, reach steady state
        eng.step()
    wall, cpu, tokens = [], [], []
    for _ in range(blocks):
        n0 = eng._tokens_generated
        t0, c0 = time.perf_counter(), time.thread_time()
        eng.step()
        wall.append((time.perf_counter() - t0) * 1e6)
        cpu.append((time.thread_time() - c0) * 1e6)
        tokens.append(eng._tokens_generated - n0)
    for r in list(eng._requests):
        eng.abort(r)
    eng.step()
    eng._thread = None
    for r in readers:
        r.join(5)
    per_block = statistics.fmean(tokens)
    med = statistics.median(wall)
    return {"block_us": med, "block_us_mean": statistics.fmean(wall), "cpu_us": statistics.median(cpu),
            "tokens_per_block": per_block, "token_us": med / per_block if per_block else None}


def calls(method, bs, stop, tok, ids, *, n_calls: int, gen: int, prompt_len: int) -> dict:
    """LLM.generate of bs prompts x gen tokens (the caller's thread steps the engine), and a
    request's time to its first token."""
    from graphrt import LLM
    eng = _engine(method, bs, tok, ids)
    llm = LLM.__new__(LLM)
    llm.engine, llm.tokenizer, llm._workers = eng, tok, None
    params = _params(stop, gen)
    call, toks = [], []
    for c in range(n_calls + 2):
        prompts = [_prompt(1000 * c + i, prompt_len, len(tok)) for i in range(bs)]
        t0 = time.perf_counter()
        outs = llm.generate(prompts, params, use_tqdm=False)
        if c >= 2:                                  # two warm-up calls
            call.append((time.perf_counter() - t0) * 1e6)
            toks.append(sum(len(o.token_ids) for o in outs))
    first = []
    for c in range(n_calls):
        prompt = _prompt(99999 + c, prompt_len, len(tok))
        t0 = time.perf_counter()
        r = Reader(eng.add_request(prompt, params))
        r.run()                                     # on this thread: it steps the engine
        first.append((r.first - t0) * 1e6)
    med = statistics.median(call)
    return {"call_us": med, "call_token_us": med / statistics.fmean(toks), "first_us": statistics.median(first)}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--methods", default="none,ngram,draft")
    p.add_argument("--batches", default="1,4,16")
    p.add_argument("--texts", default="plain,stop")
    p.add_argument("--blocks", type=int, default=200)
    p.add_argument("--calls", type=int, default=15)
    p.add_argument("--gen", type=int, default=128)
    p.add_argument("--prompt-len", type=int, default=200)
    p.add_argument("--repeat", type=int, default=3, help="runs per configuration (the fastest is reported: the machine may be shared)")
    p.add_argument("--out", default=None)
    a = p.parse_args(argv)
    torch.set_num_threads(1)                         # small host copies; a shared 2-core machine
    import graphrt
    with tempfile.TemporaryDirectory() as tmp:
        tok, ids = _tokenizer(Path(tmp))
    rows = []
    print(f"engine from {Path(graphrt.__file__).parent}")
    print(f"{'method':6} {'bs':>3} {'text':5} | {'block_us':>9} {'cpu_us':>8} {'tok/blk':>7} {'token_us':>8} | "
          f"{'call_us':>9} {'call_tok_us':>11} {'first_us':>8}")
    for method in a.methods.split(","):
        for bs in (int(x) for x in a.batches.split(",")):
            for text in a.texts.split(","):
                m = None if method == "none" else method
                row = {"method": method, "batch": bs, "text": text}
                runs = [steady(m, bs, text == "stop", tok, ids, blocks=a.blocks, prompt_len=a.prompt_len)
                        for _ in range(a.repeat)]
                row |= min(runs, key=lambda r: r["block_us"])
                runs = [calls(m, bs, text == "stop", tok, ids, n_calls=a.calls, gen=a.gen, prompt_len=a.prompt_len)
                        for _ in range(a.repeat)]
                row |= min(runs, key=lambda r: r["call_us"])
                rows.append(row)
                print(f"{method:6} {bs:3d} {text:5} | {row['block_us']:9.1f} {row['cpu_us']:8.1f} "
                      f"{row['tokens_per_block']:7.1f} {row['token_us']:8.2f} | {row['call_us']:9.0f} "
                      f"{row['call_token_us']:11.2f} {row['first_us']:8.0f}", flush=True)
    if a.out:
        Path(a.out).write_text(json.dumps({"what": "engine host µs per block / per generate call over a stub "
                                           "executor (tools/bench_engine_host.py)",
                                           "engine": str(Path(graphrt.__file__).parent), "argv": sys.argv[1:],
                                           "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
