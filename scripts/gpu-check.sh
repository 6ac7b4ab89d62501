#!/usr/bin/env bash
# Every GPU path of Kernel on a real GPU (issues 19 and 28), in one run that writes one result file.
#
# On a machine without a GPU it says so and exits 0 having run nothing ("skipped: no GPU").
# On a GPU machine it installs nothing from the network: what the machine lacks comes from .whl/
# (filled here beforehand by scripts/gpu-wheels.sh) and is installed into a temp folder. Then:
#   1. pytest tests/gpu (the stand-in tests and tests/gpu/test_on_gpu.py on the real GPU: KIND_GPU
#      add_sub over HTTP and gRPC, 64 MiB DLPack identity through CUDA shared memory in and out,
#      BLS passing a GPU tensor between two models with no device -> host copy, an ensemble
#      keeping its intermediate on the GPU, the release rules, nv_gpu_* metrics; the bundled torch
#      example, tests/gpu/test_gpu_example.py);
#   2. perf_analyzer --shared-memory cuda against `kernel serve` (when .whl/perf carries it);
#      side by side with real Triton: scripts/gpu-vs-triton.sh (another .whl/, another device call);
#   3. benchmarks/gpu_bench.py (GPU path vs host path, device copy ceilings).
# Each step has a time limit; the whole run stays under 8 minutes.
#
# With the device tool of this workplace:
#   1. In the checkout the device tool sends (the one the session was started in: a helper's own
#      worktree is NOT what travels, so this script and the code under test must be in that
#      checkout), fill .whl/ once (network here; git-ignored):  bash scripts/gpu-wheels.sh
#      It prints its size: about 22 MiB, with the tracked tree (about 4 MiB) well under the tool's
#      64 MiB. The .venv is not carried (over 64 MiB, and built for this machine's Python, not the
#      GPU image's 3.12); the GPU image's own python3 has CuPy (CUDA 13), torch, NumPy, grpcio,
#      protobuf, uvloop, pytest, nvidia-ml-py, prometheus-client, wrapt, cuda-python.
#   2. run(command="bash scripts/gpu-check.sh", carry=[".whl"], timeout_s=540)
#      Expect about 3-5 minutes; the step limits below add up to 7 minutes, so a rerun fits in one
#      15-minute device window. give_back() afterwards unless rerunning at once.
# The result file is $OUT/gpu-check.txt there (it comes back); elsewhere pass a path:
#     bash scripts/gpu-check.sh [RESULT_FILE]        (default: ${TMPDIR:-/tmp}/kernel-gpu-check.txt)
set -u
cd "$(dirname "$0")/.."
ROOT=$(pwd)
if [ -n "${1:-}" ]; then RESULT=$1
elif [ -n "${OUT:-}" ]; then RESULT=$OUT/gpu-check.txt
else RESULT=${TMPDIR:-/tmp}/kernel-gpu-check.txt
fi
mkdir -p "$(dirname "$RESULT")"
: > "$RESULT"
say() { echo "$*" | tee -a "$RESULT"; }
START=$(date +%s)
PY=${PYTHON:-python3}
if [ -x "$ROOT/.venv/bin/python" ] && [ -z "${PYTHON:-}" ] && ! command -v nvidia-smi >/dev/null 2>&1; then
  PY=$ROOT/.venv/bin/python  # a developer's machine: its venv, for the dry run below
fi

# ---- 0. is there a GPU? ---------------------------------------------------------------------------
why=""
if ! command -v nvidia-smi >/dev/null 2>&1; then why="nvidia-smi is not installed"
elif ! nvidia-smi -L >/dev/null 2>&1; then why="nvidia-smi sees no device"
elif ! "$PY" -c "import cupy, sys; sys.exit(0 if cupy.cuda.runtime.getDeviceCount() > 0 else 1)" >/dev/null 2>&1; then
  why="CuPy is missing or sees no CUDA device"
fi
if [ -n "$why" ]; then
  say "gpu-check: skipped: no GPU ($why). Nothing was run."
  exit 0
fi

# ---- 1. what the machine lacks, from carried wheels (no network) -----------------------------------
. scripts/carried.sh
carried_wheels "$PY" "${TMPDIR:-/tmp}/kernel-gpu-site" "$RESULT" \
  || { say "gpu-check: installing the carried wheels failed (see above)"; exit 1; }
kernel_on_path "$PY"

