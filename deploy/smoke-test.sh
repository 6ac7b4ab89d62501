#!/usr/bin/env bash
# Smoke test of Kernel's image: deploy/smoke-test.sh [--chroot] [IMAGE]   (default localhost/kernel:latest)
#
# With podman (the default), three containers, each stopped with SIGTERM (exit code and time checked):
#   1. kernel serve on model_repo_examples/ (mounted read-only at /models) plus a `slow` model, with
#      a read-only root file system and no capabilities (as the Helm chart runs it):
#      time to ready, tritonclient over HTTP and gRPC, metrics, the HEALTHCHECK, PID 1 is tini,
#      the user is not root; then SIGTERM with a request in flight: readiness drops at once, the
#      request finishes with 200, the container exits 0.
#   2. `docker run IMAGE serve` (SageMaker): /ping and /invocations, model in /opt/ml/model.
#   3. Vertex AI: AIP_MODE=PREDICTION, AIP_HTTP_PORT, AIP_HEALTH_ROUTE, AIP_PREDICT_ROUTE.
# --chroot (also chosen by itself where podman cannot run containers): no container runtime; the
#   image's file system (podman image mount) under a writable overlay, entered with unshare (new PID
#   and mount namespaces) + chroot as uid 1000, then the image's own ENTRYPOINT + CMD: check 1 above.
#
# The client half is deploy/smoke_client.py, run with $SMOKE_PYTHON (default: the repository's
# .venv/bin/python, which has tritonclient).
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/.." && pwd)"
MODE=podman
if [ "${1:-}" = --chroot ]; then MODE=chroot; shift; fi
IMAGE="${1:-localhost/kernel:latest}"
PY="${SMOKE_PYTHON:-$REPO/.venv/bin/python}"
CLIENT=("$PY" "$HERE/smoke_client.py")
EXAMPLES="$REPO/model_repo_examples"

