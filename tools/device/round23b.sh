#!/usr/bin/env bash
# One H100/H200 call (~4 min): #30's 8B TTFT at 8 clients, graphrt vs the host-planned variant, with
# each request's send time, prompt length and TTFT (serve_load's per_request), twice in opposite
# orders, 24 requests a client: where graphrt's first tokens wait longer.
#   DEADLINE=400 bash .device/bootstrap.sh bash tools/device/round23b.sh      (carry .device, .whl)
NAME=round23b; DEADLINE=${DEADLINE:-400}; . tools/device/lib.sh   # logs, pack, cap, say
CK8=/tmp/ck8b
[ -f "$CK8/config.json" ] || timeout $(cap 120) python tools/make_checkpoint.py "$CK8" --shape llama-3.1-8b \
  --dtype bfloat16 --device cuda > "$L/make_ck8.log" 2>&1
say "checkpoint rc=$?"
for order in graphrt,graphrt-hostplan graphrt-hostplan,graphrt; do
  timeout $(cap 170) python tools/bench_serve.py --model "$CK8" --device cuda --variants $order --concurrency 8 \
    --requests ${REQ:-24} --no-step-time --out-dir "$L" --name "serve8c_${order%%,*}_first" > "$L/serve8c_${order%%,*}_first.log" 2>&1
  say "bench_serve $order rc=$?"; grep -E "^\| graphrt" "$L/serve8c_${order%%,*}_first.log" | cut -c1-200 | tee -a "$S"; pack
done
cat "$S"
