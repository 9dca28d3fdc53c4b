# Sourced by tools/device/suite_par.sh and bench.sh after they set NAME: logs under /tmp/$NAME, packed into
# $OUT/$NAME.tgz by `pack`; `cap S` bounds a step by S seconds and by what is left of DEADLINE
# (default 480); `say LINE` appends to the summary with the elapsed seconds.
set -uo pipefail
OUT="${OUT:-/tmp/out}"; L=/tmp/$NAME; rm -rf "$L"; mkdir -p "$L" "$OUT"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
T0=$SECONDS; S="$L/summary.txt"
# Triton's kernel cache across calls: restored from .device/triton-cache.tgz (carried with .device)
# and written back to $OUT/triton-cache.tgz when the script exits (kept only under the 16 MiB a
# returned file may have): a fresh machine then loads the kernels an earlier call compiled
# instead of compiling them again (minutes of a cold GPU suite). Copy it into .device/ after a call.
export TRITON_CACHE_DIR="${TRITON_CACHE_DIR:-/tmp/triton-cache}"
if [ -f .device/triton-cache.tgz ] && [ ! -f "$TRITON_CACHE_DIR/.restored" ]; then
  mkdir -p "$TRITON_CACHE_DIR" && tar -xzf .device/triton-cache.tgz -C "$TRITON_CACHE_DIR" \
    && touch "$TRITON_CACHE_DIR/.restored"
fi
save_triton() {
  [ -d "$TRITON_CACHE_DIR" ] || return 0
  local f="$OUT/triton-cache.tgz"
  tar czf "$f" -C "$TRITON_CACHE_DIR" --exclude=.restored . 2>/dev/null
  local n; n=$(stat -c %s "$f" 2>/dev/null || echo 0)
  if [ "$n" -gt $((15 << 20)) ]; then rm -f "$f"; echo "triton cache: $n bytes packed, over 15 MiB: not returned" >> "$S"; fi
}
trap save_triton EXIT
cap() { local l=$((${DEADLINE:-480} - (SECONDS - T0))); [ "$1" -lt "$l" ] && echo "$1" || echo $((l > 5 ? l : 5)); }
pack() { tar czf "$OUT/$NAME.tgz" -C /tmp "$NAME"; }
say() { echo "$1 at $((SECONDS - T0)) s" | tee -a "$S"; }
# packages the GPU image lacks (fastapi, uvicorn, openai, pydantic, ...), when carried in .whl
if [ -d .whl ] && [ ! -f /tmp/site/.ready ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && touch /tmp/site/.ready
fi
[ -f /tmp/site/.ready ] && export PYTHONPATH="$PYTHONPATH:/tmp/site"
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader > "$L/gpu.txt" 2>&1
# the trained family into DIR: target (50 s) + draft (8 s), then an EAGLE-3 head (35 s); logs in $L
train_family() {
  [ -f "$1/target/config.json" ] && [ -f "$1/draft/config.json" ] && say "train_tiny: kept $1 (trained by an earlier call)" ||
  timeout $(cap 100) python tools/train_tiny.py --out "$1" --models draft,target --time-budget-s draft=8,target=50 \
    > "$L/train_tiny.log" 2>&1; say "train_tiny rc=$?"
  timeout $(cap 80) python tools/train_eagle3.py --target "$1/target" --out "$1/eagle3" --time-budget-s 35 \
    --eval-prompts 0 > "$L/train_eagle3.log" 2>&1; say "train_eagle3 rc=$?"; pack
}
# a model graph cache of checkpoint $1 in $2 (graphrt-capture --model, max_num_seqs 16, 8k; cold), its
# manifest's plans, then two warm starts through serve's load path (seconds from process start to ready)
cache_and_warm_starts() {
  timeout $(cap 240) python -m capture --model "$1" --out "$2" --max-num-seqs 16 --max-model-len 8192 \
    > "$L/capture.log" 2>&1; say "capture rc=$?"; pack
  python -c "import json,sys; print('manifest plans:', json.load(open(sys.argv[1])).get('plans'))" "$2/manifest.json" \
    | tee -a "$S"
  for i in 1 2; do
    timeout $(cap 90) python tools/device/warm_start.py "$1" "$2" "$(date +%s.%N)" > "$L/warm_$i.log" 2>&1
    say "warm start $i rc=$?"
    grep -E "startup: ready|graph cache|split-K|steps_per_graph auto|after process start" "$L/warm_$i.log" | tee -a "$S"
  done; pack
}
# a random Llama-3.2-1B-shape bf16 checkpoint in /tmp/ck1b (made once a machine); sets CK
ck_1b() {
  CK=/tmp/ck1b
  [ -f "$CK/config.json" ] || timeout $(cap 60) python tools/make_checkpoint.py "$CK" --shape llama-3.2-1b \
    --dtype bfloat16 --device cuda > "$L/make_ck.log" 2>&1
}
