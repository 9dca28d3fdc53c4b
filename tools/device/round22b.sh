#!/usr/bin/env bash
# One H100/H200 call (~8 min): #30's remaining rows (the warm starts: round22f.sh / round22g.sh).
#  1. 8B TTFT at 8 clients, graphrt vs the host-planned variant (bench_serve, 12 requests a client);
#  2. the arrival stall (8 streams, a 4k prompt) with every piece riding a block (0092da0: whatever the
#     pacer's budget) at C = 64 and 128, beside the paced default, one process each.
#   DEADLINE=560 bash .device/bootstrap.sh bash tools/device/round22b.sh      (carry .device, .whl)
NAME=round22b; DEADLINE=${DEADLINE:-560}; . tools/device/lib.sh   # logs, pack, cap, say
PARTS=${PARTS:-serve arrival}   # a subset of the two parts, in this order
CK=/tmp/ck1b; CACHE=/tmp/gc1b; rm -rf "$CK" "$CACHE"
timeout $(cap 60) python tools/make_checkpoint.py "$CK" --shape llama-3.2-1b --dtype bfloat16 --device cuda \
  > "$L/make_ck.log" 2>&1
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
