"""Host time per token of stop-string matching vs the number of stop strings (CPU, no GPU).

    python tools/bench_stop_strings.py [--json out.json]

A request's TextState (graphrt/engine/detokenizer.py, byte-table path) is fed real text of a
byte-level BPE tokenizer built locally, one token at a time, with N stop strings that never
match (the worst case: every token is checked against all of them), N = 0, 1, 16, 256 (the
bound, MAX_STOP_STRINGS). Column "automaton": graphrt's matcher (engine/stop_match.py);
column "find per string": the rule it replaced, `text.find(s, start)` for each stop string over
the window a new token can complete, timed on the same text. Medians of 5 runs, µs per token.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))


def _setup():
    from make_checkpoint import _corpus, build_tokenizer
    tok = build_tokenizer(Path(tempfile.mkdtemp()), vocab_size=4096, seed=0)
    ids = tok(" ".join(_corpus(1, 400))).input_ids[:2000]
    return tok, ids


def automaton_us(tok, table, ids, stops) -> float:
    from graphrt.engine.detokenizer import TextState
    runs = []
    for _ in range(5):
        st = TextState(tok, stops, table=table)
        t0 = time.perf_counter()
        for t in ids:
            st.add_tokens([t])
        runs.append((time.perf_counter() - t0) / len(ids) * 1e6)
    return statistics.median(runs)


def find_per_string_us(tok, table, ids, stops) -> float:
    """The replaced rule on the same text: per token, find each stop string in the window."""
    import codecs
    hold = max((len(s) for s in stops), default=1) - 1
    runs = []
    for _ in range(5):
        dec, text = codecs.getincrementaldecoder("utf-8")("replace"), ""
        t0 = time.perf_counter()
        for t in ids:
            start = max(0, len(text) - hold)
            text += dec.decode(table[t])
            hits = [i for i in (text.find(s, start) for s in stops) if i >= 0]
            assert not hits
        runs.append((time.perf_counter() - t0) / len(ids) * 1e6)
    return statistics.median(runs)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--json", default=None, help="also write the rows as JSON here")
    args = p.parse_args(argv)
    from graphrt.engine.params import MAX_STOP_STRINGS
    from graphrt.engine.token_bytes import token_bytes
    tok, ids = _setup()
    table = token_bytes(tok, len(tok))
    rows = []
    for n in (0, 1, 16, MAX_STOP_STRINGS):
        stops = tuple(f"\x00{i:05d}\x01" for i in range(n))          # never in the text
        rows.append({"stop_strings": n, "automaton_us": automaton_us(tok, table, ids, stops),
                     "find_per_string_us": find_per_string_us(tok, table, ids, stops) if n else None})
    print(f"{'stop strings':>12} | {'automaton us/token':>18} | {'find per string us/token':>24}")
    for r in rows:
        f = "-" if r["find_per_string_us"] is None else f"{r['find_per_string_us']:.2f}"
        print(f"{r['stop_strings']:>12} | {r['automaton_us']:>18.2f} | {f:>24}")
    if args.json:
        Path(args.json).write_text(json.dumps({"tokens": len(ids), "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
