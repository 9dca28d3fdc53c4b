#!/usr/bin/env bash
# One H100/H200 call (~9 min): #30's remaining rows.
#  1. a 1B-shape model graph cache, two warm starts through serve's load path (FlashInfer's import
#     prefetched on a thread, one warm-up run a graph), one without the prefetch, one as before this
#     round (no prefetch, GRAPHRT_GRAPH_WARMUP=2), then one under cProfile and -X importtime
#     (where the 7.5 s from process start go: #30 asks for 5 s);
#  2. 8B TTFT at 8 clients, graphrt vs the host-planned variant (bench_serve, 12 requests a client);
#  3. the arrival stall (8 streams, a 4k prompt) with every piece riding a block (0092da0: whatever the
#     pacer's budget) at C = 64 and 128, beside the paced default, one process each.
#   DEADLINE=560 bash .device/bootstrap.sh bash tools/device/round22b.sh      (carry .device, .whl)
NAME=round22b; DEADLINE=${DEADLINE:-560}; . tools/device/lib.sh   # logs, pack, cap, say
PARTS=${PARTS:-startup serve arrival}   # a subset of the three parts, in this order
CK=/tmp/ck1b; CACHE=/tmp/gc1b; rm -rf "$CK" "$CACHE"
timeout $(cap 60) python tools/make_checkpoint.py "$CK" --shape llama-3.2-1b --dtype bfloat16 --device cuda \
  > "$L/make_ck.log" 2>&1
if [[ " $PARTS " == *" startup "* ]]; then
GRAPHRT_PREFETCH_IMPORTS=1 GRAPHRT_GRAPH_WARMUP=1 cache_and_warm_starts "$CK" "$CACHE"
GRAPHRT_PREFETCH_IMPORTS=0 GRAPHRT_GRAPH_WARMUP=1 timeout $(cap 60) python tools/device/serve_load.py "$CK" "$CACHE" "$(date +%s.%N)" \
  > "$L/warm_noprefetch.log" 2>&1; say "warm start, FlashInfer not prefetched rc=$?"
grep -E "startup: ready|after process start" "$L/warm_noprefetch.log" | tee -a "$S"
GRAPHRT_PREFETCH_IMPORTS=0 GRAPHRT_GRAPH_WARMUP=2 timeout $(cap 60) python tools/device/serve_load.py "$CK" "$CACHE" \
  "$(date +%s.%N)" > "$L/warm_before.log" 2>&1; say "warm start as before this round (no prefetch, 2 warm-up runs) rc=$?"
grep -E "startup: ready|after process start" "$L/warm_before.log" | tee -a "$S"
timeout $(cap 90) python -X importtime tools/device/startup_profile.py "$CK" "$CACHE" "$(date +%s.%N)" "$L/profile" \
  > "$L/profile.log" 2> "$L/importtime.txt"; say "profiled start rc=$?"
grep -E "after process start" "$L/profile.log" | tee -a "$S"
sort -t'|' -k2 -n -r "$L/importtime.txt" 2>/dev/null | head -25 > "$L/importtime_top.txt"; pack
fi
if [[ " $PARTS " == *" serve "* ]]; then
timeout $(cap 300) python tools/bench_serve.py --make llama-3.1-8b --make-dir /tmp/ck8b --device cuda \
  --variants graphrt,graphrt-hostplan --concurrency 8 --requests 12 --no-step-time --out-dir "$L" --name bench_serve_8c \
  > "$L/bench_serve.log" 2>&1; say "bench_serve rc=$?"
grep -E "^\| graphrt" "$L/bench_serve.log" | cut -c1-220 | tee -a "$S"; pack
fi
if [[ " $PARTS " == *" arrival "* ]]; then
for C in 64 128; do
  timeout $(cap 150) python tools/bench_prefix.py --model "$CK" --device cuda --workloads arrival --mixed $C \
    --out-dir "$L" --name arrival_mixed_$C > "$L/arrival_mixed_$C.log" 2>&1; say "arrival mixed $C rc=$?"; pack
  grep -E "^\| (mixed|paced)" "$L/arrival_mixed_$C.md" 2>/dev/null | tee -a "$S"
done
fi
cat "$S"
