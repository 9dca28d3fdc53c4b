#!/usr/bin/env bash
# The product benchmarks of docs/benchmarks.md on one GPU, one question per call (each fits about
# 9 minutes on an H100 or H200; DEADLINE bounds the call, default 540 s). Random-weight checkpoints
# are made on the machine (tools/make_checkpoint.py); the trained tiny family is trained in the call
# (tools/train_tiny.py, tools/train_eagle3.py). Logs and the tools' JSON / tables / plots under
# /tmp/bench_<question>, packed into $OUT/bench_<question>.tgz; one line per part in the summary.
#
#   bash .device/bootstrap.sh bash tools/device/bench.sh step        # the step against its floor
#   bash .device/bootstrap.sh bash tools/device/bench.sh attention   # device-planned vs host plan()
#   bash .device/bootstrap.sh bash tools/device/bench.sh spec        # n-gram / draft / EAGLE-3 through LLM
#   bash .device/bootstrap.sh bash tools/device/bench.sh serve       # 8B server: graphrt, host-planned, HF
#   bash .device/bootstrap.sh bash tools/device/bench.sh prefill     # first tokens, shared prefix, arrival
#   bash .device/bootstrap.sh bash tools/device/bench.sh startup     # cold / warm start, model graph cache
#   bash .device/bootstrap.sh bash tools/device/bench.sh fp8         # FP8 weights / KV: speed and quality
#   bash .device/bootstrap.sh bash tools/device/bench.sh int4        # int4 GPU tests, bf16 / FP8 / int4 step rows
#                                                                    # (INT4_KERNELS=1: + the int4 GEMM table)
#   bash .device/bootstrap.sh bash tools/device/bench.sh persistent  # its GPU tests, the step at the real model's
#                                                                    # / 1B shapes, a launch-shape sweep at 1B
#   bash .device/bootstrap.sh bash tools/device/bench.sh structured  # constrained decoding: GPU tests, 1B shape
#                                                                    # free / JSON TPOT, the trained target's text
# Tensor parallelism needs two GPUs: tools/device/tp.sh.
Q=${1:-}
case "$Q" in
  step|attention|spec|serve|prefill|startup|fp8|int4|persistent|structured) ;;
  *) echo "bench.sh: the question must be one of step, attention, spec, serve, prefill, startup, fp8, int4, persistent, structured (got '$Q')" >&2
     exit 2 ;;
esac
NAME=bench_$Q; DEADLINE=${DEADLINE:-540}; . tools/device/lib.sh   # logs, pack, cap, say
nvidia-smi --query-gpu=name --format=csv,noheader | tee -a "$S"

# NAME BOUND ARGS...: one bench_e2e process (device us per decode step against the floor)
e2e() {
  local name=$1 bound=$2; shift 2
  timeout $(cap "$bound") python tools/bench_e2e.py "$@" --no-prefill --steps 16 --out "$L/$name.json" > "$L/$name.log" 2>&1
  say "$name rc=$?"; grep -E "^(copy|llama)" "$L/$name.log" | tee -a "$S"; pack
}
ck_8b() {
  CK8=/tmp/ck8b
  [ -f "$CK8/config.json" ] || timeout $(cap 150) python tools/make_checkpoint.py "$CK8" --shape llama-3.1-8b \
    --dtype bfloat16 --device cuda --max-shard-mb 4096 > "$L/make_ck8.log" 2>&1
}

case "$Q" in
step)
  e2e bs1_1k 200 --models llama-3.1-8b,llama-3.2-1b --batches 1 --contexts 1024 \
    --variants hostplan,graphrt,graphrt-k4,graphrt-td-k4
  e2e bs16_8k 150 --models llama-3.1-8b --batches 16 --contexts 8192 --variants graphrt-k4,graphrt-td-k4
  for m in llama-3.1-8b llama-3.2-1b; do
    timeout $(cap 45) python tools/profile_step.py --model $m --out "$L/profile_$m.json" >> "$L/profile_step.log" 2>&1
    say "profile_step $m rc=$?"
  done; pack ;;
