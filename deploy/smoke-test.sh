#!/usr/bin/env bash
# Smoke test of Kernel's image: deploy/smoke-test.sh [--chroot] [IMAGE]   (default localhost/kernel:latest)
#
# With podman (the default), three containers, each stopped with SIGTERM (exit code and time checked):
#   1. the image's own command (kernel serve --model-repository /models --openai-port 8003) on the
#      models of model_repo_examples/ and deploy/smoke_models/ (each mounted read-only in /models),
#      with a read-only root file system and no capabilities (as the Helm chart runs it): time to
#      ready, tritonclient over HTTP and gRPC, metrics, a streamed chat on the OpenAI-compatible API
#      (8003) and a chat template (jinja2 in the image), the HEALTHCHECK, PID 1 is tini, the user is
#      not root; then SIGTERM with a request in flight: readiness drops at once, the request
#      finishes with 200, the container exits 0.
#   2. `docker run IMAGE serve` (SageMaker): /ping and /invocations, model in /opt/ml/model.
#   3. Vertex AI: AIP_MODE=PREDICTION, AIP_HTTP_PORT, AIP_HEALTH_ROUTE, AIP_PREDICT_ROUTE.
# --chroot (also chosen by itself where podman cannot run containers): no container runtime; the
#   image's file system (podman image mount) under a writable overlay, entered with unshare (new PID
#   and mount namespaces) + chroot as uid 1000, then the image's own ENTRYPOINT + CMD: check 1 above.
#
# The client half is deploy/smoke_client.py. It needs only what the image has (Kernel's runtime:
# tritonclient, numpy), so it runs in the image itself: a `podman run --network=host` container of
# IMAGE per check (in the chroot with --chroot). Nothing is needed on the host beyond podman, so it
# runs on a fresh clone. SMOKE_PYTHON=/path/to/python runs the client on the host instead.
# Host ports are picked by podman (-p 127.0.0.1::PORT) and read back with `podman port`.
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/.." && pwd)"
MODE=podman
if [ "${1:-}" = --chroot ]; then MODE=chroot; shift; fi
IMAGE="${1:-localhost/kernel:latest}"
EXAMPLES="$REPO/model_repo_examples"

say() { printf '\n-- %s\n' "$*"; }
now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.2f", b - a }'; }

work="$(mktemp -d /tmp/kernel-smoke.XXXXXX)"
chmod 755 "$work"
NAMES=()
cleanup() {
    for n in "${NAMES[@]}"; do podman rm -f -t 0 "$n" > /dev/null 2>&1 || true; done
    [ -n "${CHROOT_CLEANUP:-}" ] && eval "$CHROOT_CLEANUP"
    rm -rf "$work"
}
trap cleanup EXIT

# What the containers read, copied where uid 1000 can read it whatever the clone's permissions:
# the client, and the smoke test's own models (`slow` takes 3 s: a request in flight at SIGTERM;
# `echo_chat` answers with its rendered chat template).
mkdir -p "$work/client" "$work/extra"
cp "$HERE/smoke_client.py" "$work/client/"
cp -r "$HERE/smoke_models/." "$work/extra/"
find "$work/extra" -name __pycache__ -prune -exec rm -rf {} +
chmod -R a+rX "$work/client" "$work/extra"

# ---- podman ----------------------------------------------------------------------------------------
if [ "$MODE" = podman ]; then
    eval "$("$HERE/podman-opts.sh" "$IMAGE")"
    if [ "$CAN_RUN" != yes ]; then
        echo "podman cannot run containers here (see above); falling back to --chroot" >&2
        MODE=chroot
    fi
fi

if [ -n "${SMOKE_PYTHON:-}" ]; then
    CLIENT=("$SMOKE_PYTHON" "$work/client/smoke_client.py")
elif [ "$MODE" = podman ]; then
    # the image's own Python, on the host's network: it reaches the ports published on 127.0.0.1
    CLIENT=(podman "${GLOBAL_OPTS[@]}" run --rm --network=host "${RUN_OPTS[@]}" -v "$work/client:/smoke:ro"
            "$IMAGE" python /smoke/smoke_client.py)
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

