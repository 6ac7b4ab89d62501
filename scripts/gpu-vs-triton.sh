#!/usr/bin/env bash
# Kernel beside real Triton 2.51 on one GPU (issue 34), in one run of at most 8 minutes that writes
# its results under one folder: benchmarks/gpu_vs_triton.py says what is measured (CUDA-shm identity
# 1/16/64 MiB over HTTP and gRPC, KIND_GPU add_sub, CPU add_sub with system vs CUDA shm, BLS with a
# 4 MiB GPU tensor, the bundled torch example; perf_analyzer --shared-memory cuda on both protocols,
# the first BLS call after load, one CUDA-shm request checked for its bytes).
#
# On a machine without a GPU it says so and exits 0 having run nothing, unless --dry-run (Kernel on
# the CuPy stand-in, system shm in place of CUDA, short windows: checks the harness anywhere).
#
# With the device tool of this workplace:
#   1. In the checkout the device tool sends (the session's own checkout, not a helper's worktree),
#      fill .whl/ once (network here; git-ignored):  bash scripts/gpu-wheels.sh --scale
#      The same set scale-check.sh uses, about 56 MiB with the tracked tree: Kernel's runtime wheels
#      the image lacks, perf_analyzer (with libcudart 12 and libb64), real Triton packed by
#      ../shared/bench/pack-triton.sh for Python 3.12 (its numpy 1.26 is not used here: the models
#      are numeric, and Triton's stub takes CuPy and torch from the image's python3).
#   2. run(command="bash scripts/gpu-vs-triton.sh", carry=[".whl"], timeout_s=540)
#      About 5-6 minutes (no new point after LIMIT - 60 s); files back in $OUT: gpu-vs-triton.txt
#      (this log), gpu.md (the form of benchmarks/results/gpu.md: copy it there), gpu.json,
#      gpu-logs.tar.gz (both servers' logs, perf_analyzer's). give_back() afterwards.
# Elsewhere:  bash scripts/gpu-vs-triton.sh [--dry-run] [RESULT_DIR]   (default: $OUT, else
#             ${TMPDIR:-/tmp}/kernel-gpu-vs-triton); flags for the benchmark after --, e.g.
#             -- --servers kernel --window-ms 1000
set -u
cd "$(dirname "$0")/.."
ROOT=$(pwd)
START=$(date +%s)
LIMIT=${GPU_VS_TRITON_LIMIT_S:-480}  # the whole run
DRY=0
if [ "${1:-}" = --dry-run ]; then DRY=1; shift; fi
RES=${OUT:-${TMPDIR:-/tmp}/kernel-gpu-vs-triton}
if [ -n "${1:-}" ] && [ "$1" != -- ]; then RES=$1; shift; fi
[ "${1:-}" = -- ] && shift
mkdir -p "$RES"
LOG=$RES/gpu-vs-triton.txt
: > "$LOG"
say() { echo "$*" | tee -a "$LOG"; }
PY=${PYTHON:-python3}
if [ -x "$ROOT/.venv/bin/python" ] && [ -z "${PYTHON:-}" ]; then
  PY=$ROOT/.venv/bin/python  # a developer's checkout (the device gets no .venv: it is not carried)
fi

# ---- is there a GPU? ----------------------------------------------------------------------------------
why=""
if ! command -v nvidia-smi >/dev/null 2>&1; then why="nvidia-smi is not installed"
elif ! nvidia-smi -L >/dev/null 2>&1; then why="nvidia-smi sees no device"
elif ! "$PY" -c "import cupy, sys; sys.exit(0 if cupy.cuda.runtime.getDeviceCount() > 0 else 1)" >/dev/null 2>&1; then
  why="CuPy is missing or sees no CUDA device"
fi
if [ -n "$why" ] && [ $DRY -eq 0 ]; then
  say "gpu-vs-triton: skipped: no GPU ($why); --dry-run checks the harness here. Nothing was run."
  exit 0
fi
TMP=$(mktemp -d "${TMPDIR:-/tmp}/kernel-gpu-vs-triton.XXXXXX")

# ---- what the machine lacks, from .whl/ (no network) ------------------------------------------------------
. scripts/carried.sh
if [ "$PY" != "$ROOT/.venv/bin/python" ]; then
  carried_wheels "$PY" "$TMP/site" "$LOG" || { say "gpu-vs-triton: installing the carried wheels failed (see above)"; exit 1; }
fi
kernel_on_path "$PY"
trap 'for l in "${CARRIED_LINKS[@]}"; do rm -f "$l"; done; rm -rf "$TMP"' EXIT

carried_tools gpu-vs-triton "$PY" "$TMP"
ARGS=("${CARRIED_ARGS[@]}")
PYV=$("$PY" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
[ $DRY -eq 1 ] && ARGS+=(--dry-run)

say "gpu-vs-triton: $(date -u +%FT%TZ) on $(hostname): $(nproc) CPUs, load $(cut -d' ' -f1-3 /proc/loadavg)"
command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1 | tee -a "$LOG"
say "checkout $(git rev-parse --short HEAD 2>/dev/null || echo '(no git)'); python $PYV ($PY)"
versions "$PY" "$LOG" cupy torch numpy msgspec uvloop uvicorn google.protobuf

# ---- the run ------------------------------------------------------------------------------------------------
bounded_run "$PY" benchmarks/gpu_vs_triton.py "${ARGS[@]}" "$@"
rc=$?
cp "$TMP/out/gpu.md" "$TMP/out/gpu.json" "$RES/" 2>/dev/null
tar -czf "$RES/gpu-logs.tar.gz" -C "$TMP/out" logs 2>/dev/null
if [ -f "$RES/gpu.md" ]; then
  cat "$RES/gpu.md"
  echo "log: $LOG"
else
  tail -n 40 "$LOG"
fi
exit $rc
