#!/usr/bin/env bash
# One H200 call (~8 min): #30's closing rows at the Llama-3.1-8B shape.
#  1. TTFT at 8 closed-loop clients, graphrt beside the host-planned variant of the same engine, one run;
#  2. a model graph cache (graphrt-capture --model, cold), then two warm starts through serve's load path
#     (seconds from process start to ready; Python's bytecode cached as an installed machine has it).
#   DEADLINE=560 bash .device/bootstrap.sh bash tools/device/round25c.sh      (carry .device, .whl)
NAME=round25c; DEADLINE=${DEADLINE:-560}; . tools/device/lib.sh   # logs, pack, cap, say
nvidia-smi --query-gpu=name --format=csv,noheader | tee -a "$S"
export PYTHONPYCACHEPREFIX=/tmp/pyc
CK8=/tmp/ck8b; CACHE=/tmp/gc8b; REQ=${REQ:-16}; rm -rf "$CACHE"
[ -f "$CK8/config.json" ] || timeout $(cap 150) python tools/make_checkpoint.py "$CK8" --shape llama-3.1-8b \
  --dtype bfloat16 --device cuda --max-shard-mb 4096 > "$L/make_ck8.log" 2>&1; say "checkpoint rc=$?"
timeout $(cap 200) python tools/bench_serve.py --model "$CK8" --device cuda --variants graphrt,graphrt-hostplan \
  --concurrency 8 --requests $REQ --no-step-time --out-dir "$L" --name serve8c > "$L/serve8c.log" 2>&1
say "bench_serve rc=$?"; grep -E "^\| (variant|graphrt)" "$L/serve8c.log" | cut -c1-200 | tee -a "$S"; pack
cache_and_warm_starts "$CK8" "$CACHE"
cat "$S"
