#!/usr/bin/env bash
# Build Kernel's image with podman on a machine that reaches no container registry, then smoke-test it.
#
#   deploy/build-image.sh [--tag TAG] [--ref GITREF] [--suite SUITE] [--rebuild-base] [--online] [--no-smoke]
#
# 1. installs podman, buildah, debootstrap and runc with apt when missing (needs root);
# 2. makes the base image: a Debian root filesystem (debootstrap --variant=minbase with python3,
#    python3-venv, tini, ca-certificates) imported with `podman import` as localhost/kernel-base:SUITE;
# 3. makes the build context: Kernel's committed source (`git archive GITREF`, default HEAD), this
#    folder (deploy/) from the working tree over it, and in .wheels/ every wheel the install needs,
#    downloaded on the host with pip for the base's Python and glibc (the build runs with no network);
# 4. podman build --network=none --format docker (HEALTHCHECK is a docker-format field)
#      --build-arg BASE=localhost/kernel-base:SUITE --build-arg PIP_OFFLINE=1 -f deploy/Dockerfile
# 5. runs deploy/smoke-test.sh TAG (unless --no-smoke).
#
# Environment: PYTHON (a host Python >= 3.11 with pip, default python3), DEBIAN_MIRROR
# (default http://deb.debian.org/debian), KEEP_CONTEXT=1 keeps the build context.
# Where crun cannot start containers (cgroup v1/v2 hybrid hosts) or podman's default rlimits are
# above the caller's hard limits, the script finds that out and uses runc with explicit --ulimit
# values (deploy/podman-opts.sh finds them; smoke-test.sh uses it too).
set -euo pipefail

HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "$HERE/.." && pwd)"
TAG="localhost/kernel:latest"
REF="HEAD"
SUITE="bookworm"
REBUILD_BASE=0
ONLINE=0
SMOKE=1
PYTHON="${PYTHON:-python3}"
MIRROR="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"

while [ $# -gt 0 ]; do
    case "$1" in
        --tag) TAG="$2"; shift 2 ;;
        --ref) REF="$2"; shift 2 ;;
        --suite) SUITE="$2"; shift 2 ;;
        --rebuild-base) REBUILD_BASE=1; shift ;;
        --online) ONLINE=1; shift ;;
        --no-smoke) SMOKE=0; shift ;;
        -h|--help) sed -n '2,21p' "$0"; exit 0 ;;
        *) echo "unknown argument: $1" >&2; exit 2 ;;
    esac
done

BASE_IMAGE="localhost/kernel-base:$SUITE"
say() { printf '\n== %s\n' "$*"; }
[ "$(id -u)" = 0 ] || { echo "build-image.sh needs root (debootstrap, rootful podman)" >&2; exit 1; }

# ---- 1. tools ------------------------------------------------------------------------------------
missing=()
for t in podman:podman buildah:buildah debootstrap:debootstrap runc:runc; do
    command -v "${t%%:*}" > /dev/null || missing+=("${t#*:}")
