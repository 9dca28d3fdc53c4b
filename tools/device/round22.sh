#!/usr/bin/env bash
# One H100/H200 call (~9 min) when machines are scarce: #30's start-up profile (round22b.sh's first
# part, ~130 s), then #29's closing measurements in the time left (step_final.sh, its most important
# steps first). Both pack into $OUT (round22b.tgz, step_final.tgz).
#   bash .device/bootstrap.sh bash tools/device/round22.sh      (carry .device, .whl)
T0=$SECONDS
PARTS=startup DEADLINE=185 bash tools/device/round22b.sh
DEADLINE=$((${TOTAL:-430} - (SECONDS - T0))) bash tools/device/step_final.sh