say "gpu-check: $(date -u +%FT%TZ) on $(hostname)"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1 | tee -a "$RESULT"
"$PY" - <<'EOF' 2>&1 | tee -a "$RESULT"
import importlib, sys
print("python", sys.version.split()[0])
for name in ("cupy", "torch", "numpy", "tritonclient", "grpc", "google.protobuf", "msgspec", "uvloop", "pynvml"):
    try:
        module = importlib.import_module(name)
        print(f"{name} {getattr(module, '__version__', '?')}")
    except Exception as exc:  # noqa: BLE001
        print(f"{name}: not importable ({type(exc).__name__}: {exc})")
import kernel.transports.http, kernel.backends.python.worker
print("kernel importable from", kernel.__file__)
EOF

status=0
step() {  # step NAME LIMIT_SECONDS COMMAND...
  local name=$1 limit=$2; shift 2
  say ""
  say "==== $name (limit ${limit}s)"
  local t0=$(date +%s)
  PYTHONUNBUFFERED=1 timeout --kill-after=10 "$limit" "$@" >> "$RESULT" 2>&1
  local rc=$?
  say "==== $name: exit $rc after $(( $(date +%s) - t0 ))s"
  [ $rc -eq 0 ] || status=1
}

# ---- 2. the tests ------------------------------------------------------------------------------------
step "pytest tests/gpu" 240 "$PY" -m pytest -v -s -rs -p no:cacheprovider tests/gpu
# On a GPU machine none of the real-GPU tests may skip: one that did would hide a failure.
if grep -qE "^tests/gpu/test_on_gpu.py::.* SKIPPED" "$RESULT"; then
  say "gpu-check: tests/gpu/test_on_gpu.py skipped tests on a GPU machine (see the reasons above): FAILED"
  status=1
fi

# ---- 3. perf_analyzer with CUDA shared memory -----------------------------------------------------------
if [ -f .whl/perf/perf_analyzer.gz ]; then
  PERF=${TMPDIR:-/tmp}/kernel-perf
  mkdir -p "$PERF"
  gunzip -c .whl/perf/perf_analyzer.gz > "$PERF/perf_analyzer" && chmod +x "$PERF/perf_analyzer"
  cp .whl/perf/*.so* "$PERF/" 2>/dev/null
  step "perf_analyzer --shared-memory cuda" 90 "$PY" - "$PERF" <<'EOF'
import os, subprocess, sys, tempfile
from pathlib import Path
sys.path[:0] = ["tests", "tests/gpu"]
from conftest import EXAMPLES, KernelProcess
from gpu_models import gpu_repository
import shutil

perf = Path(sys.argv[1])
repo = gpu_repository(Path(tempfile.mkdtemp(prefix="kernel-perf-")) / "models")
shutil.copytree(EXAMPLES / "add_sub", repo / "add_sub")
server = KernelProcess([repo])
env = dict(os.environ, LD_LIBRARY_PATH=f"{perf}:{os.environ.get('LD_LIBRARY_PATH', '')}")
failed = 0
try:
    server.wait_ready(60)
    runs = [("add_sub", "http", server.url, []), ("add_sub", "grpc", server.grpc_url, []),
            ("probe", "http", server.url, ["--shape", "INPUT0:262144", "--output-shared-memory-size", "1048576"])]
    for model, proto, url, extra in runs:
        cmd = [str(perf / "perf_analyzer"), "-m", model, "-i", proto, "-u", url, "--shared-memory", "cuda",
               "--concurrency-range", "1:4:3", "--measurement-interval", "1500", "--max-trials", "6",
               "--stability-percentage", "25", *extra]
        print("$", " ".join(cmd), flush=True)
        try:
            rc = subprocess.run(cmd, env=env, timeout=25).returncode
        except subprocess.TimeoutExpired:
            rc = "timed out after 25 s"
        print(f"perf_analyzer {model} {proto}: exit {rc}", flush=True)
        failed |= rc != 0
finally:
    server.stop()
sys.exit(1 if failed else 0)
EOF
else
  say ""
  say "==== perf_analyzer: skipped (.whl/perf/perf_analyzer.gz is not carried: run scripts/gpu-wheels.sh)"
fi

# ---- 4. the benchmark --------------------------------------------------------------------------------
BENCH=$(mktemp)
step "benchmarks/gpu_bench.py" 100 "$PY" benchmarks/gpu_bench.py --out "$BENCH"
say "---- benchmark results (JSON)"
cat "$BENCH" >> "$RESULT" 2>/dev/null
rm -f "$BENCH"

say ""
say "gpu-check: $( [ $status -eq 0 ] && echo PASSED || echo FAILED ) in $(( $(date +%s) - START ))s; results in $RESULT"
grep -E "^(tests/gpu/.*(PASSED|FAILED|SKIPPED|ERROR)|FAILED|ERROR|=+ .*(passed|failed))" "$RESULT" | tail -60
exit $status
