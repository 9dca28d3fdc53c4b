#!/usr/bin/env bash
# One GPU call (~6 min): #30's 8B-shape start-up from a model graph cache. A random Llama-3.1-8B-shape
# checkpoint, graphrt-capture --model (cold: kernels compiled, plans measured), then two warm starts
# through graphrt serve's load path (tools/device/serve_load.py: seconds from process start to ready).
#   DEADLINE=560 bash .device/bootstrap.sh bash tools/device/startup8b.sh      (carry .device)
NAME=startup8b; DEADLINE=${DEADLINE:-560}; . tools/device/lib.sh   # logs, pack, cap, say
CK=/tmp/ck8b; CACHE=/tmp/gc8b; rm -rf "$CK" "$CACHE"
timeout $(cap 150) python tools/make_checkpoint.py "$CK" --shape llama-3.1-8b --dtype bfloat16 --device cuda \
  --max-shard-mb 4096 > "$L/make_ck.log" 2>&1; say "checkpoint rc=$?"
cache_and_warm_starts "$CK" "$CACHE"
cat "$S"
