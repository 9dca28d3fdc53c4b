"""Constrained (structured-output) decoding against free decoding: per-stream TPOT through the engine.

    python tools/bench_structured.py --shapes 1b,8b --workdir /tmp/bs --out results/structured      # GPU
    python tools/bench_structured.py MODEL_DIR [MODEL_DIR ...] --tokens 192 --reps 3 --spec none ngram
    python tools/bench_structured.py --shapes tiny --device cpu --tokens 6 --reps 1 --workdir /tmp/bs  # smoke

Models: checkpoint directories, or for each of --shapes (tiny, 1b = llama-3.2-1b, 8b =
llama-3.1-8b) a random bf16 checkpoint written once under --workdir with a 128k-token tokenizer
(the mask's cost grows with the vocabulary). Per model and speculation setting (--spec: none, or
n-gram with 4 proposals), one LLM at steps_per_graph "auto" (the engine's default K); requests run
on the engine's thread, each stream read by a thread of its own that stamps every delta. A
stream's TPOT is (last delta - first delta) / the tokens after the first delta; each case runs
--reps times (cases interleaved, after one warm-up round that also compiles the grammars) and
the median is kept. Prompts: --prompt-len random ids, or with --chat an instruction through the
model's chat template (a JSON list of items like SCHEMA's; for the text cases a list of words),
so that a real model writes what its constraint wants. Every stream is greedy. A model may also
be a .gguf file.

Cases (the first stream of each is the one the ratios read):
  free        one free stream (ignore_eos)
  json        one JSON-schema-constrained stream           json / free   (target: <= 1.05 1B, <= 1.02 8B)
  regex       one regex-constrained stream                 regex / free
  free+free   two free streams
  free+json   a free stream beside a JSON-constrained one  free+json / free+free, its free stream
                                                           (target: <= 1.01)
  text        one stream constrained to printable ASCII    text / free   (a constraint a model of
  free+text   a free stream beside it                      free+text / free+free   ASCII text
                                                           follows: it decodes unmasked, FreeRun)
With --spec none ngram, also `json none / ngram` (and regex): the constrained stream's speedup
from n-gram speculation (target: >= 1.3 on a trained model's JSON). --spec none-ahead: no
speculation, and each split step's next forward launched right after the previous draw
(Engine.RUN_AHEAD) instead of by the next block (after the host's loop, the default):
`json none / none-ahead` (reported as `serial / ahead`) is what launching it ahead gains.
A constrained row runs one step per block in two launches (forward, then the draw), its matcher
advanced and its next mask written while the forward runs; under n-gram speculation one round
with grammar-checked proposals; where its model agrees with its grammar, whole unmasked K-step
blocks (docs/structured-output.md: a random-weight shape almost never does); the gap to `free`
is what that costs. Writes OUT.json, OUT.md (the table) and OUT.png.
"""
from __future__ import annotations

import argparse
import gc
import json
import statistics
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from benchlib import pyplot  # noqa: E402

SHAPES = {"tiny": "tiny", "1b": "llama-3.2-1b", "8b": "llama-3.1-8b"}
TOKENIZER_VOCAB = 128000            # Llama 3's regular tokens: a mask's realistic width
SCHEMA = {"type": "object", "properties": {
    "items": {"type": "array", "minItems": 12, "maxItems": 12, "items": {
        "type": "object", "properties": {"id": {"type": "integer", "minimum": 0, "maximum": 9999},
                                         "name": {"type": "string", "minLength": 4, "maxLength": 12},
                                         "kind": {"enum": ["report", "note", "memo"]}},
        "required": ["id", "name", "kind"], "additionalProperties": False}}},
    "required": ["items"], "additionalProperties": False}
REGEX = r"([a-z]{3,8} ){40,80}[a-z]+\."
TEXT = r"[ -~\n\t]{1,100000}"       # printable ASCII, newlines, tabs: what a code / prose model writes
STREAMS = {"free": None, "json": {"json": SCHEMA}, "regex": {"regex": REGEX}, "text": {"regex": TEXT}}
CASES = {"free": ["free"], "json": ["json"], "regex": ["regex"], "free+free": ["free", "free"],
         "free+json": ["free", "json"], "text": ["text"], "free+text": ["free", "text"]}
CHAT = ("Write a JSON object with a key \"items\": a list of 12 objects, each with an integer \"id\", "
        "a \"name\" of 4 to 12 letters and a \"kind\" (report, note or memo). Reply with JSON only.")
DEFAULT_CASES = ["free", "json", "regex", "free+free", "free+json"]
RATIOS = [("json", "free", 0), ("regex", "free", 0), ("free+json", "free+free", 0), ("text", "free", 0),
          ("free+text", "free+free", 0)]


