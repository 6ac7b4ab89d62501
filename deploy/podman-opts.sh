#!/usr/bin/env bash
# podman-opts.sh IMAGE: find out whether this machine can run containers with podman, and with which
# options; prints bash assignments for eval: GLOBAL_OPTS=(...) RUN_OPTS=(...) CAN_RUN=yes|no.
# Each failed attempt is reported on stderr with the exact command and error.
#
# podman-opts.sh --run-flags [IMAGE]   (IMAGE: localhost/kernel:latest by default)
#   prints only the options `podman run` needs here, for a command line:
#     podman run --rm $(deploy/podman-opts.sh --run-flags) -p 8000-8003:8000-8003 ... localhost/kernel:latest
#   nothing where podman's defaults work (rootless podman, or root with CAP_SYS_RESOURCE), the two
#   --ulimit flags below where they do not; says on stderr only when nothing works (or a global
#   option such as --runtime runc is needed, which cannot follow `run`).
#
# Tried in order:
#   1. podman run --rm IMAGE true                                     (podman's defaults)
#   2. + --ulimit nofile=H:H --ulimit nproc=N:N                       rootful podman asks for rlimits
#      (nofile 1048576) above the caller's hard limits; without CAP_SYS_RESOURCE the runtime gets
#      EPERM. H is `ulimit -Hn`; N is `ulimit -Hu` capped at 32768, the nproc limit podman gives conmon.
#   3. + podman --runtime runc                                        crun refuses hosts whose
#      cgroup v2 hierarchy holds controllers beside cgroup v1 ("cgroups in hybrid mode not supported")
set -uo pipefail
FLAGS=0
if [ "${1:-}" = --run-flags ]; then FLAGS=1; shift; set -- "${1:-localhost/kernel:latest}"; fi
IMAGE="${1:?usage: podman-opts.sh IMAGE | --run-flags [IMAGE]}"

hn="$(ulimit -Hn)"; hu="$(ulimit -Hu)"
[ "$hn" = unlimited ] && hn=1048576
{ [ "$hu" = unlimited ] || [ "$hu" -gt 32768 ]; } && hu=32768
ULIMITS=(--ulimit "nofile=$hn:$hn" --ulimit "nproc=$hu:$hu")

emit() {  # emit GLOBAL... -- RUN... ; CAN_RUN
    local can="$1"; shift
    local g=() r=() seen=0
    for a in "$@"; do
        if [ "$a" = -- ]; then seen=1; continue; fi
        if [ $seen = 0 ]; then g+=("$a"); else r+=("$a"); fi
    done
    printf 'GLOBAL_OPTS=(%s) RUN_OPTS=(%s) CAN_RUN=%s\n' "${g[*]:-}" "${r[*]:-}" "$can"
}

try() {  # try GLOBAL... -- RUN...
    local g=() r=() seen=0
    for a in "$@"; do
        if [ "$a" = -- ]; then seen=1; continue; fi
        if [ $seen = 0 ]; then g+=("$a"); else r+=("$a"); fi
    done
    local err
    if err="$(podman "${g[@]}" run --rm "${r[@]}" "$IMAGE" true 2>&1)"; then
        return 0
    fi
    # (podman 4.3 without systemd also complains about HEALTHCHECK timers; not the failure)
    err="$(grep -v "unable to get systemd connection" <<< "$err")"
    FAILURES+=("podman-opts: 'podman ${g[*]} run --rm ${r[*]} $IMAGE true' failed: $err")
    [ "$FLAGS" = 1 ] || echo "${FAILURES[-1]}" >&2
    return 1
}

FAILURES=()
if [ "$FLAGS" = 1 ]; then  # the run options alone, on one line
    if try --; then exit 0; fi
    if try -- "${ULIMITS[@]}"; then echo "${ULIMITS[*]}"; exit 0; fi
    printf '%s\n' "${FAILURES[@]}" >&2
    if command -v runc > /dev/null && try --runtime runc -- "${ULIMITS[@]}"; then
        echo "podman-opts: podman needs the global option --runtime runc here: podman --runtime runc run ..." >&2
        echo "${ULIMITS[*]}"
        exit 0
    fi
    echo "podman-opts: this machine cannot run containers with podman" >&2
    exit 1
fi
if try --; then emit yes --; exit 0; fi
if try -- "${ULIMITS[@]}"; then emit yes -- "${ULIMITS[@]}"; exit 0; fi
if command -v runc > /dev/null; then
    if try --runtime runc -- "${ULIMITS[@]}"; then emit yes --runtime runc -- "${ULIMITS[@]}"; exit 0; fi
else
    echo "podman-opts: runc is not installed (apt-get install runc)" >&2
fi
echo "podman-opts: this machine cannot run containers with podman" >&2
emit no -- "${ULIMITS[@]}"
