#!/usr/bin/env bash
# One H200 call (~5 min): the arrival stall (Llama-3.2-1B shape, 8 streams, a 4k prompt arriving, pieces of
# 64 carried by decode blocks) at K = 1, 2 and 4 steps per block (RUNS="K:C ...": pieces of C), each row twice in its process: the gap
# between a stream's deltas is K tokens' worth, so K sets the largest gap / TPOT p50 that #30 asks
# within 3x, and what it costs in TPOT.
#   bash .device/bootstrap.sh bash tools/device/round25d.sh      (carry .device, .whl)
NAME=round25d; DEADLINE=${DEADLINE:-400}; . tools/device/lib.sh   # logs, pack, cap, say
nvidia-smi --query-gpu=name --format=csv,noheader | tee -a "$S"
ck_1b
for KC in ${RUNS:-1:64 2:64 4:64}; do       # K:C pairs (steps per block : tokens of a carried piece)
  K=${KC%%:*}; C=${KC##*:}; N=arrival_k${K}_c$C
  timeout $(cap 120) python tools/bench_prefix.py --model "$CK" --device cuda --workloads arrival --mixed $C \
    --steps-per-graph $K --arrival-repeats 2 --out-dir "$L" --name $N > "$L/$N.log" 2>&1
  say "arrival K=$K C=$C rc=$?"; grep -E "^\| (mixed|paced)" "$L/$N.md" | tee -a "$S"; pack
done
cat "$S"
