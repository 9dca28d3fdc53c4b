#!/usr/bin/env bash
# Second H200 call of round 14 (~3 min): host time inside the prefill path by sub-phase
# (tools/device/prefill_host.py), plain and synced. $OUT/round14b.tgz.
#   bash .device/bootstrap.sh bash tools/device/round14b.sh
NAME=round14b; . tools/device/lib.sh
export PYTHONPYCACHEPREFIX=/tmp/pyc
CK=/tmp/ck1b
timeout 60 python tools/make_checkpoint.py $CK --shape llama-3.2-1b --device cuda > "$L/make_ckpt.log" 2>&1
for m in plain sync; do
  timeout $(cap 120) python tools/device/prefill_host.py $CK "$L/prefill_host_$m.json" $m > "$L/prefill_host_$m.log" 2>&1
  say "prefill_host $m rc=$?"; pack
done
grep -vE "^(graphrt|INFO|WARNING)" "$L/prefill_host_plain.log" | grep -E "==|  [A-Za-z]" | head -80
grep -E "==" "$L/prefill_host_sync.log"
cat "$S"
