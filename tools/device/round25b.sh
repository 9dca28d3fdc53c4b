#!/usr/bin/env bash
# One H200 call (~7 min): #30's closing rows at the Llama-3.2-1B shape, then the trained-family gate.
#  1. the shared 4k prefix cold / repeated with the cache on and off, and the multi-turn chat (one process);
#  2. a model graph cache (graphrt-capture --model, cold), then warm starts through serve's load path with
#     Python's bytecode cached (PYTHONPYCACHEPREFIX: the image keeps no .pyc; the capture fills it), and the
#     floor under any start on this host: a process that imports torch and makes a CUDA context;
#  3. the trained family, and its quality gate (tests/test_trained_models.py).
#   DEADLINE=560 bash .device/bootstrap.sh bash tools/device/round25b.sh      (carry .device, .whl)
NAME=round25b; DEADLINE=${DEADLINE:-560}; . tools/device/lib.sh   # logs, pack, cap, say
nvidia-smi --query-gpu=name --format=csv,noheader | tee -a "$S"
export PYTHONPYCACHEPREFIX=/tmp/pyc
ck_1b; CACHE=/tmp/gc1b; rm -rf "$CACHE"
timeout $(cap 150) python tools/bench_prefix.py --model "$CK" --device cuda --workloads prefix,chat \
  --out-dir "$L" --name prefix_1b > "$L/prefix_1b.log" 2>&1; say "prefix 1b rc=$?"; pack
grep -E "^\| (cache|on|off)" "$L/prefix_1b.md" 2>/dev/null | tee -a "$S"
timeout $(cap 150) python -m capture --model "$CK" --out "$CACHE" --max-num-seqs 16 --max-model-len 8192 \
  > "$L/capture.log" 2>&1; say "capture rc=$?"; pack
for name in 1 2 3; do
  timeout $(cap 40) python -c "import sys, time; t = float(sys.argv[1]); import torch; torch.zeros(1, device='cuda'); \
torch.cuda.synchronize(); print(f'torch + CUDA context ready {time.time() - t:.2f} s after process start')" \
    "$(date +%s.%N)" > "$L/floor_$name.log" 2>&1; tail -1 "$L/floor_$name.log" | tee -a "$S"
  timeout $(cap 40) python tools/device/serve_load.py "$CK" "$CACHE" "$(date +%s.%N)" > "$L/warm_$name.log" 2>&1
  say "warm start $name rc=$?"; grep -E "startup: ready|after process start" "$L/warm_$name.log" | cut -c1-400 | tee -a "$S"
done; pack
[ "${TRAINED:-1}" = 1 ] || { pack; cat "$S"; exit 0; }   # TRAINED=0: the rows without the quality gate
DIR=/tmp/fam; rm -rf "$DIR"
timeout $(cap 100) python tools/train_tiny.py --out "$DIR" --models draft,target --time-budget-s draft=8,target=50 \
  > "$L/train_tiny.log" 2>&1; say "train_tiny rc=$?"
GRAPHRT_TRAINED_DIR=$DIR timeout $(cap 120) python -m pytest -m gpu -q -s -rfEs --tb=short -p no:cacheprovider \
  tests/test_trained_models.py > "$L/trained.log" 2>&1
say "trained-family tests rc=$?: $(grep -E "passed|failed" "$L/trained.log" | tail -1)"
pack; cat "$S"
