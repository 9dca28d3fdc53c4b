#!/usr/bin/env bash
# One GPU call (~6 min): #30's 8B-shape start-up from a model graph cache. A random Llama-3.1-8B-shape
# checkpoint, graphrt-capture --model (cold: kernels compiled, plans measured), then two warm starts
# through graphrt serve's load path (tools/device/serve_load.py: seconds from process start to ready).
#   DEADLINE=560 bash .device/bootstrap.sh bash tools/device/startup8b.sh      (carry .device)
NAME=startup8b; DEADLINE=${DEADLINE:-560}; . tools/device/lib.sh   # logs, pack, cap, say
CK=/tmp/ck8b; CACHE=/tmp/gc8b; rm -rf "$CK" "$CACHE"
timeout $(cap 150) python tools/make_checkpoint.py "$CK" --shape llama-3.1-8b --dtype bfloat16 --device cuda \
  --max-shard-mb 4096 > "$L/make_ck.log" 2>&1; say "checkpoint rc=$?"
timeout $(cap 240) python -m capture --model "$CK" --out "$CACHE" --max-num-seqs 16 --max-model-len 8192 \
  > "$L/capture.log" 2>&1; say "capture rc=$?"; pack
python -c "import json,sys; print('manifest plans:', json.load(open(sys.argv[1])).get('plans'))" "$CACHE/manifest.json" \
  | tee -a "$S"
for i in 1 2; do
  timeout $(cap 90) python tools/device/serve_load.py "$CK" "$CACHE" "$(date +%s.%N)" > "$L/warm_$i.log" 2>&1
  say "warm start $i rc=$?"
  grep -E "startup: ready|graph cache|after process start" "$L/warm_$i.log" | tee -a "$S"
done; pack
cat "$S"
