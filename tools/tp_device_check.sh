#!/usr/bin/env bash
# Tensor parallelism on a 2-GPU host: the GPU TP tests, then bench_tp.py, outputs under $OUT.
#   bash .device/bootstrap.sh bash tools/tp_device_check.sh      (the same as tools/device/tp2.sh)
exec bash "$(dirname "$0")/device/tp2.sh" "$@"
