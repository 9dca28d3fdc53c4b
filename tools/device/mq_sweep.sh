#!/usr/bin/env bash
# One H100/H200 step (~3 min): the multi-query attention kernel's launch configurations for a mixed
# step's prompt chunk (#30's arrival p99: at C = 64 after 3968 cached tokens the kernel and its
# split-KV combine took 560 of the 744 us a chunk added to a 1B decode step on an H100).
#   bash .device/bootstrap.sh bash tools/device/mq_sweep.sh      (carry .device)
NAME=mq_sweep; DEADLINE=${DEADLINE:-200}; . tools/device/lib.sh   # logs, pack, cap, say
timeout $(cap 190) python tools/bench_prefill_attention.py --sweep --shapes llama-3.2-1b --tokens 64,128 \
  --cached 0,2048,4032 --out "$L/mq_sweep_1b.json" > "$L/mq_sweep_1b.log" 2>&1
say "sweep rc=$?"; cat "$L/mq_sweep_1b.log" | grep -v Warning | tail -60; pack
