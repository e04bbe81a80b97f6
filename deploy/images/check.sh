#!/usr/bin/env bash
# Runs a `seed` job to SUCCEEDED with the CPU image's own binaries: coordinator, two workers and
# the CLI from the image (podman when it can run containers here, else unshare + chroot).
# Usage: deploy/images/check.sh [DIR]   (DIR: where build.sh wrote the images; default
# deploy/images/out). Needs root. Everything it starts, mounts or writes is removed on exit.
set -euo pipefail

REPO_ROOT=$(cd "$(dirname "$0")/../.." && pwd)
OUT=${1:-$REPO_ROOT/deploy/images/out}
VERSION=$(tr -d '[:space:]' <"$REPO_ROOT/deploy/VERSION")
TARBALL=$OUT/zeroshard-$VERSION.tar
IMAGE_UID=65532
# podman load names a docker-archive's "zeroshard:V" after Docker Hub's library namespace.
PODMAN_IMAGE=docker.io/library/zeroshard:$VERSION

log() { echo "check.sh: $*" >&2; }
die() {
  log "FAILED: $*"
  exit 1
}

[[ "$(id -u)" == 0 ]] || die "needs root (chroot/unshare or rootful podman)"
[[ -f "$TARBALL" ]] || die "$TARBALL not found; build it with deploy/images/build.sh --cpu"
for tool in unshare chroot; do
  command -v "$tool" >/dev/null || die "$tool not found (apt-get install util-linux coreutils)"
done
# podman is tried first; without it the check still runs (unshare + chroot).
missing_tools=()
for tool in skopeo umoci podman; do
  command -v "$tool" >/dev/null || missing_tools+=("$tool")