say() { printf '\n-- %s\n' "$*"; }
now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.2f", b - a }'; }
free_port() { "$PY" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

work="$(mktemp -d /tmp/kernel-smoke.XXXXXX)"
chmod 755 "$work"
NAMES=()
cleanup() {
    for n in "${NAMES[@]}"; do podman rm -f -t 0 "$n" > /dev/null 2>&1 || true; done
    [ -n "${CHROOT_CLEANUP:-}" ] && eval "$CHROOT_CLEANUP"
    rm -rf "$work"
}
trap cleanup EXIT

# A model that takes 3 s, to have a request in flight when SIGTERM arrives.
mkdir -p "$work/extra/slow/1"
cat > "$work/extra/slow/config.pbtxt" <<'EOF'
name: "slow"
backend: "python"
max_batch_size: 0
input [ { name: "IN", data_type: TYPE_FP32, dims: [ 1 ] } ]
output [ { name: "OUT", data_type: TYPE_FP32, dims: [ 1 ] } ]
EOF
cat > "$work/extra/slow/1/model.py" <<'EOF'
import time

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        time.sleep(3)
        return [pb_utils.InferenceResponse([pb_utils.Tensor("OUT", pb_utils.get_input_tensor_by_name(r, "IN").as_numpy())])
                for r in requests]
EOF
chmod -R a+rX "$work/extra"

# ---- podman ----------------------------------------------------------------------------------------
if [ "$MODE" = podman ]; then
    eval "$("$HERE/podman-opts.sh" "$IMAGE")"
    if [ "$CAN_RUN" != yes ]; then
        echo "podman cannot run containers here (see above); falling back to --chroot" >&2
        MODE=chroot
    fi
fi

stop_and_wait() {  # stop_and_wait NAME [already-signalled]: SIGTERM, then exit code and seconds
    local name="$1" t0 code
    t0="${2:-}"
    if [ -z "$t0" ]; then t0="$(now)"; podman kill --signal TERM "$name" > /dev/null; fi
    code="$(podman "${GLOBAL_OPTS[@]}" wait "$name")"
    echo "SIGTERM -> exit: code $code after $(since "$t0") s"
    podman logs "$name" 2>&1 | grep -E "Received signal|in-flight|unloaded|Exiting|Traceback" | sed 's/^/    log: /' || true
    [ "$code" = 0 ] || { podman logs "$name" 2>&1 | tail -30; return 1; }
}

run() {  # run NAME RUN-ARGS... : podman run -d; prints nothing, remembers NAME
    local name="$1"; shift
    NAMES+=("$name")
    # (podman 4.3 without systemd logs that it cannot schedule the periodic HEALTHCHECK timer;
    # `podman healthcheck run` below runs it on demand)
    podman "${GLOBAL_OPTS[@]}" run -d --name "$name" "${RUN_OPTS[@]}" "$@" > /dev/null \
        2> >(grep -v "unable to get systemd connection" >&2)
}

if [ "$MODE" = podman ]; then
    H="$(free_port)"; G="$(free_port)"; M="$(free_port)"
    name="kernel-smoke-serve-$$"
    say "1. kernel serve: $IMAGE, model_repo_examples at /models (ro), HTTP :$H gRPC :$G metrics :$M"
    t0="$(now)"
    # hardened as the Helm chart runs it: read-only root (podman mounts a tmpfs on /tmp), no capabilities
    run "$name" -p "127.0.0.1:$H:8000" -p "127.0.0.1:$G:8001" -p "127.0.0.1:$M:8002" \
        --read-only --cap-drop=ALL --security-opt=no-new-privileges -e XDG_CACHE_HOME=/tmp/cache \
        -v "$EXAMPLES:/models:ro" -v "$work/extra:/extra:ro" \
        "$IMAGE" kernel serve --model-repository /models --model-repository /extra
    "${CLIENT[@]}" wait "http://127.0.0.1:$H/v2/health/ready" || { podman logs "$name" | tail -30; exit 1; }
    echo "time to ready from podman run: $(since "$t0") s"
    "${CLIENT[@]}" kserve "$H" "$G" "$M"
    podman healthcheck run "$name" && echo "HEALTHCHECK (kernel-healthcheck): healthy"
    echo "PID 1: $(podman exec "$name" cat /proc/1/comm); user: $(podman exec "$name" id -u):$(podman exec "$name" id -g)"
    [ "$(podman exec "$name" cat /proc/1/comm)" = tini ] && [ "$(podman exec "$name" id -u)" != 0 ]
    podman top "$name" pid ppid args | sed 's/^/    /'
    t0="$(now)"
    "${CLIENT[@]}" drain "$H" podman kill --signal TERM "$name" > >(grep -v "^$name\$")
    stop_and_wait "$name" "$t0"

    P="$(free_port)"
    name="kernel-smoke-sagemaker-$$"
    say "2. SageMaker: $IMAGE serve, add_sub in /opt/ml/model, :$P -> 8080"
    t0="$(now)"
    run "$name" -p "127.0.0.1:$P:8080" -v "$EXAMPLES/add_sub:/opt/ml/model/add_sub:ro" "$IMAGE" serve
    "${CLIENT[@]}" wait "http://127.0.0.1:$P/ping" || { podman logs "$name" | tail -30; exit 1; }
    echo "time to ready from podman run: $(since "$t0") s"
    "${CLIENT[@]}" sagemaker "$P"
    podman healthcheck run "$name" && echo "HEALTHCHECK (kernel-healthcheck): healthy"
    stop_and_wait "$name"

    P="$(free_port)"
    name="kernel-smoke-vertex-$$"
    HEALTH=/v1/endpoints/1/deployedModels/2
    PREDICT=/v1/endpoints/1/deployedModels/2:predict
    say "3. Vertex AI: AIP_MODE=PREDICTION, image's default command, add_sub at /models, :$P -> 8080"
    t0="$(now)"
    run "$name" -p "127.0.0.1:$P:8080" -v "$EXAMPLES/add_sub:/models/add_sub:ro" \
        -e AIP_MODE=PREDICTION -e AIP_HTTP_PORT=8080 -e AIP_HEALTH_ROUTE="$HEALTH" -e AIP_PREDICT_ROUTE="$PREDICT" \
        "$IMAGE"
    "${CLIENT[@]}" wait "http://127.0.0.1:$P$HEALTH" || { podman logs "$name" | tail -30; exit 1; }
    echo "time to ready from podman run: $(since "$t0") s"
    "${CLIENT[@]}" vertex "$P" "$HEALTH" "$PREDICT"
    podman healthcheck run "$name" && echo "HEALTHCHECK (kernel-healthcheck): healthy"
    stop_and_wait "$name"
    say "smoke test passed (podman)"
    exit 0
fi

# ---- chroot: no container runtime ------------------------------------------------------------------------
say "chroot mode: $IMAGE's file system, unshare --pid --mount + chroot as uid 1000"
lower="$(podman image mount "$IMAGE")"
mkdir -p "$work/upper" "$work/ovl" "$work/root"
CHROOT_CLEANUP="umount -R '$work/root' 2>/dev/null || true; podman image unmount '$IMAGE' > /dev/null 2>&1 || true"
mount -t overlay overlay -o "lowerdir=$lower,upperdir=$work/upper,workdir=$work/ovl" "$work/root"
root="$work/root"
mount --rbind /dev "$root/dev"
mount -t tmpfs tmpfs "$root/tmp"
mount --bind -o ro "$EXAMPLES" "$root/models"
mkdir -p "$root/extra" && mount --bind "$work/extra" "$root/extra"
cp /etc/resolv.conf "$root/etc/resolv.conf" 2>/dev/null || true
mapfile -t ENVS < <(podman image inspect --format '{{range .Config.Env}}{{println .}}{{end}}' "$IMAGE" | sed '/^$/d')
mapfile -t ENTRY < <(podman image inspect --format '{{range .Config.Entrypoint}}{{println .}}{{end}}' "$IMAGE" | sed '/^$/d')
mapfile -t CMD < <(podman image inspect --format '{{range .Config.Cmd}}{{println .}}{{end}}' "$IMAGE" | sed '/^$/d')
USERSPEC="$(podman image inspect --format '{{.Config.User}}' "$IMAGE")"
echo "ENTRYPOINT ${ENTRY[*]}; CMD ${CMD[*]}; USER $USERSPEC; ENV ${ENVS[*]}"
H="$(free_port)"; G="$(free_port)"; M="$(free_port)"
t0="$(now)"
# the host's network (no network namespace): the ports are chosen free on the host
env -i "${ENVS[@]}" unshare --pid --fork --mount --mount-proc="$root/proc" \
    chroot --userspec="$USERSPEC" "$root" "${ENTRY[@]}" "${CMD[@]}" --model-repository /extra \
    --http-port "$H" --grpc-port "$G" --metrics-port "$M" > "$work/chroot.log" 2>&1 &
unshare_pid=$!
sleep 0.5
pid1="$(pgrep -P "$unshare_pid" | head -1)"
"${CLIENT[@]}" wait "http://127.0.0.1:$H/v2/health/ready" || { tail -30 "$work/chroot.log"; exit 1; }
echo "time to ready: $(since "$t0") s"
"${CLIENT[@]}" kserve "$H" "$G" "$M"
echo "PID 1 of the namespace: $(cat "/proc/$pid1/comm") (host pid $pid1), uid $(stat -c %u "/proc/$pid1")"
[ "$(cat "/proc/$pid1/comm")" = tini ] && [ "$(stat -c %u "/proc/$pid1")" != 0 ]
env KERNEL_HEALTHCHECK_URL="http://127.0.0.1:$H/v2/health/ready" chroot --userspec="$USERSPEC" "$root" \
    /opt/kernel/bin/python3 /usr/local/bin/kernel-healthcheck && echo "HEALTHCHECK (kernel-healthcheck): healthy"
t0="$(now)"
"${CLIENT[@]}" drain "$H" kill -TERM "$pid1"
set +e; wait "$unshare_pid"; code=$?; set -e
echo "SIGTERM -> exit: code $code after $(since "$t0") s"
grep -E "Received signal|in-flight|unloaded" "$work/chroot.log" | sed 's/^/    log: /' || true
[ "$code" = 0 ] || { tail -30 "$work/chroot.log"; exit 1; }
say "smoke test passed (chroot)"