attention)
  timeout $(cap 400) python tools/bench_attention.py --out "$L/bench_attention.json" --png "$L/bench_attention.png" \
    > "$L/bench_attention.log" 2>&1; say "bench_attention rc=$?"; tail -12 "$L/bench_attention.log" | tee -a "$S"
  timeout $(cap 100) python tools/bench_prefill_attention.py --out "$L/bench_prefill_attention.json" \
    > "$L/bench_prefill_attention.log" 2>&1; say "bench_prefill_attention rc=$?"; pack ;;
spec)
  DIR=/tmp/fam; [ "${KEEP_FAMILY:-0}" = 1 ] || rm -rf "$DIR"; train_family "$DIR"   # KEEP_FAMILY=1: suite_par's, when warm
  timeout $(cap 220) python tools/bench_spec.py --trained "$DIR" --methods none,ngram,draft,eagle3 --prompts 6 \
    --out "$L/bench_spec_trained.json" --png "$L/bench_spec_trained.png" > "$L/bench_spec_trained.log" 2>&1
  say "bench_spec --trained rc=$?"; grep -E "tok/s/stream|^(none|ngram|draft|eagle3) " "$L/bench_spec_trained.log" | tee -a "$S"; pack
  timeout $(cap 60) python tools/bench_spec.py --models llama-3.1-8b --batches 1 --context 1024 --qs 1,5 --no-round \
    --no-attention --out "$L/verify_bs1_1k.json" > "$L/verify.log" 2>&1; say "bench_spec verify rc=$?"
  grep -A3 "^context" "$L/verify.log" | tee -a "$S"; pack ;;
serve)
  ck_8b; say "checkpoint 8B"
  timeout $(cap 420) python tools/bench_serve.py --model "$CK8" --device cuda --concurrency 1,8 \
    --out-dir "$L" --name bench_serve > "$L/bench_serve.log" 2>&1
  say "bench_serve rc=$?"; grep -E "^\| (variant|graphrt|hf)" "$L/bench_serve.log" | cut -c1-200 | tee -a "$S"; pack ;;
prefill)
  ck_1b; say "checkpoint 1B"
  timeout $(cap 300) python tools/bench_prefix.py --model "$CK" --device cuda --workloads prefix,chat,arrival \
    --prefill-modes graphed,eager --out-dir "$L" --name bench_prefix > "$L/bench_prefix.log" 2>&1
  say "bench_prefix rc=$?"; grep -E "^\|" "$L/bench_prefix.md" 2>/dev/null | cut -c1-200 | tee -a "$S"
  timeout $(cap 200) python tools/bench_prefix.py --model "$CK" --device cuda --workloads arrival --mixed 64 \
    --arrival-repeats 3 --out-dir "$L" --name arrival_mixed_64 > "$L/arrival_mixed_64.log" 2>&1
  say "bench_prefix --mixed 64 rc=$?"; pack ;;
startup)
  export PYTHONPYCACHEPREFIX=/tmp/pyc   # Python's bytecode cached, as on an installed machine
  timeout $(cap 200) python tools/bench_startup.py --what llm,serve --shapes llama-3.2-1b,llama-3.1-8b \
    --workdir /tmp/bench_startup_work --out "$L/bench_startup.json" > "$L/bench_startup.log" 2>&1
  say "bench_startup rc=$?"; pack
  ck_8b; cache_and_warm_starts "$CK8" /tmp/gc8b ;;
fp8)
  e2e fp8_bs1_1k 150 --models llama-3.1-8b,llama-3.2-1b --weights bf16,fp8-tensor-head --batches 1 --contexts 1024 \
    --variants graphrt-k4,graphrt-td-k4
  e2e fp8_bs16_8k 150 --models llama-3.1-8b --weights bf16,fp8-tensor-head --kv bf16,fp8 --batches 16 \
    --contexts 8192 --variants graphrt-k4,graphrt-td-k4
  DIR=/tmp/fp8_family; rm -rf "$DIR"
  timeout $(cap 100) python tools/train_tiny.py --out "$DIR" --size full --models target --device cuda \
    --time-budget-s target=50 > "$L/train_tiny.log" 2>&1; say "train_tiny rc=$?"
  timeout $(cap 130) python tools/quality_fp8.py "$DIR/target" --device cuda --variants bf16,fp8,fp8-kv,fp8+fp8-kv \
    --json "$L/quality_fp8.json" --check > "$L/quality_fp8.log" 2>&1
  say "quality_fp8 rc=$? (1: a gate failed; the log says which)"; grep -A8 "^variant" "$L/quality_fp8.log" | tee -a "$S"; pack ;;
