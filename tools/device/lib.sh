# Sourced by the device scripts after they set NAME: logs under /tmp/$NAME, packed into
# $OUT/$NAME.tgz by `pack`; `cap S` bounds a step by S seconds and by what is left of DEADLINE
# (default 480); `say LINE` appends to the summary with the elapsed seconds.
set -uo pipefail
OUT="${OUT:-/tmp/out}"; L=/tmp/$NAME; rm -rf "$L"; mkdir -p "$L" "$OUT"
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
T0=$SECONDS; S="$L/summary.txt"
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
