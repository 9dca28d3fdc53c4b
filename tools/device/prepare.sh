#!/usr/bin/env bash
# Prepare .device/ in the project root: what a GPU machine without network access needs to run
# FlashInfer (docs/DEVELOPING.md). Run it where pip can reach PyPI.
#
# The GPU machine needs torch, triton and nvcc but not FlashInfer. The FlashInfer wheel is ~100 MB,
# so this packs the part that the decode, prefill and XQA JIT modules need (python package,
# headers, vendored CCCL, top-level csrc, csrc/xqa, csrc/nv_internal) into one tar.xz (~16 MB),
# plus the apache-tvm-ffi wheel for CPython 3.12 (the GPU machine's python).
#
# Usage (from the project root):  bash tools/device/prepare.sh [FLASHINFER_VERSION]
# Result: .device/{flashinfer.tar.xz, wheels/*.whl, bootstrap.sh, VERSION}; add .device/ to .gitignore.
set -euo pipefail
VER="${1:-0.7.4}"
TVM_FFI="${TVM_FFI_VERSION:-0.1.15.post2}"
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(git rev-parse --show-toplevel)"
dst="$root/.device"
mkdir -p "$dst/wheels"
if [ -f "$dst/VERSION" ] && [ "$(cat "$dst/VERSION")" = "$VER" ] && [ -f "$dst/flashinfer.tar.xz" ]; then
  echo "prepare: .device already holds flashinfer $VER"
else
  tmp="$(mktemp -d)"
  trap 'rm -rf "$tmp"' EXIT
  python3 -m pip download -q --no-deps -d "$tmp/whl" "flashinfer-python==$VER"
  (cd "$tmp" && python3 -m zipfile -e whl/flashinfer_python-*.whl src >/dev/null)
  cd "$tmp/src"
  {
    find flashinfer -path flashinfer/data -prune -o -type f ! -name '*.cu' ! -name '*.cuh' -print
    for d in include cccl csrc/xqa csrc/nv_internal; do
      [ -d "flashinfer/data/$d" ] && find "flashinfer/data/$d" -type f
    done
    find flashinfer/data/csrc -maxdepth 1 -type f
    find flashinfer/data -maxdepth 1 -type f
  } | sort -u > "$tmp/files.txt"
  tar -cf - -T "$tmp/files.txt" | xz -T2 -6 > "$dst/flashinfer.tar.xz"
  echo "$VER" > "$dst/VERSION"
  cd "$root"
fi
rm -f "$dst"/wheels/apache_tvm_ffi-*.whl
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 -d "$dst/wheels" "apache-tvm-ffi==$TVM_FFI"
cp "$here/bootstrap.sh" "$dst/bootstrap.sh"
chmod +x "$dst/bootstrap.sh"
grep -qxF '.device/' "$root/.gitignore" 2>/dev/null || echo "prepare: add '.device/' to .gitignore (it must not be committed)"
du -sh "$dst"
echo "prepare: done. On the GPU machine: bash .device/bootstrap.sh <command>"
