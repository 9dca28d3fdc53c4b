#!/usr/bin/env bash
# First H200 call of round 13 (~7 min): the host-planning fallback test (near-tie rule), the graph
# cache of a model (python -m capture --model cold, then two fresh processes through graphrt serve's
# load path with --graph-cache: ready time, kernels compiled / loaded, cache files hashed before and
# after; a real `graphrt serve` process to /health), and the arrival timeline (tools/trace_arrival.py
# at chunk 512 with a synced run, chunk 256). Bounded by DEADLINE (s). $OUT/round13a.tgz.
#   DEADLINE=480 bash .device/bootstrap.sh bash tools/device/round13a.sh
NAME=round13a; . tools/device/lib.sh
CK=/tmp/ck1b; GC=/tmp/gc1b
python -c "import fastapi, uvicorn; print('fastapi', fastapi.__version__, 'uvicorn', uvicorn.__version__)" 2>&1 | tee -a "$S"
( timeout 60 python tools/make_checkpoint.py $CK --shape llama-3.2-1b --device cuda > "$L/make_ckpt.log" 2>&1 ) &
MK=$!
timeout $(cap 120) python -m pytest -m gpu -q -rfEs --tb=short -p no:cacheprovider -s \
  tests/model/test_fallback_gpu.py tests/cache > "$L/tests.log" 2>&1
say "tests rc=$?: $(grep -E "passed|failed" "$L/tests.log" | tail -1)"; grep -E "^(FAILED|ERROR)|margins" "$L/tests.log" | cut -c1-300 | tee -a "$S"; pack
wait $MK; say "make_checkpoint: $(tail -1 "$L/make_ckpt.log")"
t0=$SECONDS
timeout $(cap 200) python -m capture --model $CK --out $GC --max-num-seqs 16 --max-model-len 8192 > "$L/capture_model.log" 2>&1
say "capture --model rc=$? in $((SECONDS - t0)) s: $(find $GC -type f | wc -l) files"
find $GC -type f -exec sha256sum {} + 2>/dev/null | sort -k2 > "$L/gc_before.txt"; pack
for i in 1 2; do
  t0=$(date +%s.%N)
  timeout $(cap 60) python tools/device/serve_load.py $CK $GC $t0 > "$L/warm_$i.log" 2>&1
  say "warm start $i rc=$?: $(grep -E "^ready" "$L/warm_$i.log" | cut -c1-200)"
done
find $GC -type f -exec sha256sum {} + 2>/dev/null | sort -k2 > "$L/gc_after.txt"
cmp -s "$L/gc_before.txt" "$L/gc_after.txt" && say "graph cache unchanged ($(wc -l < "$L/gc_after.txt") files)" \
  || say "GRAPH CACHE CHANGED: $(diff "$L/gc_before.txt" "$L/gc_after.txt" | head -5 | tr '\n' ';')"
t0=$(date +%s.%N)
( timeout $(cap 60) python -m graphrt.serve $CK --graph-cache $GC --max-num-seqs 16 --max-model-len 8192 \
  --port 18123 --stats-interval 0 > "$L/serve.log" 2>&1 ) &
SV=$!
for _ in $(seq 1 120); do
  python -c "import urllib.request,sys; urllib.request.urlopen('http://127.0.0.1:18123/health', timeout=1)" 2>/dev/null && break
  sleep 0.5
done
say "serve /health after $(python -c "import time; print(round(time.time() - $t0, 2))") s"
kill $SV 2>/dev/null; wait $SV 2>/dev/null; pack
timeout $(cap 150) python tools/trace_arrival.py --make llama-3.2-1b --chunk 512 --sync --out "$L/trace_512.json" > "$L/trace_512.log" 2>&1
say "trace_arrival 512 rc=$?"; pack
timeout $(cap 90) python tools/trace_arrival.py --make llama-3.2-1b --chunk 256 --out "$L/trace_256.json" > "$L/trace_256.log" 2>&1
say "trace_arrival 256 rc=$?"; pack
tail -15 "$L/tests.log" | cut -c1-300
tail -6 "$L/capture_model.log" | cut -c1-300; grep -iE "compiled|graph cache|kernels|capture" "$L/warm_2.log" | tail -8 | cut -c1-300
grep -iE "compiled|ready|serving|error" "$L/serve.log" | tail -5 | cut -c1-300
grep -E "^## |^\|" "$L/trace_512.log" | cut -c1-220 | head -60
grep -E "^## " "$L/trace_256.log" | cut -c1-300
cat "$S"
