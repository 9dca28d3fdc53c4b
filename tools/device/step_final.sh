#!/usr/bin/env bash
# #29's closing call (one H100/H200, DEADLINE s, default 540; ~495 s expected): where every weight / KV
# format's decode step stands against its floor, side by side in one run, with per-kernel profiles,
# FP8 quality on a trained target and the verify step; tools/device/step_final_table.py prints the
# gates (table.md). Steps, in the order they run (most important first: 1, 4, 5, 2, 6, 3, 7), each
# bounded and packed as it ends:
#                                                                              estimate   bound
#  1. bench_e2e bs 1 / 1k: 8B + 1B, bf16 + FP8 weights, FlashInfer + triton-decode (8 rows)   70 s   150
#  2. bench_e2e bs 16 / 8k: 8B, bf16 + FP8 weights, bf16 + FP8 KV, both backends (8 rows)     95 s   150
#  3. profile_step bs 1 / 1k: 8B + 1B, bf16 + FP8 weights, triton-decode (4 processes;     90 s  4 x 45
#     PROFILES="model:weights[:kv:batch:context] ..." and PROFILE_BACKEND override)
#  4. train_tiny: the full-size target alone, 50 s budget                                  75 s   100
#  5. quality_fp8 on it: bf16, FP8 weights, FP8 KV, both (ppl, greedy agreement)            60 s   130
#  6. bench_spec part 1: 8B bs 1 / 1k, decode step vs verify of q = 1 and 5 tokens           30 s    60
#  7. bench_e2e bs 16 / 1k (the issue's bs 16 gates): 8B + 1B, bf16 + FP8, both backends     70 s   120
# Estimates from earlier calls: round14's fuse_bench (8 bench_e2e rows over 8B + 1B in 56 s, 1B
# profile_step 18-20 s each), fp8kv.sh / final12.sh (4 rows of 8B bs 16 / 8k inside 60 s), round19's
# training (target 50 s + draft 8 s: 85 s), eval_ppl on the same target (44 s).
# FP8 weights = "fp8-tensor-head" (one scale per fused weight, FP8 LM head where untied: the fastest
# layout measured, 3221 vs 3388 us per-channel at 8B); E2E_WEIGHTS overrides (e.g. bf16,fp8,fp8-tensor-head).
# Both attention backends: bench_e2e has no "auto" variant; graphrt-capture measures the two per bucket,
# so a gate takes the faster row. GRAPHRT_FUSE=off: the engine's default (no fused-GEMV measurement).
# FlashInfer's FP8-KV module at head_dim 64 (the trained target's; not in .device/jit-cache.tgz)
# compiles in the background from the start (nice, 8 jobs: host work only, device times unaffected).
# STEPS="e2e_bs1_1k train quality e2e_bs16_8k verify profiles e2e_bs16_1k" (the default: all) picks steps,
# for a call after round22f.sh, which ran the first three.
#   DEADLINE=540 bash .device/bootstrap.sh bash tools/device/step_final.sh      (carry .device)
NAME=step_final; DEADLINE=${DEADLINE:-540}; . tools/device/lib.sh   # logs, pack, cap, say
export GRAPHRT_FUSE=off
STEPS=" ${STEPS:-e2e_bs1_1k train quality e2e_bs16_8k verify profiles e2e_bs16_1k} "
want() { [[ "$STEPS" == *" $1 "* ]]; }
W=${E2E_WEIGHTS:-bf16,fp8-tensor-head}; PB=${PROFILE_BACKEND:-triton-decode}; DIR=/tmp/step_final_family
rm -rf "$DIR"
python -c "import torch, triton, flashinfer; print(torch.__version__, torch.version.cuda, triton.__version__, flashinfer.__version__)" \
  >> "$L/gpu.txt" 2>&1; tee -a "$S" < "$L/gpu.txt"
