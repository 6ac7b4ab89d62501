#!/usr/bin/env bash
# Fill .whl/ (git-ignored) with what scripts/gpu-check.sh needs on a GPU machine that has no
# package registry: the GPU machines lent here have Python 3.12, CuPy for CUDA 13, PyTorch, NumPy,
# grpcio, uvloop, protobuf, pytest and nvidia-ml-py, but not Kernel's other dependencies nor
# tritonclient. Run it here (network), in the repository root, before the device call:
#
#     bash scripts/gpu-wheels.sh             # what scripts/gpu-check.sh needs (about 25 MiB)
#     bash scripts/gpu-wheels.sh --scale     # what scripts/scale-check.sh needs (about 52 MiB): Kernel's
#                                            # runtime wheels the image lacks, perf_analyzer, and real
#                                            # Triton 2.51 packed by ../shared/bench/pack-triton.sh
#                                            # with numpy 1.26 for its stub, into .whl/triton/
#                                            # (PACK_TRITON names another copy of the packer;
#                                            # TRITON_PY another Python than 3.12, for a dry run here)
# Both in turn fill one .whl/ for both scripts: about 68 MiB with the tree, over the device tool's
# 64 MiB, so fill .whl/ for the one script the device call runs.
#
# Wheels are for CPython 3.12 on manylinux x86-64, without dependencies (each one is named), at the
# versions the project's own venv uses; grpcio and protobuf are carried too, so tritonclient's
# generated gRPC code finds the versions it was tested with. perf_analyzer (for
# `--shared-memory cuda`) comes out of the tritonclient[all] 2.50.0 wheel, gzipped, with the two
# libraries it links that the GPU image lacks (libb64 from this machine, libcudart 12 from NVIDIA's
# wheel). About 25 MiB in all; the device tool carries at most 64 MiB with the working tree.
set -euo pipefail
cd "$(dirname "$0")/.."
DEST=.whl
PY=${PYTHON:-.venv/bin/python}
mkdir -p "$DEST/perf"
grep -qx '/.whl/' .gitignore || echo '/.whl/' >> .git/info/exclude

MODE=${1:-}
case $MODE in ""|--scale) ;; *) echo "usage: bash scripts/gpu-wheels.sh [--scale]" >&2; exit 2 ;; esac

PLATFORMS=(--platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64
           --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64)
# What `kernel serve` imports that the image lacks (scale-check.sh runs servers and perf_analyzer only).
RUNTIME=(msgspec==0.22.0 uvicorn==0.54.0 httptools==0.9.0 hpack==4.2.0 h11==0.16.0 protobuf==6.33.6)
PACKAGES=("${RUNTIME[@]}")
[ "$MODE" = --scale ] || PACKAGES+=(
  tritonclient==2.73.0 geventhttpclient==2.6.1 gevent==26.9.0 greenlet==3.3.2 zope.event==6.2
  zope.interface==8.7 python-rapidjson==1.25 brotli==1.2.1 grpcio==1.85.3 pytest-asyncio==1.5.0
)
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  "${PLATFORMS[@]}" -d "$DEST" "${PACKAGES[@]}"

# perf_analyzer, and what it links that the GPU image does not have
if [ ! -f "$DEST/perf/perf_analyzer.gz" ]; then
  tmp=$(mktemp -d)
  "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    "${PLATFORMS[@]}" -d "$tmp" tritonclient==2.50.0 nvidia-cuda-runtime-cu12==12.9.79
  unzip -q -o -j -d "$tmp/tc" "$tmp"/tritonclient-2.50.0-*.whl 'tritonclient-2.50.0.data/data/bin/perf_analyzer'
  gzip -9 -c "$tmp/tc/perf_analyzer" > "$DEST/perf/perf_analyzer.gz"
  unzip -q -o -j -d "$DEST/perf" "$tmp"/nvidia_cuda_runtime_cu12-*.whl 'nvidia/cuda_runtime/lib/libcudart.so.12'
  rm -rf "$tmp"
fi
for lib in /lib/x86_64-linux-gnu/libb64.so.0d /usr/lib/x86_64-linux-gnu/libb64.so.0d; do
  [ -f "$lib" ] && cp -L "$lib" "$DEST/perf/" && break
done
[ -f "$DEST/perf/libb64.so.0d" ] || echo "gpu-wheels: no libb64.so.0d here (apt-get install libb64-0d): perf_analyzer will be skipped" >&2
# Real Triton 2.51 for scale-check.sh (its header says how it is started there)
if [ "$MODE" = --scale ]; then
  pyv=${TRITON_PY:-3.12}
  pack=${PACK_TRITON:-../shared/bench/pack-triton.sh}
  # from a helper's worktree, ../shared is beside the main checkout
  [ -f "$pack" ] || pack=$(git rev-parse --path-format=absolute --git-common-dir)/../../shared/bench/pack-triton.sh
  mkdir -p "$DEST/triton"
  [ -f "$DEST/triton/triton-py$pyv.tar.xz" ] || bash "$pack" "$DEST/triton/triton-py$pyv.tar.xz" "$pyv"
  # Triton 2.51's Python-backend stub needs numpy 1.x: with numpy 2 (the image has 2.5) it reads a
  # BYTES tensor's length prefixes from the wrong bytes and aborts (tiny_lm's text input).
  # scale-check.sh gives the stub a venv of its own with this one (the stub finds a venv on PATH).
  "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version "$pyv" --implementation cp \
    "${PLATFORMS[@]}" -d "$DEST/triton" numpy==1.26.4
fi
du -sh "$DEST"
ls "$DEST" "$DEST/perf"
tree=$(git ls-files -z | xargs -0 du -cb 2>/dev/null | tail -1 | cut -f1)
echo "with the tracked tree ($(( tree / 1048576 )) MiB): $(( ($(du -sb "$DEST" | cut -f1) + tree) / 1048576 )) MiB of the device tool's 64 MiB"