int4)
  # the int4 GEMV and graphs; the persistent step's FP8 / int4 tiles (float32 reference, the sequence)
  timeout $(cap 220) python -m pytest -m gpu -q -p no:cacheprovider tests/model/test_int4_gpu.py \
    tests/model/test_persistent_quant_gpu.py tests/kernels/test_persistent_formats_gpu.py -k "not timing" -s \
    > "$L/int4_gpu_tests.log" 2>&1
  say "int4 / persistent format GPU tests rc=$?"; tail -4 "$L/int4_gpu_tests.log" | tee -a "$S"; pack
  e2e int4_step 240 --models llama-3.1-8b,llama-3.2-1b --weights bf16,fp8,int4 --batches 1,16 --contexts 1024 \
    --variants graphrt,graphrt-persistent $([ "${INT4_KERNELS:-0}" = 1 ] && echo --int4-kernels)
  grep -E "^gemm" "$L/int4_step.log" | tee -a "$S" ;;
persistent)
  # the persistent step's GPU tests (the fault of docs/NOTES.md: in one process, each test alone after a failure)
  timeout $(cap 240) python -m pytest -m gpu -q -rfEs --tb=short -p no:cacheprovider tests/model/test_persistent_gpu.py \
    tests/kernels/test_persistent_step_gpu.py tests/kernels/test_persistent_formats_gpu.py \
    tests/model/test_persistent_quant_gpu.py -k "not timing" > "$L/persistent_gpu_tests.log" 2>&1
  say "persistent GPU tests rc=$?: $(tail -1 "$L/persistent_gpu_tests.log")"; pack
  e2e persistent_small 150 --models smollm2-135m,llama-3.2-1b --batches 1,16 --contexts 1024 \
    --variants graphrt,graphrt-k4,graphrt-persistent
  # the L2 prefetch off and two programs an SM at the 1B shape, bs 1 (each configuration compiles: ~1 min;
  # the e2e rows above are the default's: prefetch 1, one program an SM)
  timeout $(cap 300) python tools/profile_persistent.py --model llama-3.2-1b --batch 1 --prefetch 0 \
    --programs-per-sm 1,2 --out "$L/persistent_sweep_1b.json" > "$L/persistent_sweep.log" 2>&1
  say "profile_persistent sweep rc=$?"; grep -E "us|GB/s" "$L/persistent_sweep.log" | tail -12 | tee -a "$S"; pack ;;
structured)
  timeout $(cap 150) python -m pytest -m gpu -q -rfEs --tb=short -p no:cacheprovider tests/engine/test_structured_gpu.py \
    > "$L/structured_gpu_tests.log" 2>&1
  say "structured GPU tests rc=$?: $(tail -1 "$L/structured_gpu_tests.log")"; pack
  # the trained target first: n-gram speculation's gain for a JSON stream (target >= 1.3)
  DIR=/tmp/fam; [ -f "$DIR/target/config.json" ] || timeout $(cap 80) python tools/train_tiny.py --out "$DIR" \
    --models target --time-budget-s target=50 > "$L/train_tiny.log" 2>&1
  timeout $(cap 150) python tools/bench_structured.py "$DIR/target" --tokens 160 --reps 3 --spec none ngram \
    --cases free text free+text json regex --out "$L/structured_target" > "$L/structured_target.log" 2>&1
  say "bench_structured target rc=$?"; grep -E " / " "$L/structured_target.log" | tee -a "$S"; pack
  # the 1B and 8B shapes (random weights): json / free <= 1.05 (1B), <= 1.02 (8B)
  timeout $(cap 260) python tools/bench_structured.py --shapes 1b,8b --workdir /tmp/bs --tokens 160 --reps 3 \
    --spec none --out "$L/structured_shapes" > "$L/structured_shapes.log" 2>&1
  say "bench_structured 1B / 8B rc=$?"; grep -E " / " "$L/structured_shapes.log" | tee -a "$S"; pack ;;
esac
pack; cat "$S"