JIT=
want quality && ( MAX_JOBS=8 timeout $(cap 420) nice -n 10 python tools/device/jit_warm.py --head-dims 64 --kv fp8 > "$L/jit_warm.log" 2>&1 ) &
want quality && JIT=$!
# NAME BOUND ARGS...: one bench_e2e process, K = 4 step graphs, FlashInfer and triton-decode rows
e2e() {
  local name=$1 bound=$2; shift 2
  timeout $(cap "$bound") python tools/bench_e2e.py "$@" --variants graphrt-k4,graphrt-td-k4 --no-prefill \
    --steps 16 --out "$L/$name.json" > "$L/$name.log" 2>&1; say "$name rc=$?"
  grep -E "^(copy|llama)" "$L/$name.log" | tee -a "$S"; pack
}
want e2e_bs1_1k && e2e e2e_bs1_1k 150 --models llama-3.1-8b,llama-3.2-1b --weights "$W" --kv bf16 --batches 1 --contexts 1024
if want train; then
timeout $(cap 100) python tools/train_tiny.py --out "$DIR" --size full --models target --device cuda \
  --time-budget-s target=50 > "$L/train_tiny.log" 2>&1; say "train_tiny rc=$?"
grep -E "^target " "$L/train_tiny.log" | tee -a "$S"; cp "$DIR/train.json" "$L/" 2>/dev/null; pack
fi
if want quality; then
say "jit_warm $(kill -0 $JIT 2>/dev/null && echo "still running" || echo done): $(tr '\n' ';' < "$L/jit_warm.log" | tail -c 200)"
timeout $(cap 130) python tools/quality_fp8.py "$DIR/target" --device cuda --variants bf16,fp8,fp8-kv,fp8+fp8-kv \
  --json "$L/quality_fp8.json" --check > "$L/quality_fp8.log" 2>&1; say "quality_fp8 rc=$? (1: a gate failed or an error; the log says which)"
grep -A8 "^variant" "$L/quality_fp8.log" | tee -a "$S"; pack
fi
want e2e_bs16_8k && e2e e2e_bs16_8k 150 --models llama-3.1-8b --weights "$W" --kv bf16,fp8 --batches 16 --contexts 8192
if want verify; then
timeout $(cap 60) python tools/bench_spec.py --models llama-3.1-8b --batches 1 --context 1024 --qs 1,5 --no-round \
  --no-attention --out "$L/verify_bs1_1k.json" > "$L/verify.log" 2>&1; say "bench_spec verify rc=$?"
grep -A3 "^context" "$L/verify.log" | tee -a "$S"; pack
fi
want profiles && for item in ${PROFILES:-llama-3.1-8b:bf16 llama-3.1-8b:fp8-tensor-head llama-3.2-1b:bf16 llama-3.2-1b:fp8-tensor-head}; do
  IFS=: read -r m w kv bs ctx <<< "$item"   # model:weights[:kv:batch:context]
  timeout $(cap 45) python tools/profile_step.py --model "$m" --weights "$w" --backend "$PB" --kv "${kv:-auto}" \
    --batch "${bs:-1}" --context "${ctx:-1024}" --fuse off \
    --out "$L/profile_${m}_${w}_${PB}_${kv:-auto}_bs${bs:-1}_${ctx:-1024}.json" >> "$L/profile_step.log" 2>&1
  say "profile $item rc=$?"
done
want profiles && { grep -v "Warn\|_warn_once" "$L/profile_step.log" | cut -c1-250 | tee -a "$S"; pack; }
want e2e_bs16_1k && e2e e2e_bs16_1k 120 --models llama-3.1-8b,llama-3.2-1b --weights "$W" --kv bf16 --batches 16 --contexts 1024
[ -n "$JIT" ] && wait $JIT
python tools/device/step_final_table.py "$L" > "$L/table.md" 2> "$L/table.err"; say "table rc=$?"; pack
cat "$L/table.md"; tail -3 "$L/table.err"
cat "$S"