done
if [ ${#missing[@]} -gt 0 ]; then
    say "apt-get install ${missing[*]}"
    apt-get update -q
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${missing[@]}"
fi
podman --version

# ---- 2. base image from debootstrap ----------------------------------------------------------------
if [ "$REBUILD_BASE" = 1 ] || ! podman image exists "$BASE_IMAGE"; then
    say "debootstrap $SUITE -> $BASE_IMAGE"
    rootfs="$(mktemp -d /tmp/kernel-rootfs.XXXXXX)"
    trap 'rm -rf "$rootfs"' EXIT
    debootstrap --variant=minbase --include=python3,python3-venv,tini,ca-certificates \
        "$SUITE" "$rootfs" "$MIRROR" > /tmp/kernel-debootstrap.log 2>&1 \
        || { tail -20 /tmp/kernel-debootstrap.log; exit 1; }
    # slim: no package caches, lists, docs or man pages in the base
    rm -rf "$rootfs"/var/cache/apt/archives/*.deb "$rootfs"/var/lib/apt/lists/* \
        "$rootfs"/usr/share/doc/* "$rootfs"/usr/share/man/* "$rootfs"/usr/share/info/* \
        "$rootfs"/var/log/*.log "$rootfs"/var/cache/debconf/*-old
    py="$(chroot "$rootfs" python3 -c 'import sys; print("%d.%d" % sys.version_info[:2])')"
    glibc="$(chroot "$rootfs" dpkg-query -W -f='${Version}' libc6 | sed -E 's/^([0-9]+\.[0-9]+).*/\1/')"
    tar -C "$rootfs" --numeric-owner -c . | podman import \
        --change 'CMD ["/bin/bash"]' \
        --change "LABEL org.opencontainers.image.description=\"Debian $SUITE minbase + python3 $py (debootstrap)\"" \
        --change "LABEL kernel.base.python=$py" --change "LABEL kernel.base.glibc=$glibc" \
        --message "debootstrap --variant=minbase $SUITE $MIRROR" - "$BASE_IMAGE"
    rm -rf "$rootfs"; trap - EXIT
fi
label() { podman image inspect --format "{{index .Labels \"$1\"}}" "$BASE_IMAGE"; }
PYVER="$(label kernel.base.python)"
GLIBC="$(label kernel.base.glibc)"
echo "base $BASE_IMAGE: python $PYVER, glibc $GLIBC, $(podman image inspect --format '{{.Size}}' "$BASE_IMAGE") bytes"

# ---- 3. can this machine run containers, and with which options? -------------------------------------
eval "$("$HERE/podman-opts.sh" "$BASE_IMAGE")"   # sets GLOBAL_OPTS, RUN_OPTS, CAN_RUN
echo "podman options: global ${GLOBAL_OPTS[*]:-(none)}; run ${RUN_OPTS[*]:-(none)}; can run containers: $CAN_RUN"

# ---- 4. build context: committed source + deploy/ + wheels ------------------------------------------
ctx="$(mktemp -d /tmp/kernel-context.XXXXXX)"
[ "${KEEP_CONTEXT:-0}" = 1 ] || trap 'rm -rf "$ctx"' EXIT
say "context $ctx: git archive $REF ($(git -C "$REPO" rev-parse --short "$REF")) + deploy/ from the working tree"
git -C "$REPO" archive "$REF" | tar -x -C "$ctx"
rm -rf "$ctx/deploy"
mkdir -p "$ctx/deploy"
(cd "$HERE" && tar -c --exclude=./helm --exclude=./kserve . ) | tar -x -C "$ctx/deploy"

BUILD_ARGS=(--build-arg "BASE=$BASE_IMAGE")
NETWORK=(--network=none)
if [ "$ONLINE" = 1 ]; then
    NETWORK=()
else
    say "wheels for cp${PYVER/./} / glibc $GLIBC into .wheels/"
    arch="$(uname -m)"
    platforms=()
    for minor in $(seq 17 "${GLIBC#*.}"); do platforms+=(--platform "manylinux_2_${minor}_${arch}"); done
    platforms+=(--platform "manylinux2014_${arch}")
    [ "$arch" = x86_64 ] && platforms+=(--platform manylinux2010_x86_64 --platform manylinux1_x86_64)
    # the install's requirements: Kernel's dependencies, the `openai` extra the image installs
    # (jinja2, for chat templates) and its build system (pyproject.toml)
    "$PYTHON" - "$ctx/pyproject.toml" > "$ctx/.requirements.txt" <<'EOF'
import sys, tomllib
d = tomllib.load(open(sys.argv[1], "rb"))
print("\n".join(d["build-system"]["requires"] + d["project"]["dependencies"]
                + d["project"]["optional-dependencies"]["openai"]))
EOF
    "$PYTHON" -m pip download --quiet --dest "$ctx/.wheels" --only-binary=:all: \
        --implementation cp --python-version "$PYVER" --abi "cp${PYVER/./}" "${platforms[@]}" \
        -r "$ctx/.requirements.txt" 2> >(grep -v "is ignored: it is neither a file nor a directory" >&2)
    echo "$(ls "$ctx/.wheels" | wc -l) wheels, $(du -sh "$ctx/.wheels" | cut -f1)"
    BUILD_ARGS+=(--build-arg PIP_OFFLINE=1)
fi

# ---- 5. build ------------------------------------------------------------------------------------
say "podman build -t $TAG ${NETWORK[*]} ${BUILD_ARGS[*]}"
start=$(date +%s)
podman "${GLOBAL_OPTS[@]}" build --format docker --pull=never "${NETWORK[@]}" "${BUILD_ARGS[@]}" \
    --label "org.opencontainers.image.revision=$(git -C "$REPO" rev-parse "$REF")" \
    --label "org.opencontainers.image.source=kernel-inference-server" \
    -f "$ctx/deploy/Dockerfile" -t "$TAG" "$ctx"
echo "built $TAG in $(( $(date +%s) - start )) s: $(podman image inspect --format '{{.Size}}' "$TAG") bytes"
podman image inspect --format 'User={{.Config.User}} Entrypoint={{.Config.Entrypoint}} Cmd={{.Config.Cmd}} Healthcheck={{.Config.Healthcheck.Test}}' "$TAG"

# ---- 6. smoke test -------------------------------------------------------------------------------
if [ "$SMOKE" = 1 ]; then
    say "deploy/smoke-test.sh $TAG"
    "$HERE/smoke-test.sh" "$TAG"
fi
