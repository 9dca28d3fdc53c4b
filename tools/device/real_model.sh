#!/usr/bin/env bash
# The real model on a GPU: SmolLM2-135M-Instruct's GGUF (98 MB), carried in parts (each call's carried
# paths stay under 64 MiB), one per call on one warm machine (docs/DEVELOPING.md, "The real-model tests"). Each call
# copies the part it carries to /tmp/gguf; the call that completes the set joins them, checks the
# SHA-256 and runs tools/bench_real_model.py (greedy agreement on 24 prompts: graphrt bf16, HF
# float32, HF bf16; decode tokens/s per stream at 1 and 8 streams: graphrt none / n-gram /
# host-planned, HF generate) into $OUT/real_model.{json,md} (~4 min). With llama.cpp's llama-bench
# (a CUDA build for sm_90, docs/DEVELOPING.md) carried in .llamacpp/ (llama-bench or llama-bench.xz;
# kept in /tmp/llamacpp for later calls) its batch-1 generation rate on the same file joins the table,
# with the cuBLAS / CUDA runtime of torch's wheels on the library path.
#   bash .device/bootstrap.sh bash tools/device/real_model.sh      (carry .device and .gguf/smollm2.gguf.part.NN)
NAME=real_model; DEADLINE=${DEADLINE:-560}; . tools/device/lib.sh   # logs, pack, cap, say
G=/tmp/gguf; F=$G/SmolLM2-135M-Instruct.Q4_1.gguf
SHA=b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
mkdir -p "$G"; cp .gguf/smollm2.gguf.part.* "$G"/ 2>/dev/null
python -c "import gguf" 2>/dev/null || { say "no gguf package: put its wheel in .whl/ (docs/DEVELOPING.md)"; cat "$S"; exit 1; }
if [ ! -f "$F" ]; then   # the parts (any sizes, named in order) join once their SHA-256 is the file's
  cat "$G"/smollm2.gguf.part.* > "$F.joined" 2> /dev/null
  if ! echo "$SHA  $F.joined" | sha256sum -c --quiet > /dev/null 2>&1; then
    say "have $(ls "$G"/smollm2.gguf.part.* 2>/dev/null | wc -l) part(s) in $G, not yet the whole file: carry the next part in the next call"
    rm -f "$F.joined"; cat "$S"; exit 0
  fi
  mv "$F.joined" "$F"
fi
say "GGUF ready ($(stat -c %s "$F") bytes)"
LC=/tmp/llamacpp; mkdir -p "$LC"; cp .llamacpp/* "$LC"/ 2>/dev/null
# llama-bench.xz may travel in parts (llama-bench.xz.part.NN, one per call): joined once xz finds them whole
if [ ! -f "$LC/llama-bench" ] && [ ! -f "$LC/llama-bench.xz" ] && ls "$LC"/llama-bench.xz.part.* > /dev/null 2>&1; then
  cat "$LC"/llama-bench.xz.part.* > "$LC/llama-bench.xz"
  xz -t "$LC/llama-bench.xz" 2> /dev/null || { say "llama-bench: $(ls "$LC"/llama-bench.xz.part.* | wc -l) part(s), not yet whole"; rm -f "$LC/llama-bench.xz"; }
fi
[ -f "$LC/llama-bench.xz" ] && xz -df "$LC/llama-bench.xz"
LB=()
if [ -f "$LC/llama-bench" ]; then
  chmod +x "$LC/llama-bench"
  # its libraries (cuBLAS, the CUDA runtime: torch's wheels; libgomp where carried beside it) for it alone
  NV=$(python -c "import os, nvidia; print(' '.join(sorted({r for p in nvidia.__path__ for r, _, fs in os.walk(p) if any(f.startswith(('libcublas', 'libcudart')) for f in fs)})))" 2>/dev/null)
  printf '#!/bin/sh\nLD_LIBRARY_PATH="%s:%s${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" exec "%s" "$@"\n' \
    "$(echo $NV | tr ' ' ':')" "$LC" "$LC/llama-bench" > "$LC/run-llama-bench"; chmod +x "$LC/run-llama-bench"
  LB=(--llama-bench "$LC/run-llama-bench"); say "llama-bench: $("$LC/run-llama-bench" --version 2>&1 | tail -2 | tr '\n' ' ')"
fi
timeout $(cap 520) python tools/bench_real_model.py --gguf "$F" "${LB[@]}" --out "$OUT/real_model.json" > "$L/bench.log" 2>&1
say "bench_real_model rc=$?"
tail -40 "$L/bench.log"; pack
# constrained decoding on a model that writes what its grammar wants (unmasked runs, FreeRun)
timeout $(cap 200) python tools/bench_structured.py "$F" --chat --tokens 128 --reps 3 --spec none none-ahead \
  --cases free json text free+free free+json free+text --out "$L/structured_real" > "$L/structured_real.log" 2>&1
say "bench_structured (real model) rc=$?"; grep -E " / | serial " "$L/structured_real.log" | tee -a "$S"; pack; cat "$S"
