#!/usr/bin/env bash
# One H100/H200 call (~4 min): what a prompt chunk adds to a decode step (#30's arrival p99; round 23
# on an H100: a C = 64 mixed block adds about 1.7 ms to a 5.5 ms K = 4 block, C = 128 about 2.6 ms).
#  1. profile_step --mixed (--fuse off, the engine's default): Llama-3.2-1B shape, 8 decode rows at 1k, a chunk of C = 32 / 64 / 128 at
#     positions 0 and 3968, beside the plain step (per kernel family, launches);
#  2. the arrival stall at C = 64 (bench_prefix, every piece riding a block), one process each.
#   bash .device/bootstrap.sh bash tools/device/mixed_profile.sh      (carry .device, .whl)
NAME=mixed_profile; DEADLINE=${DEADLINE:-400}; . tools/device/lib.sh   # logs, pack, cap, say
for C in 64 32 128; do
  for S in 3968 0; do
    timeout $(cap 60) python tools/profile_step.py --model llama-3.2-1b --batch 8 --context 1024 --mixed $C \
      --chunk-at $S --fuse off --out "$L/mixed_${C}_at_${S}.json" > "$L/mixed_${C}_at_${S}.log" 2>&1
    say "mixed C=$C at $S rc=$?: $(grep -E "^with a" "$L/mixed_${C}_at_${S}.log")"
  done; pack
done
# the plain step with fused GEMVs where measured faster (the engine's default is off, as above)
timeout $(cap 60) python tools/profile_step.py --model llama-3.2-1b --batch 8 --context 1024 --mixed 64 \
  --chunk-at 3968 --fuse auto --out "$L/mixed_64_at_3968_fuseauto.json" > "$L/mixed_64_at_3968_fuseauto.log" 2>&1
say "fuse auto, mixed C=64 at 3968 rc=$?: $(grep -E "device .* us/step" "$L/mixed_64_at_3968_fuseauto.log" | tr '\n' ' ')"
CK=/tmp/ck1b
timeout $(cap 60) python tools/make_checkpoint.py "$CK" --shape llama-3.2-1b --dtype bfloat16 --device cuda \
  > "$L/make_ck.log" 2>&1
for C in 64; do
  timeout $(cap 150) python tools/bench_prefix.py --model "$CK" --device cuda --workloads arrival --mixed $C \
    --out-dir "$L" --name arrival_mixed_$C > "$L/arrival_mixed_$C.log" 2>&1; say "arrival mixed $C rc=$?"; pack
  grep -E "^\| (mixed|paced)" "$L/arrival_mixed_$C.md" 2>/dev/null | tee -a "$S"
done
pack; cat "$S"
