# Sourced by scripts/gpu-check.sh and scripts/scale-check.sh: Kernel from this checkout, with what a
# machine without a package registry lacks installed from the wheels carried in .whl/
# (scripts/gpu-wheels.sh fills it). Defines:
#   carried_wheels PY SITE LOG   install .whl/*.whl into SITE (no network, no deps) and put SITE on
#                                PYTHONPATH; nothing when no wheels are carried; 1 when pip failed
#   kernel_on_path PY            the checkout on PYTHONPATH, and (when Kernel is not installed) two
#                                links that map transports/ and backends/ into the kernel package as
#                                the wheel does; they are removed at exit
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