port() {  # port NAME CONTAINER-PORT: the host port podman published it on
    local p
    p="$(podman port "$1" "$2/tcp" | head -1)"
    echo "${p##*:}"
}

drain() {  # drain HTTP-PORT SIGNAL-COMMAND...: a request in flight, then the signal (see smoke_client.drain)
    local http="$1"; shift
    "${CLIENT[@]}" drain "$http" > "$work/drain.out" 2>&1 &
    local client=$! i
    for i in $(seq 300); do
        grep -q "^in flight" "$work/drain.out" && break
        kill -0 "$client" 2> /dev/null || break
        sleep 0.1
    done
    DRAIN_T0="$(now)"
    "$@" > /dev/null
    echo "SIGTERM sent with a request in flight: $*"
    if ! wait "$client"; then cat "$work/drain.out"; return 1; fi
    sed 's/^/    client: /' "$work/drain.out"
}

if [ "$MODE" = podman ]; then
    name="kernel-smoke-serve-$$"
    mounts=()
    for m in "$EXAMPLES"/*/ "$work/extra"/*/; do
        m="${m%/}"
        mounts+=(-v "$m:/models/$(basename "$m"):ro")
    done
    say "1. $IMAGE's own command, models in /models (ro): $(cd "$EXAMPLES" && echo */) $(cd "$work/extra" && echo */)"
    t0="$(now)"
    # hardened as the Helm chart runs it: read-only root (podman mounts a tmpfs on /tmp), no capabilities
    run "$name" -p 127.0.0.1::8000 -p 127.0.0.1::8001 -p 127.0.0.1::8002 -p 127.0.0.1::8003 \
        --read-only --cap-drop=ALL --security-opt=no-new-privileges -e XDG_CACHE_HOME=/tmp/cache \
        "${mounts[@]}" "$IMAGE"
    H="$(port "$name" 8000)"; G="$(port "$name" 8001)"; M="$(port "$name" 8002)"; O="$(port "$name" 8003)"
    echo "published on 127.0.0.1: HTTP :$H gRPC :$G metrics :$M OpenAI :$O"
    "${CLIENT[@]}" wait "http://127.0.0.1:$H/v2/health/ready" || { podman logs "$name" | tail -30; exit 1; }
    echo "time to ready from podman run: $(since "$t0") s"
    "${CLIENT[@]}" kserve "$H" "$G" "$M"
    "${CLIENT[@]}" openai "$O"
    podman healthcheck run "$name" && echo "HEALTHCHECK (kernel-healthcheck): healthy"
    echo "PID 1: $(podman exec "$name" cat /proc/1/comm); user: $(podman exec "$name" id -u):$(podman exec "$name" id -g)"
    [ "$(podman exec "$name" cat /proc/1/comm)" = tini ] && [ "$(podman exec "$name" id -u)" != 0 ]
    podman top "$name" pid ppid args | sed 's/^/    /'
    drain "$H" podman kill --signal TERM "$name"
    stop_and_wait "$name" "$DRAIN_T0"

    name="kernel-smoke-sagemaker-$$"
    say "2. SageMaker: $IMAGE serve, add_sub in /opt/ml/model"
    t0="$(now)"
    run "$name" -p 127.0.0.1::8080 -v "$EXAMPLES/add_sub:/opt/ml/model/add_sub:ro" "$IMAGE" serve
    P="$(port "$name" 8080)"
    "${CLIENT[@]}" wait "http://127.0.0.1:$P/ping" || { podman logs "$name" | tail -30; exit 1; }
    echo "time to ready from podman run: $(since "$t0") s"
    "${CLIENT[@]}" sagemaker "$P"
    podman healthcheck run "$name" && echo "HEALTHCHECK (kernel-healthcheck): healthy"
    stop_and_wait "$name"

    name="kernel-smoke-vertex-$$"
    HEALTH=/v1/endpoints/1/deployedModels/2
    PREDICT=/v1/endpoints/1/deployedModels/2:predict
    say "3. Vertex AI: AIP_MODE=PREDICTION, image's default command, add_sub at /models"
    t0="$(now)"
    run "$name" -p 127.0.0.1::8080 -v "$EXAMPLES/add_sub:/models/add_sub:ro" \
        -e AIP_MODE=PREDICTION -e AIP_HTTP_PORT=8080 -e AIP_HEALTH_ROUTE="$HEALTH" -e AIP_PREDICT_ROUTE="$PREDICT" \
        "$IMAGE"
    P="$(port "$name" 8080)"
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
mkdir -p "$root/extra" "$root/smoke"
mount --bind "$work/extra" "$root/extra"
mount --bind -o ro "$work/client" "$root/smoke"
cp /etc/resolv.conf "$root/etc/resolv.conf" 2>/dev/null || true
mapfile -t ENVS < <(podman image inspect --format '{{range .Config.Env}}{{println .}}{{end}}' "$IMAGE" | sed '/^$/d')
mapfile -t ENTRY < <(podman image inspect --format '{{range .Config.Entrypoint}}{{println .}}{{end}}' "$IMAGE" | sed '/^$/d')
mapfile -t CMD < <(podman image inspect --format '{{range .Config.Cmd}}{{println .}}{{end}}' "$IMAGE" | sed '/^$/d')
USERSPEC="$(podman image inspect --format '{{.Config.User}}' "$IMAGE")"
echo "ENTRYPOINT ${ENTRY[*]}; CMD ${CMD[*]}; USER $USERSPEC; ENV ${ENVS[*]}"
if [ -z "${SMOKE_PYTHON:-}" ]; then  # the image's own Python, in the chroot (the host's network)
    CLIENT=(env -i "${ENVS[@]}" chroot --userspec="$USERSPEC" "$root" python /smoke/smoke_client.py)
