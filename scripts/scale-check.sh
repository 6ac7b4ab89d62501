#!/usr/bin/env bash
# Kernel with several front processes beside real Triton 2.51 on a many-core box (issue 32), in one
# run of at most 8 minutes that writes its results under one folder.
#
# benchmarks/scale.py does the measuring: Kernel with --front-processes 1, 8, auto, 4, 2 (only N=1,
# plain `kernel serve`, where the flag does not exist yet) and real Triton, one server at a time,
# each on add_sub / add_sub_batched / repeat_int32 / tiny_lm with 8 CPU instances: add_sub HTTP and
# gRPC at c=64 and c=256, the dynamic batcher at c=64, a decoupled gRPC stream at c=64, tiny_lm
# over the OpenAI route at c=64 (Triton: generate_stream); infer/s, p50/p99, CPU per request per
# kind of process (fronts, workers, supervisor, tritonserver, stubs, the load client), cores per
# front, connections per front. A load that stops making progress (issue 32's gRPC c=256) is cut
# after 3 s and described: socket queue bytes on each side, pending/in-flight gauges, connections.
# No GPU is needed: any Linux box with at least 4 CPUs; on fewer it says so and exits 0 having run
# nothing, unless --dry-run (short windows, 2 instances: checks the harness anywhere).
#
# With the device tool of this workplace (its machine has 16 cores):
#   1. In the checkout the device tool sends (the session's own checkout, not a helper's
#      worktree), fill .whl/ once (network here; git-ignored):  bash scripts/gpu-wheels.sh --scale
#      About 52 MiB: Kernel's runtime wheels the image lacks (1.2 MiB), perf_analyzer (7.6 MiB with
#      libcudart 12 and libb64), real Triton packed by ../shared/bench/pack-triton.sh (26 MiB) and
#      numpy 1.26 for its Python-backend stub (17 MiB: with the image's numpy 2 the stub aborts on
#      BYTES tensors); with the tracked tree (about 4 MiB) 56 MiB of the tool's 64 MiB. Only the
#      py3.12 pack may be in .whl/triton/ (a py3.11 one for a dry run here would not fit).
#   2. run(command="bash scripts/scale-check.sh", carry=[".whl"], timeout_s=540)
#      About 6-7 minutes (the measuring stops starting points at 7 minutes); files back in $OUT:
#      scale-check.txt (this log), scale.md, scale.json, scale-logs.tar.gz. give_back() afterwards.
# Elsewhere:  bash scripts/scale-check.sh [--dry-run] [RESULT_DIR]
#             (default: $OUT, else ${TMPDIR:-/tmp}/kernel-scale-check); more flags for scale.py
#             after --, e.g. -- --servers triton,1,2 --scenarios add_sub_grpc_c256
set -u
cd "$(dirname "$0")/.."
ROOT=$(pwd)
START=$(date +%s)
LIMIT=${SCALE_CHECK_LIMIT_S:-480}  # the whole run
DRY=0
if [ "${1:-}" = --dry-run ]; then DRY=1; shift; fi
RES=${OUT:-${TMPDIR:-/tmp}/kernel-scale-check}
if [ -n "${1:-}" ] && [ "$1" != -- ]; then RES=$1; shift; fi
[ "${1:-}" = -- ] && shift
mkdir -p "$RES"
LOG=$RES/scale-check.txt
: > "$LOG"
say() { echo "$*" | tee -a "$LOG"; }
PY=${PYTHON:-python3}
if [ -x "$ROOT/.venv/bin/python" ] && [ -z "${PYTHON:-}" ]; then
  PY=$ROOT/.venv/bin/python  # a developer's checkout (the device gets no .venv: it is not carried)
fi
CPUS=$(nproc)
if [ "$CPUS" -lt 4 ] && [ $DRY -eq 0 ]; then
  say "scale-check: skipped: $CPUS CPUs here, it needs at least 4 (--dry-run checks the harness on any box). Nothing was run."
  exit 0
fi
TMP=$(mktemp -d "${TMPDIR:-/tmp}/kernel-scale.XXXXXX")

# ---- what the machine lacks, from .whl/ (no network) -------------------------------------------------
. scripts/carried.sh
if [ "$PY" != "$ROOT/.venv/bin/python" ]; then
  carried_wheels "$PY" "$TMP/site" "$LOG" || { say "scale-check: installing the carried wheels failed (see above)"; exit 1; }
fi
kernel_on_path "$PY"
trap 'for l in "${CARRIED_LINKS[@]}"; do rm -f "$l"; done; rm -rf "$TMP"' EXIT

carried_tools scale-check "$PY" "$TMP"
ARGS=("${CARRIED_ARGS[@]}")
PYV=$("$PY" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
if [ -d "$TMP/triton/pytriton" ]; then
  # Triton's Python-backend stub finds its packages through a venv on PATH; numpy 1.x in it (see gpu-wheels.sh)
  np=$(ls .whl/triton/numpy-1.*-cp${PYV/./}-*.whl 2>/dev/null | head -1)
  if [ -n "$np" ] && "$PY" -m venv --without-pip "$TMP/stubenv" >> "$LOG" 2>&1 \
     && "$PY" -m pip install -q --no-index --no-deps --no-compile --target "$TMP/stubenv/lib/python$PYV/site-packages" "$np" >> "$LOG" 2>&1; then
    ARGS+=(--triton-venv "$TMP/stubenv")
  else
    say "scale-check: no numpy 1.x for real Triton's stub (.whl/triton/numpy-1.*-cp${PYV/./}-*.whl): its BYTES model (tiny_lm) will fail with numpy $("$PY" -c 'import numpy; print(numpy.__version__)')"
  fi
fi
[ $DRY -eq 1 ] && ARGS+=(--dry-run)

say "scale-check: $(date -u +%FT%TZ) on $(hostname): $CPUS CPUs ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)), $(free -g | awk '/Mem:/ {print $2}') GiB, load $(cut -d' ' -f1-3 /proc/loadavg)"
say "checkout $(git rev-parse --short HEAD 2>/dev/null || echo '(no git)'); python $PYV ($PY)"
versions "$PY" "$LOG" numpy msgspec uvloop uvicorn httptools hpack google.protobuf

# ---- the run -------------------------------------------------------------------------------------------
bounded_run "$PY" benchmarks/scale.py "${ARGS[@]}" "$@"
rc=$?
cp "$TMP/out/scale.md" "$TMP/out/scale.json" "$RES/" 2>/dev/null
tar -czf "$RES/scale-logs.tar.gz" -C "$TMP/out" logs 2>/dev/null
if [ -f "$RES/scale.md" ]; then
  # the CPU table, then the throughput table last: the device tool's reply carries the end of the output
  sed -n '/^## CPU per request/,/^## Idle memory/p' "$RES/scale.md" | head -n -1
  sed -n '/^# Front processes/,/^## CPU per request/p' "$RES/scale.md" | head -n -1
  echo "notes, stalls, memory: $RES/scale.md; log: $LOG"
else
  tail -n 40 "$LOG"
fi
exit $rc
