# Sourced by scripts/gpu-check.sh and scripts/scale-check.sh: Kernel from this checkout, with what a
# machine without a package registry lacks installed from the wheels carried in .whl/
# (scripts/gpu-wheels.sh fills it). Defines:
#   carried_wheels PY SITE LOG   install .whl/*.whl into SITE (no network, no deps) and put SITE on
#                                PYTHONPATH; nothing when no wheels are carried; 1 when pip failed
#   kernel_on_path PY            the checkout on PYTHONPATH, and (when Kernel is not installed) two
#                                links that map transports/ and backends/ into the kernel package as
#                                the wheel does; they are removed at exit
#   carried_tools NAME PY TMP LOG  perf_analyzer (.whl/perf/) and real Triton (.whl/triton/, for PY's
#                                Python version) unpacked under TMP: CARRIED_ARGS gets --perf-dir and
#                                --triton-root for what is there, and NAME says (say) what is not
#   versions PY LOG MODULE...    each module's version (or why it is not importable) into LOG
#   bounded_run PY SCRIPT ARGS...  PY SCRIPT --out $TMP/out --budget-s (time left - 60) ARGS, output
#                                into $LOG, killed 10 s before $LIMIT seconds from $START; its exit code
carried_wheels() {
  local py=$1 site=$2 log=$3
  ls .whl/*.whl >/dev/null 2>&1 || return 0
  "$py" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" .whl/*.whl \
    >> "$log" 2>&1 || return 1
  export PYTHONPATH=$site${PYTHONPATH:+:$PYTHONPATH}
}

CARRIED_LINKS=()
kernel_on_path() {
  local py=$1 part
  # Workers drop the current directory from sys.path, so the checkout goes on PYTHONPATH.
  export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}
  if ! (cd / && "$py" -c "import kernel.transports.http, kernel.backends.python.worker" >/dev/null 2>&1); then
    for part in transports backends; do
      if [ ! -e "kernel/$part" ]; then ln -s "../$part" "kernel/$part"; CARRIED_LINKS+=("kernel/$part"); fi
    done
  fi
  trap 'for l in "${CARRIED_LINKS[@]}"; do rm -f "$l"; done' EXIT
}

CARRIED_ARGS=()
carried_tools() {
  local name=$1 py=$2 tmp=$3 pyv
  CARRIED_ARGS=()
  if [ -f .whl/perf/perf_analyzer.gz ]; then
    mkdir -p "$tmp/perf"
    gunzip -c .whl/perf/perf_analyzer.gz > "$tmp/perf/perf_analyzer" && chmod +x "$tmp/perf/perf_analyzer"
    cp .whl/perf/*.so* "$tmp/perf/" 2>/dev/null
    CARRIED_ARGS+=(--perf-dir "$tmp/perf")
  else
    say "$name: .whl/perf/perf_analyzer.gz is not carried (scripts/gpu-wheels.sh --scale): benchmarks/.peers or none"
  fi
  pyv=$("$py" -c 'import sys; print("%d.%d" % sys.version_info[:2])')
  if [ -f ".whl/triton/triton-py$pyv.tar.xz" ]; then
    mkdir -p "$tmp/triton"
    if tar -xJf ".whl/triton/triton-py$pyv.tar.xz" -C "$tmp/triton"; then CARRIED_ARGS+=(--triton-root "$tmp/triton")
    else say "$name: unpacking .whl/triton/triton-py$pyv.tar.xz failed"; fi
  else
    say "$name: no .whl/triton/triton-py$pyv.tar.xz (this python is $pyv; carried: $(ls .whl/triton 2>/dev/null | tr '\n' ' ')): benchmarks/.peers or no Triton"
  fi
}

versions() {
  local py=$1 log=$2; shift 2
  "$py" -c '
import importlib, sys
for name in sys.argv[1:]:
    try:
        print(name, getattr(importlib.import_module(name), "__version__", "?"))
    except Exception as exc:  # noqa: BLE001
        print(f"{name}: not importable ({type(exc).__name__}: {exc})")
' "$@" >> "$log" 2>&1
}

bounded_run() {
  local py=$1 script=$2 left budget rc; shift 2
  left=$(( LIMIT - ($(date +%s) - START) ))
  budget=$(( left - 60 ))  # no point is started after this; the last one and the stops fit in the rest
  say ""
  say "==== $script (no new point after ${budget}s, stopped at $(( left - 10 ))s)"
  PYTHONUNBUFFERED=1 timeout --kill-after=5 $(( left - 10 )) "$py" "$script" --out "$TMP/out" --budget-s "$budget" "$@" \
    >> "$LOG" 2>&1
  rc=$?
  say "==== $script: exit $rc after $(( $(date +%s) - START ))s in all"
  return $rc
}