done
if ((${#missing_tools[@]})); then
  log "installing ${missing_tools[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq || die "apt-get update failed; install ${missing_tools[*]} yourself"
  apt-get install -y -qq --no-install-recommends "${missing_tools[@]}" ||
    die "cannot install ${missing_tools[*]}: install them with apt-get install ${missing_tools[*]}"
fi

WORK=$(mktemp -d "${TMPDIR:-/tmp}/zeroshard-image-check.XXXXXX")
CONTAINER=zeroshard-image-check-$$
podman_loaded=0
runner_pid=""
cleanup() {
  local status=$?
  if [[ -n "$runner_pid" ]]; then
    # SIGKILL: unshare --fork ignores SIGTERM while it waits; dying, it SIGKILLs its child
    # (--kill-child), the PID namespace's init, which takes every process in it down.
    kill -KILL "$runner_pid" 2>/dev/null || true
    wait "$runner_pid" 2>/dev/null || true
  fi
  # Whatever still runs chrooted in the unpacked image (none should), by process id.
  local proc
  for proc in /proc/[0-9]*; do
    if [[ "$(readlink "$proc/root" 2>/dev/null)" == "$WORK/bundle/rootfs" ]]; then
      log "killing leftover process ${proc#/proc/}"
      kill -KILL "${proc#/proc/}" 2>/dev/null || true
    fi
  done
  if command -v podman >/dev/null; then
    podman rm -f "$CONTAINER" >/dev/null 2>&1 || true
    if ((podman_loaded)); then podman rmi "$PODMAN_IMAGE" >/dev/null 2>&1 || true; fi
  fi
  # The chroot run lives in its own PID and mount namespaces: its processes and mounts end with
  # it, so only files are left (rootfs files are owned by 65532 and root: rm as root).
  rm -rf "$WORK"
  if ((status == 0)); then log "PASSED"; else log "FAILED (status $status)"; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM HUP

# The script that runs inside the image, as the image's user, with the image's own bash, tools
# and binaries. It stops its children itself; the namespace/container ends whatever is left.
cat >"$WORK/inside.sh" <<'EOF'
set -euo pipefail
DEADLINE_S=120
say() { echo "inside: $*" >&2; }
W=$(mktemp -d /tmp/zeroshard-check.XXXXXX)
pids=()
stop() {
  local status=$?
  for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
  if ((status != 0)); then
    for f in "$W"/*.log; do say "--- $f"; tail -n 15 "$f" >&2 || true; done
  fi
}
trap stop EXIT
# Polls COMMAND until it succeeds or the deadline passes.
wait_for() {
  local what=$1 start=$SECONDS
  shift
  until "$@"; do
    ((SECONDS - start < DEADLINE_S)) || { say "timed out waiting for $what"; return 1; }
    sleep 0.2
  done
}

say "running as uid $(id -u) gid $(id -g), HOME=$HOME, cwd $(pwd)"
# The coordinator refuses a --checkpoint_root that does not exist.
mkdir -p "$W/checkpoints"
/usr/local/bin/zeroshard-coordinator --listen=127.0.0.1:0 --metrics_port=0 \
  --state_dir="$W/state" --port_file="$W/ports" --checkpoint_root="$W/checkpoints" \
  --heartbeat_period=1s >"$W/coordinator.log" 2>&1 &
pids+=($!)
ports_written() { [[ -s "$W/ports" ]] && read -r grpc_port _ <"$W/ports" && ((grpc_port > 0)); }
wait_for "the coordinator's port file" ports_written
read -r grpc_port metrics_port <"$W/ports"
address=127.0.0.1:$grpc_port
say "coordinator serving at $address (metrics port $metrics_port)"
for i in 0 1; do
  /usr/local/bin/zeroshard-worker --coordinator="$address" --device=cpu --name="worker-$i" \
    --checkpoint_root="$W/checkpoints" >"$W/worker-$i.log" 2>&1 &
  pids+=($!)
done
Z=(/usr/local/bin/zeroshard --coordinator="$address")
two_idle() {
  (("$("${Z[@]}" workers --state=idle 2>/dev/null | tail -n +2 | grep -c worker-)" == 2))
}
wait_for "two idle workers" two_idle
say "2 workers idle"
for pid in "${pids[@]}"; do
  uids=$(awk '/^Uid:/ { print $2, $3 }' "/proc/$pid/status")
  [[ "$uids" == "65532 65532" ]] || { say "process $pid runs as uid $uids"; exit 1; }
done
say "coordinator and workers run as uid 65532 (pids ${pids[*]} in this namespace)"
"${Z[@]}" submit --name=image-check --preset=seed --optimizer=adamw --lr=0.01 --mode=zero2 \
  --workers=2 --global_batch=64 --dataset_size=256 --steps=16 --watch >"$W/watch.log" 2>&1 ||
  { say "the job did not succeed"; cat "$W/watch.log" >&2; exit 1; }
job=$("${Z[@]}" jobs | awk '$0 ~ /image-check/ { print $1; exit }')
state=$("${Z[@]}" get "$job")
say "job: $state"
[[ "$state" == *SUCCEEDED* ]] || { say "job $job is not SUCCEEDED"; exit 1; }
imported=$(/usr/bin/python3 -c 'import zeroshard; print(zeroshard.__file__)')
say "python3: import zeroshard OK from $imported"
say "all checks passed"
EOF

log "unpacking $TARBALL (skopeo copy docker-archive -> oci, umoci unpack)"
skopeo copy --quiet "docker-archive:$TARBALL" "oci:$WORK/oci:check"
umoci unpack --image "$WORK/oci:check" "$WORK/bundle" >/dev/null
ROOTFS=$WORK/bundle/rootfs
config_user=$(python3 -c '
import json, sys
user = json.load(open(sys.argv[1]))["process"]["user"]
print(user["uid"], user["gid"])' "$WORK/bundle/config.json")
[[ "$config_user" == "$IMAGE_UID $IMAGE_UID" ]] ||
  die "the image's user is $config_user, not $IMAGE_UID"
log "the image's configured user: uid/gid $config_user"

podman_works() {
  command -v podman >/dev/null || return 1
  podman load --quiet -i "$TARBALL" >/dev/null 2>&1 || return 1
  podman_loaded=1
  podman run --rm --pull=never --network=none --entrypoint /usr/bin/id "$PODMAN_IMAGE" -u \
    >"$WORK/podman-probe.log" 2>&1
}

if podman_works; then
  log "runner: podman (rootful), image $PODMAN_IMAGE"
  podman run --rm --pull=never --name "$CONTAINER" --network=none \
    -v "$WORK/inside.sh:/check/inside.sh:ro" --entrypoint /bin/bash "$PODMAN_IMAGE" \
    /check/inside.sh &
  runner_pid=$!
else
  reason=$(tail -n 1 "$WORK/podman-probe.log" 2>/dev/null || echo "podman not installed")
  log "podman cannot run containers here ($reason)"
  log "runner: unshare (new PID, mount and network namespaces) + chroot into the unpacked rootfs," \
    "as uid $IMAGE_UID"
  install -m 0644 "$WORK/inside.sh" "$ROOTFS/tmp/zeroshard-inside.sh"
  # /proc of the new PID namespace and the host's /dev, mounted in the private mount namespace
  # only; the loopback interface of the new network namespace brought up.
  # shellcheck disable=SC2016  # the inner script expands its own $1
  unshare --fork --pid --mount --net --kill-child --propagation private -- /bin/bash -c '
    set -e
    rootfs=$1
    ip link set lo up
    mount -t proc proc "$rootfs/proc"
    mount --rbind /dev "$rootfs/dev"
    # Not exec: this root shell stays the namespace init, whose parent-death signal
    # (--kill-child) a change of user would clear.
    chroot --userspec=65532:65532 "$rootfs" /usr/bin/env -i HOME=/var/lib/zeroshard \
      PATH=/usr/local/bin:/usr/bin:/bin \
      /bin/bash -c "cd /var/lib/zeroshard && exec /bin/bash /tmp/zeroshard-inside.sh"
  ' check-ns "$ROOTFS" &
  runner_pid=$!
fi
# In the background so that a signal to this script runs the cleanup at once.
wait "$runner_pid"
runner_pid=""
