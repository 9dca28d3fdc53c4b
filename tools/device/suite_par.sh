#!/usr/bin/env bash
# One GPU call (~9 min): the whole GPU suite in parallel processes, and the trained-family gate.
#  1. the tests that time the GPU (the K choice of steps_per_graph="auto") alone;
#  2. every other GPU test file, in $PAR pytest processes at once (default 4; they share the GPU:
#     nothing there is timed), while the tiny family trains in the background;
#     Where the GPU has under 100 GiB (an H100), four processes can hold four 8B models at once and a
#     test's LLM() then finds too little memory: every test that failed or errored there runs again,
#     alone, after the groups (both results are said);
#  3. the trained-family quality gate (tests/test_trained_models.py) on it.
# Logs in $OUT/suite_par.tgz, one line per part in the summary (printed last).
#   DEADLINE=560 bash .device/bootstrap.sh bash tools/device/suite_par.sh
# SHARD=i/n: the files dealt to n x PAR groups, this call runs the i-th PAR of them; the timed tests
# run in shard 1, the family trains and its gate runs in shard n (on an H100 the whole suite takes
# ~11 min of groups: SHARD=1/2 then SHARD=2/2, two calls on one warm machine).
NAME=suite_par; DEADLINE=${DEADLINE:-560}; . tools/device/lib.sh   # logs, pack, cap, say
PAR=${PAR:-4}; DIR=/tmp/fam
SHARD=${SHARD:-1/1}; SI=${SHARD%/*}; SN=${SHARD#*/}
if ! [[ "$SI" =~ ^[0-9]+$ && "$SN" =~ ^[0-9]+$ ]] || [ "$SI" -lt 1 ] || [ "$SI" -gt "$SN" ]; then
  echo "suite_par.sh: SHARD must be i/n with 1 <= i <= n (got '$SHARD')" >&2; exit 2
fi
FIRST=$([ "$SI" = 1 ] && echo 1 || echo 0); LAST=$([ "$SI" = "$SN" ] && echo 1 || echo 0)
[ "$LAST" = 1 ] && rm -rf "$DIR"
say "shard $SHARD"
# the server's GPU tests skip at collection when its packages do not import: say so first
python -c "import fastapi, uvicorn, openai; print('serve packages import:', fastapi.__version__, uvicorn.__version__, openai.__version__)" \
  2>&1 | tail -1 | tee -a "$S"
if [ "$FIRST" = 1 ]; then
  timeout $(cap 240) python -m pytest -m gpu -q -rfEs --tb=short -p no:cacheprovider --timeout 200 \
    tests/model/test_steps_gpu.py tests/engine/test_steps_auto_gpu.py > "$L/timed.log" 2>&1
  say "timed tests rc=$?: $(grep -E "passed|failed" "$L/timed.log" | tail -1)"
fi
TRAIN=""
[ "$LAST" = 1 ] && ( timeout 100 python tools/train_tiny.py --out "$DIR" --models draft,target --time-budget-s draft=8,target=50 \
    > "$L/train_tiny.log" 2>&1; echo "train_tiny rc=$?" >> "$L/train_tiny.log" ) &
[ "$LAST" = 1 ] && TRAIN=$!
# every GPU test file but the timed ones and the trained gate, dealt to the least loaded group by
# an estimate of its seconds (heaviest first: the engine's speculative files and the cache's
# capture test take minutes each, most other files well under one)
python - "$L" "$((PAR * SN))" <<'PY'
import subprocess, sys, collections
L, par = sys.argv[1], int(sys.argv[2])
out = subprocess.run([sys.executable, "-m", "pytest", "-m", "gpu", "--collect-only", "-q", "-p", "no:cacheprovider",
                      "tests"], capture_output=True, text=True).stdout
count = collections.Counter(line.split("::")[0] for line in out.splitlines() if "::" in line)
skip = ("test_steps_gpu.py", "test_steps_auto_gpu.py", "test_trained_models.py")
heavy = {"test_speculative_eagle3_gpu.py": 160, "test_speculative_gpu.py": 130, "test_cache.py": 150,
         "test_engine_gpu.py": 110, "test_mixed_prefill_gpu.py": 90, "test_serve_gpu.py": 90,
         "test_engine_core_gpu.py": 80, "test_vllm_api_gpu.py": 60,
         "test_persistent_step_gpu.py": 150, "test_persistent_gpu.py": 120}
files = sorted((f for f in count if not f.endswith(skip)),
               key=lambda f: -heavy.get(f.rsplit("/", 1)[-1], 5 * count[f]))
load = [0] * par
for f in files:
    g = load.index(min(load))
    load[g] += heavy.get(f.rsplit("/", 1)[-1], 5 * count[f])
    open(f"{L}/group{g}.txt", "a").write(f + "\n")
print("estimated seconds per group:", load)
PY
PIDS=""; MINE=$(seq $(((SI - 1) * PAR)) $((SI * PAR - 1)))
for g in $MINE; do
  [ -f "$L/group$g.txt" ] || continue
  timeout $(cap 480) python -m pytest -m gpu -q -rfEs --tb=short -p no:cacheprovider --timeout 300 \
    $(cat "$L/group$g.txt") > "$L/gpu_group$g.log" 2>&1 &
  PIDS="$PIDS $!"
done
for p in $PIDS; do wait $p; done
for g in $MINE; do
  [ -f "$L/gpu_group$g.log" ] && say "group $g: $(grep -E "passed|failed|error" "$L/gpu_group$g.log" | tail -1)"
done
grep -hE "^(FAILED|ERROR)" "$L"/gpu_group*.log | cut -c1-300 | tee -a "$S"; pack
AGAIN=$(grep -hE "^(FAILED|ERROR) tests/" "$L"/gpu_group*.log | awk '{print $2}' | sort -u)
if [ -n "$AGAIN" ]; then
  timeout $(cap 240) python -m pytest -m gpu -q -rfEs --tb=short -p no:cacheprovider --timeout 200 $AGAIN \
    > "$L/gpu_again_alone.log" 2>&1
  say "failed or errored in the groups, run again alone: $(grep -E "passed|failed|error" "$L/gpu_again_alone.log" | tail -1)"
  grep -hE "^(FAILED|ERROR)" "$L/gpu_again_alone.log" | cut -c1-300 | tee -a "$S"; pack
fi
if [ "$LAST" = 1 ]; then
  wait $TRAIN; say "$(tail -1 "$L/train_tiny.log")"
  GRAPHRT_TRAINED_DIR=$DIR timeout $(cap 90) python -m pytest -m gpu -q -s -rfEs --tb=short -p no:cacheprovider \
    tests/test_trained_models.py > "$L/trained.log" 2>&1
  say "trained-family tests rc=$?: $(grep -E "passed|failed" "$L/trained.log" | tail -1)"; pack
fi
cat "$S"
