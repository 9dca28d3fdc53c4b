"""engine/pacing.py: the prefill pacer sizes prompt chunks from measured costs (a share of a
decode block's time), in whole pages, capped; the engine measures chunks and blocks and chunks
a long prompt by the pacer's budget while streams decode, with the same greedy tokens."""
from __future__ import annotations

import pytest
import torch

from _checkpoints import write
from _engine_steps import drive
from graphrt import LLM, SamplingParams
from graphrt.engine.config import EngineConfig
from graphrt.engine.engine import Engine
from graphrt.engine.pacing import FIRST_CHUNK_PAGES, PrefillPacer

pytest.importorskip("transformers")
PS = 4
CPU = dict(device="cpu", backend="reference", max_model_len=64, page_size=PS)
GREEDY = SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True)
LONG = list(range(11, 35))                                   # 24 tokens


def _pacer(stall=0.25, cap=None, page=16):
    return PrefillPacer(stall, page_size=page, max_tokens=cap, device=torch.device("cpu"))


def test_budget_is_a_share_of_the_block_in_whole_pages_capped():
    p = _pacer(cap=512)
    assert p.budget() == FIRST_CHUNK_PAGES * 16                # nothing measured: a small first chunk
    p._observe("chunk", 256, 2560.0)                           # 10 us a token
    p._observe("block", 0, 4000.0)
    assert p.budget() == 96                                    # 0.25 * 4000 / 10 = 100 -> 6 pages
    p._observe("chunk", 96, 1440.0)                            # 15 us a token: the mean moves half way
    assert p.us_per_token == pytest.approx(12.5) and p.budget() == 80
    p._observe("block", 0, 400000.0)                           # a long block: the cap holds
    assert p.budget() == 512
    p._observe("chunk", 16, 1e7)                               # a huge cost: never under a page
    assert p.budget() == 16
    assert _pacer(stall=None, cap=300).budget() == 300         # no pacing: the cap alone
    assert set(p.stats()) == {"prefill_budget_tokens", "prefill_us_per_token", "decode_block_us"}


def test_poll_reads_only_completed_launches_in_order():
    class Ev:
        def __init__(self, done, t):
            self.done, self.t = done, t

        def query(self):
            return self.done

        def elapsed_time(self, end):                           # ms, as torch.cuda.Event's
            return end.t - self.t

    p = _pacer()
    p._open.extend([("chunk", 100, Ev(True, 0.0), Ev(True, 1.0)),     # 1 ms over 100 tokens
                    ("block", 0, Ev(True, 1.0), Ev(False, 5.0))])     # still running
    p.poll()
    assert p.us_per_token == pytest.approx(10.0) and p.block_us is None and len(p._open) == 1
    p._open[0][3].done = True
    p.poll()
    assert p.block_us == pytest.approx(4000.0) and not p._open


def test_bad_stall_names_the_field():
    for bad in (0, -1.0, True, "0.3", 1000):
        with pytest.raises(ValueError, match="max_prefill_stall"):
            EngineConfig(max_prefill_stall=bad)
        with pytest.raises(ValueError, match="max_prefill_stall"):
            _pacer(stall=bad)
    assert EngineConfig().max_prefill_stall == "auto" and EngineConfig().prefill_stall(4) == 1.0   # 1.0 at K > 1
    assert EngineConfig(max_prefill_stall=None).max_prefill_stall is None


@pytest.fixture(scope="module")
def llm(tmp_path_factory):
    path = write(tmp_path_factory, "pacing", shape="tiny", arch="llama")
    return LLM(path, max_batch=4, steps_per_graph=3, **CPU)


def _engine(llm, **kw) -> Engine:
    e = llm.engine
    return Engine(llm.runtime, llm.tokenizer, eos_token_ids=tuple(e.scheduler.eos), max_model_len=e.max_model_len,
                  enable_prefix_caching=False, **kw)


def _chunks(eng, late):
    return [e[2:] for e in eng.scheduler.launches if e[0] == "prefill" and e[1] == late.request_id]


def test_engine_chunks_a_long_prompt_by_the_pacers_budget(llm):
    want = llm.generate([LONG], GREEDY, use_tqdm=False)[0].outputs[0].token_ids
    eng = _engine(llm, max_prefill_stall=0.25, max_num_batched_tokens=64)
    pacer = eng.scheduler.pacer
    pacer.us_per_token, pacer.block_us = 125.0, 4000.0          # budget 0.25 * 4000 / 125 = 8 = 2 pages
    pacer.launched = lambda *a, **k: None                        # held fixed: the chunk sizes are known
    eng.scheduler.record = True
    running = eng.add_request([5, 6, 7], SamplingParams(max_tokens=20, temperature=0.0, ignore_eos=True))
    eng.step()
    late = eng.add_request(LONG, GREEDY)
    drive(eng, max_steps=400)
    assert _chunks(eng, late) == [(0, 8), (8, 16), (16, 24)]
    assert late.result().token_ids == want and len(running.result().token_ids) == 20


def test_engine_measures_chunks_and_blocks_while_rows_decode(llm):
    eng = _engine(llm, max_prefill_stall=0.5, max_num_batched_tokens=16)
    eng.scheduler.record = True
    assert eng.stats()["prefill_us_per_token"] is None
    running = eng.add_request([5, 6, 7], SamplingParams(max_tokens=30, temperature=0.0, ignore_eos=True))
    eng.step()
    late = eng.add_request(LONG, GREEDY)
    drive(eng, max_steps=400)
    st = eng.stats()
    assert st["prefill_us_per_token"] > 0 and st["decode_block_us"] > 0
    chunks = _chunks(eng, late)
    assert chunks[0] == (0, FIRST_CHUNK_PAGES * PS) and chunks[-1][1] == len(LONG)
    assert all(b - a <= 16 and b % PS == 0 for a, b in chunks[:-1])   # whole pages, capped
    assert len(running.result().token_ids) == 30 and len(late.result().token_ids) == 6


def test_no_pacer_without_a_stall_or_for_whole_prompt_runtimes(llm):
    assert _engine(llm).scheduler.pacer is None
    assert _engine(llm, max_prefill_stall=0.3).scheduler.pacer is not None
    with pytest.raises(ValueError, match="max_prefill_stall"):
        _engine(llm, max_prefill_stall=0)


def test_a_flagged_device_guard_stops_the_engine_with_its_reason(llm):
    """The runtime's sticky device-guard flags travel with every block's tokens; a set flag (a
    prepare or K/V-append kernel refused bad pages) ends the engine with the guard's reason,
    and every stream raises EngineDeadError (never tokens computed from unwritten K/V)."""
    from graphrt.attention.runtime import DeviceInputError
    from graphrt.engine.failure import EngineDeadError
    eng = _engine(llm)
    s = eng.add_request([5, 6, 7], SamplingParams(max_tokens=30, temperature=0.0, ignore_eos=True))
    eng.step()
    flag = eng.runtime.error_flag
    flag.fill_(2)                                             # ERR_PAGE_ID, as the kernels set it
    with pytest.raises(DeviceInputError, match="page ids"):
        for _ in range(20):
            eng.step()
    with pytest.raises(EngineDeadError):
        s.result()
    assert int(flag[0]) == 0                                  # read and cleared
