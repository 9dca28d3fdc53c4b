#!/usr/bin/env bash
# One H200 call (~6 min): the trained family (tools/train_tiny.py: target + draft; train_eagle3.py: an
# EAGLE-3 head), then engine_gaps.py on the trained target (none / ngram / draft / eagle3, bs 1) with its
# per-block reading (tools/device/block_gaps.py): each decode block's device time vs its capture-time graph
# cost, the device's idle time between blocks and the device work launched outside them; the table closes.
#   bash .device/bootstrap.sh bash tools/device/spec_gaps.sh
NAME=spec_gaps; DEADLINE=${DEADLINE:-540}; . tools/device/lib.sh   # logs, pack, cap, say
DIR=/tmp/fam; rm -rf "$DIR"
if [ ! -f .device/jit-cache.tgz ]; then   # a fresh pack: build FlashInfer's modules once
  timeout 300 python tools/device/jit_warm.py --head-dims 64,128 --kv bf16 > "$L/jit_warm.log" 2>&1; say "jit_warm rc=$?"
fi
timeout $(cap 100) python tools/train_tiny.py --out "$DIR" --models draft,target --time-budget-s draft=8,target=50 \
  > "$L/train_tiny.log" 2>&1; say "train_tiny rc=$?"
timeout $(cap 80) python tools/train_eagle3.py --target "$DIR/target" --out "$DIR/eagle3" --time-budget-s 35 \
  --eval-prompts 0 > "$L/train_eagle3.log" 2>&1; say "train_eagle3 rc=$?"; pack
timeout $(cap 400) python tools/device/engine_gaps.py --model "$DIR/target" --tokens 128 --out "$L/engine_gaps.json" \
  --configs "none:1,ngram:1,draft=$DIR/draft:1,eagle3=$DIR/eagle3:1" > "$L/engine_gaps.log" 2>&1
say "engine_gaps rc=$?"; rm -f "$L"/trace_*.json; pack
sed -n '/^per block, steady-state/,$p' "$L/engine_gaps.log"
grep -E "Error|error:" "$L/engine_gaps.log" | tail -5
cat "$S"
