#!/usr/bin/env bash
# One H100/H200 call (~4 min), the round's last: the piece launch with one full wave of splits.
#  1. the arrival stall (bench_prefix --mixed 64), before (.ab/round24) and after, three pairs in turn;
#  2. profile_step --mixed 64 at 3968 (the engine's unfused step);
#  3. the mixed blocks' GPU tests; then, in what time is left, the sweep at the 8B heads.
#   bash .device/bootstrap.sh bash tools/device/round24d.sh      (carry .device, .whl, .ab)
NAME=round24d; DEADLINE=${DEADLINE:-250}; . tools/device/lib.sh   # logs, pack, cap, say
nvidia-smi --query-gpu=name --format=csv,noheader | tee -a "$S"
ck_1b
tree_with /tmp/before .ab/round24
for i in 1 2 3; do for V in after before; do
  D=$PWD; [ $V = before ] && D=/tmp/before
  in_tree "$D" timeout $(cap 45) python tools/bench_prefix.py --model "$CK" --device cuda --workloads arrival \
    --mixed 64 --out-dir "$L" --name arrival_mixed_64_${V}_$i > "$L/arrival_mixed_64_${V}_$i.log" 2>&1
  say "arrival mixed 64 $V ($i) rc=$?: $(grep -E "^\| mixed" "$L/arrival_mixed_64_${V}_$i.md" 2>/dev/null)"; pack
done; done
timeout $(cap 40) python tools/profile_step.py --model llama-3.2-1b --batch 8 --context 1024 --mixed 64 \
  --chunk-at 3968 --fuse off --out "$L/mixed_64_at_3968.json" > "$L/mixed_64_at_3968.log" 2>&1
say "mixed C=64 at 3968 rc=$?: $(grep -E "^with a" "$L/mixed_64_at_3968.log")"; pack
timeout $(cap 90) python -m pytest -m gpu -q -rfEs --tb=short -p no:cacheprovider --timeout 80 \
  tests/engine/test_mixed_prefill_gpu.py > "$L/gpu_mixed.log" 2>&1
say "mixed gpu tests rc=$?: $(grep -E "passed|failed" "$L/gpu_mixed.log" | tail -1)"; pack
timeout $(cap 120) python tools/bench_prefill_attention.py --sweep --shapes llama-3.1-8b --tokens 64,128 \
  --cached 0,4032 --out "$L/mq_sweep_8b.json" > "$L/mq_sweep_8b.log" 2>&1
say "8B sweep rc=$?"; grep -v Warn "$L/mq_sweep_8b.log" | tail -30; pack; cat "$S"