def _fail(msg: str) -> int:
    print(f"bench_structured: {msg}", file=sys.stderr)
    return 2


def checkpoint(workdir: Path, shape: str, device: str) -> Path:
    """The shape's random checkpoint under workdir, written once (tiny: float32 on the CPU, its
    own small tokenizer; others: bf16 drawn on `device`, a 128k-token tokenizer shared by them)."""
    from make_checkpoint import write_checkpoint
    path = workdir / f"ckpt-{shape}"
    if (path / ".complete").is_file():
        return path
    if shape == "tiny":
        write_checkpoint(path, "tiny", dtype="float32", seed=3)
    else:
        done = [d for d in sorted(workdir.glob("ckpt-*")) if (d / ".complete").is_file() and d.name != "ckpt-tiny"]
        write_checkpoint(path, shape, dtype="bfloat16", device=device, tokenizer_from=done[0] if done else None,
                         tokenizer_vocab=TOKENIZER_VOCAB)
    (path / ".complete").write_text("")
    return path


def timed(engine, prompts: list, params: list) -> list[tuple[float, int]]:
    """Run the streams together on the engine's thread -> (TPOT ms, tokens) per stream."""
    streams = [engine.add_request(p, sp) for p, sp in zip(prompts, params)]
    stamps: list[list] = [[] for _ in streams]

    def read(i):
        for d in streams[i]:
            if d.token_ids:
                stamps[i].append((time.perf_counter(), len(d.token_ids)))
    threads = [threading.Thread(target=read, args=(i,)) for i in range(len(streams))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    out = []
    for ts in stamps:
        after = sum(n for _, n in ts[1:])
        out.append(((ts[-1][0] - ts[0][0]) / max(1, after) * 1e3, sum(n for _, n in ts)))
    return out


def bench_model(path, a, spec: str) -> list[dict]:
    import torch
    from graphrt import LLM, SamplingParams
    kw = {"speculative": {"method": "ngram", "num_tokens": 4}} if spec == "ngram" else {}
    llm = LLM(str(path), device=a.device, max_batch=2, max_model_len=a.prompt_len + a.tokens + 64, **kw)
    llm.engine.RUN_AHEAD = spec == "none-ahead"
    vocab = llm.engine.vocab_size
    gen = torch.Generator().manual_seed(0)
    prompts = [torch.randint(8, min(vocab, 4096), (a.prompt_len,), generator=gen).tolist() for _ in range(2)]
    if a.chat:                                        # the model's chat template over an instruction
        ids = llm.tokenizer.apply_chat_template([{"role": "user", "content": CHAT}], add_generation_prompt=True)
        prompts = [list(ids), list(ids)]

    def params(name):
        so = STREAMS[name]
        return SamplingParams(max_tokens=a.tokens, temperature=0, ignore_eos=so is None, structured_outputs=so)
    k = llm.engine.caps.steps_per_graph
    runs = {c: [] for c in a.cases}
    llm.engine.start()
    try:
        for rep in range(a.reps + 1):                 # round 0: warm-up (grammars compiled, cached)
            for c in a.cases:
                got = timed(llm.engine, prompts[:len(CASES[c])], [params(s) for s in CASES[c]])
                if rep:
                    runs[c].append(got)
    finally:
        llm.engine.shutdown()
    rows = []
    for c in a.cases:
        per = list(zip(*runs[c]))                     # per stream: its (tpot, tokens) of each rep
        rows.append({"model": str(path), "spec": spec, "k": k, "case": c, "streams": CASES[c],
                     "tpot_ms": [statistics.median(t for t, _ in s) for s in per],
                     "tokens": [statistics.median(n for _, n in s) for s in per]})
    del llm
    gc.collect()
    if a.device == "cuda":
        torch.cuda.empty_cache()
    return rows


def ratios(rows: list[dict]) -> list[dict]:
    """(case / base) of the first streams' TPOT, per model and speculation setting."""
    out = []
    for r in rows:
        for case, base, i in RATIOS:
            if r["case"] != case:
                continue
            b = next((x for x in rows if x["case"] == base and x["model"] == r["model"] and x["spec"] == r["spec"]), None)
            if b is not None:
                out.append({"model": r["model"], "spec": r["spec"], "what": f"{case} / {base}",
                            "ratio": r["tpot_ms"][i] / b["tpot_ms"][i]})
        if r["spec"] == "none" and r["case"] in ("json", "regex", "free+json"):   # the forward ahead's gain
            b = next((x for x in rows if x["case"] == r["case"] and x["model"] == r["model"]
                      and x["spec"] == "none-ahead"), None)
            if b is not None:
                out.append({"model": r["model"], "spec": "none", "what": f"{r['case']} serial / ahead",
                            "ratio": r["tpot_ms"][0] / b["tpot_ms"][0]})
        if r["spec"] == "ngram" and r["case"] in ("json", "regex"):   # speculation's gain for the stream
            b = next((x for x in rows if x["case"] == r["case"] and x["model"] == r["model"] and x["spec"] == "none"),
                     None)
            if b is not None:
                out.append({"model": r["model"], "spec": "ngram", "what": f"{r['case']} none / ngram",
                            "ratio": b["tpot_ms"][0] / r["tpot_ms"][0]})
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("models", nargs="*", help="checkpoint directories (or --shapes)")
    p.add_argument("--shapes", default="", help="comma-separated: " + ", ".join(SHAPES))
    p.add_argument("--workdir", default="/tmp/graphrt-bench-structured", help="where --shapes' checkpoints go")
    p.add_argument("--tokens", type=int, default=192)
    p.add_argument("--prompt-len", type=int, default=64)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--spec", nargs="+", default=["none"], choices=["none", "none-ahead", "ngram"])
    p.add_argument("--cases", nargs="+", default=DEFAULT_CASES, choices=list(CASES))
    p.add_argument("--chat", action="store_true", help="prompts: an instruction through the chat template")
    p.add_argument("--device", default="cuda")
    p.add_argument("--out", default="structured")
    a = p.parse_args(argv)
    shapes = [s for s in a.shapes.split(",") if s]
    if any(s not in SHAPES for s in shapes):
        return _fail(f"--shapes: {a.shapes!r}; expected a comma-separated list of {', '.join(SHAPES)}")
    if not shapes and not a.models:
        return _fail("--shapes: give checkpoint directories or --shapes")
    if a.tokens < 2 or a.reps < 1 or a.prompt_len < 1:
        return _fail(f"--tokens (>= 2), --reps (>= 1), --prompt-len (>= 1): got {a.tokens}, {a.reps}, {a.prompt_len}")
    for m in a.models:
        if not Path(m, "config.json").is_file() and not (m.endswith(".gguf") and Path(m).is_file()):
            return _fail(f"models: {m} is not a checkpoint directory (no config.json) nor a .gguf file")
    workdir = Path(a.workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    models = [Path(m) for m in a.models] + [checkpoint(workdir, SHAPES[s], a.device) for s in shapes]
    rows = []
    for path in models:
        for spec in a.spec:
            for r in bench_model(path, a, spec):
                rows.append(r)
                tp = "  ".join(f"{s} {t:7.3f} ms ({n:.0f} tok)" for s, t, n in zip(r["streams"], r["tpot_ms"], r["tokens"]))
                print(f"{path.name:18} {spec:6} K={r['k']} {r['case']:10} {tp}", flush=True)
    rat = ratios(rows)
    for x in rat:
        print(f"{Path(x['model']).name:18} {x['spec']:6} {x['what']:22} {x['ratio']:.3f}")
    out = Path(a.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    import torch
    card = torch.cuda.get_device_name() if a.device == "cuda" and torch.cuda.is_available() else a.device
    out.with_suffix(".json").write_text(json.dumps({"device": card, "rows": rows, "ratios": rat,
                                                    "args": vars(a)}, indent=1))
    lines = ["| model | spec | K | case | TPOT ms (per stream) | tokens |", "|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {Path(r['model']).name} | {r['spec']} | {r['k']} | {r['case']} | "
                     + ", ".join(f"{s} {t:.3f}" for s, t in zip(r["streams"], r["tpot_ms"]))
                     + " | " + ", ".join(f"{n:.0f}" for n in r["tokens"]) + " |")
    lines += ["", "| model | spec | ratio | value |", "|---|---|---|---|"]
    lines += [f"| {Path(x['model']).name} | {x['spec']} | {x['what']} | {x['ratio']:.3f} |" for x in rat]
    out.with_suffix(".md").write_text(f"device: {card}\n\n" + "\n".join(lines) + "\n")
    plt = pyplot()
    if plt is not None and rows:
        fig, ax = plt.subplots(figsize=(9, 4))
        labels = [f"{Path(r['model']).name}\n{r['spec']}\n{r['case']}" for r in rows]
        ax.bar(range(len(rows)), [r["tpot_ms"][0] for r in rows])
        ax.set_xticks(range(len(rows)), labels, fontsize=6)
        ax.set_ylabel("TPOT of the first stream (ms)")
        ax.set_title(f"free vs constrained decoding ({card})")
        fig.tight_layout()
        fig.savefig(out.with_suffix(".png"), dpi=120)
    return 0


if __name__ == "__main__":
    sys.exit(main())