fi
free_port() { "${CLIENT[@]:0:${#CLIENT[@]}-1}" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
H="$(free_port)"; G="$(free_port)"; M="$(free_port)"; O="$(free_port)"
t0="$(now)"
# the host's network (no network namespace): the ports are chosen free on the host, after the
# image's own CMD (the last --openai-port wins)
env -i "${ENVS[@]}" unshare --pid --fork --mount --mount-proc="$root/proc" \
    chroot --userspec="$USERSPEC" "$root" "${ENTRY[@]}" "${CMD[@]}" --model-repository /extra \
    --http-port "$H" --grpc-port "$G" --metrics-port "$M" --openai-port "$O" > "$work/chroot.log" 2>&1 &
unshare_pid=$!
sleep 0.5
pid1="$(pgrep -P "$unshare_pid" | head -1)"
"${CLIENT[@]}" wait "http://127.0.0.1:$H/v2/health/ready" || { tail -30 "$work/chroot.log"; exit 1; }
echo "time to ready: $(since "$t0") s"
"${CLIENT[@]}" kserve "$H" "$G" "$M"
"${CLIENT[@]}" openai "$O"
echo "PID 1 of the namespace: $(cat "/proc/$pid1/comm") (host pid $pid1), uid $(stat -c %u "/proc/$pid1")"
[ "$(cat "/proc/$pid1/comm")" = tini ] && [ "$(stat -c %u "/proc/$pid1")" != 0 ]
env KERNEL_HEALTHCHECK_URL="http://127.0.0.1:$H/v2/health/ready" chroot --userspec="$USERSPEC" "$root" \
    /opt/kernel/bin/python3 /usr/local/bin/kernel-healthcheck && echo "HEALTHCHECK (kernel-healthcheck): healthy"
drain "$H" kill -TERM "$pid1"
set +e; wait "$unshare_pid"; code=$?; set -e
echo "SIGTERM -> exit: code $code after $(since "$DRAIN_T0") s"
grep -E "Received signal|in-flight|unloaded" "$work/chroot.log" | sed 's/^/    log: /' || true
[ "$code" = 0 ] || { tail -30 "$work/chroot.log"; exit 1; }
say "smoke test passed (chroot)"
