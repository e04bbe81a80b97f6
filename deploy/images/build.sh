#!/usr/bin/env bash
# Builds the zeroshard (CPU) and zeroshard-cuda container images offline: Bazel binaries on an
# mmdebstrap Debian bookworm root filesystem, packed with umoci, saved as docker-archive tarballs.
# Usage: deploy/images/build.sh [--cpu] [--cuda] [--out DIR]   (default: both images, DIR
# deploy/images/out). What goes in is listed in deploy/images/image.txt (see README.md there).
set -euo pipefail

REPO_ROOT=$(cd "$(dirname "$0")/../.." && pwd)
IMAGES_DIR=$REPO_ROOT/deploy/images
MANIFEST=$IMAGES_DIR/image.txt
# The Debian sources this machine's apt uses (a mirror or snapshot), so that the image's
# packages are the versions the binaries were built and ldd-checked against.
DEBIAN_SOURCES=${ZEROSHARD_DEBIAN_SOURCES:-/etc/apt/sources.list.d/debian.sources}
SUITE=bookworm
PATH_IN_IMAGE=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin

log() { echo "build.sh: $*" >&2; }
die() {
  log "error: $*"
  exit 1
}

usage() {
  echo "usage: $0 [--cpu] [--cuda] [--out DIR]   (default: both images into deploy/images/out)" >&2
  exit 2
}

build_cpu=0
build_cuda=0
OUT=$IMAGES_DIR/out
while (($#)); do
  case "$1" in
    --cpu) build_cpu=1 ;;
    --cuda) build_cuda=1 ;;
    --out)
      (($# >= 2)) || usage
      OUT=$2
      shift
      ;;
    --out=*) OUT=${1#--out=} ;;
    -h | --help) usage ;;
    *) usage ;;
  esac
  shift
done
if ((build_cpu == 0 && build_cuda == 0)); then
  build_cpu=1
  build_cuda=1
fi
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)

# --- the manifest -------------------------------------------------------------------------------

# Prints the fields after DIRECTIVE of every line that starts with it, one line each.
directive() {
  sed -e 's/#.*//' "$MANIFEST" | awk -v d="$1" '$1 == d { $1 = ""; sub(/^ /, ""); print }'
}

read -r USER_NAME USER_UID USER_GID USER_HOME < <(directive user)
mapfile -t HOME_DIRS < <(directive home_dir)
mapfile -t BINARIES < <(directive binary) # "LABEL PATH"
ENTRYPOINT=$(directive entrypoint)
read -r PYTHON_SOURCE PYTHON_DEST < <(directive python)
CUDA_LIB_DIR=$(directive cuda_lib_dir)
mapfile -t DRIVER_LIBS < <(directive driver_lib | tr ' ' '\n')
# Packages of one image: `all` plus its own.
image_packages() {
  directive package |
    awk -v image="$1" '$1 == "all" || $1 == image { for (i = 2; i <= NF; i++) print $i }' |
    sort -u
}
[[ -n "$USER_NAME" && -n "$ENTRYPOINT" && ${#BINARIES[@]} -gt 0 ]] || die "$MANIFEST is incomplete"

VERSION=$(tr -d '[:space:]' <"$REPO_ROOT/deploy/VERSION")
[[ -n "$VERSION" ]] || die "deploy/VERSION is empty"
REVISION=$(git -C "$REPO_ROOT" rev-parse HEAD)
if [[ -n "$(git -C "$REPO_ROOT" status --porcelain)" ]]; then REVISION+="-dirty"; fi
# The repository the image comes from: the origin remote when there is one.
SOURCE=${ZEROSHARD_IMAGE_SOURCE:-$(git -C "$REPO_ROOT" remote get-url origin 2>/dev/null ||
  echo unknown)}

# --- tools --------------------------------------------------------------------------------------

# tool -> Debian package
declare -A TOOL_PACKAGES=([mmdebstrap]=mmdebstrap [umoci]=umoci [skopeo]=skopeo)
missing_tools=()
for tool in "${!TOOL_PACKAGES[@]}"; do
  command -v "$tool" >/dev/null || missing_tools+=("${TOOL_PACKAGES[$tool]}")
done
if ((${#missing_tools[@]})); then
  if [[ "$(id -u)" == 0 ]]; then
    log "installing ${missing_tools[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${missing_tools[@]}"
  else
    die "missing tools; install them with: sudo apt-get install ${missing_tools[*]}"
  fi
fi
# The root filesystem holds files owned by the image user and device nodes: it needs root (or
# fakeroot, which umoci's rootless mode does not pair with here).
[[ "$(id -u)" == 0 ]] || die "building the root filesystem needs root (run with sudo)"
[[ -r "$DEBIAN_SOURCES" ]] || die "$DEBIAN_SOURCES not found (set ZEROSHARD_DEBIAN_SOURCES)"

WORK=$(mktemp -d "${TMPDIR:-/tmp}/zeroshard-images.XXXXXX")
cleanup() { rm -rf "$WORK"; }
trap cleanup EXIT

step_start=0
step() {
  step_start=$(date +%s)
  log "[$1] $2"
}
step_done() { log "[$1] done in $(($(date +%s) - step_start))s"; }

# --- one image ----------------------------------------------------------------------------------

# The Debian package that holds FILE (trying the merged-/usr spellings), or nothing.
package_of() {
  local candidate package
  for candidate in "$1" "$(readlink -f "$1")" "/usr$1" "${1#/usr}"; do
    package=$(dpkg -S "$candidate" 2>/dev/null | head -1 | cut -d: -f1) || true
    if [[ -n "$package" ]]; then
      echo "$package"
      return
    fi
  done
}

is_driver_lib() {
  local pattern
  for pattern in "${DRIVER_LIBS[@]}"; do
    # shellcheck disable=SC2053  # the pattern is a glob on purpose
    [[ "$1" == $pattern ]] && return 0
  done
  return 1
}

# build_image FLAVOR(cpu|cuda)
build_image() {
  local flavor=$1 name bazel_flags=(-c opt)
  if [[ "$flavor" == cuda ]]; then
    name=zeroshard-cuda
    bazel_flags=(--config=cuda -c opt)
  else
    name=zeroshard
  fi
  local tag=$VERSION
  local context=$OUT/context-$flavor
  local layout=$OUT/$name-oci
  local tarball=$OUT/$name-$VERSION.tar
  local labels=() entry
  for entry in "${BINARIES[@]}"; do labels+=("${entry%% *}"); done

  step "$name" "bazel build ${bazel_flags[*]} ${labels[*]}"
  (cd "$REPO_ROOT" && bazel build "${bazel_flags[@]}" "${labels[@]}")
  local bazel_bin
  bazel_bin=$(cd "$REPO_ROOT" && bazel info "${bazel_flags[@]}" bazel-bin 2>/dev/null)
  # The Docker build context (Dockerfile's COPY sources), also what goes into the root filesystem.
  # Copied now: -c opt and --config=cuda -c opt write the same bazel-bin paths.
  rm -rf "$context"
  mkdir -p "$context/bin" "$context/python"
  local label binary_path
  for entry in "${BINARIES[@]}"; do
    label=${entry%% *}
    binary_path=${label#//}
    binary_path=$bazel_bin/${binary_path/://}
    [[ -x "$binary_path" ]] || die "$label: $binary_path not found after the build"
    install -m 0755 "$binary_path" "$context/bin/$(basename "${entry##* }")"
  done
  cp -r "$REPO_ROOT/$PYTHON_SOURCE" "$context/python/"
  rm -rf "$context/python/zeroshard/_proto/zeroshard"
  find "$context/python" -name __pycache__ -prune -exec rm -rf {} +
  "$REPO_ROOT/python/generate_stubs.sh" "$context/python/zeroshard/_proto" >/dev/null
  step_done "$name"

  step "$name" "runtime libraries (ldd on this machine)"
  local libs=() lib package derived=() cuda_libs=() not_listed=()
  mapfile -t libs < <(for b in "$context"/bin/*; do ldd "$b"; done |
    awk '$2 == "=>" && $3 ~ /^\// { print $3 } $2 == "=>" && $3 == "not" { print "MISSING:" $1 }' |
    sort -u)
  for lib in "${libs[@]}"; do
    if [[ "$lib" == MISSING:* ]]; then
      die "${lib#MISSING:} is not found on this machine either (ldd)"
    elif [[ "$lib" == /usr/local/cuda* ]]; then
      [[ "$flavor" == cuda ]] || die "the CPU binaries link $lib"
      cuda_libs+=("$lib")
    else
      package=$(package_of "$lib")
      [[ -n "$package" ]] || die "$lib belongs to no Debian package"
      derived+=("$package")
    fi
  done
  mapfile -t derived < <(printf '%s\n' "${derived[@]}" | sort -u)
  local packages=()
  mapfile -t packages < <(image_packages "$flavor")
  for package in "${derived[@]}"; do
    printf '%s\n' "${packages[@]}" | grep -qxF "$package" || not_listed+=("$package")
  done
  ((${#not_listed[@]} == 0)) ||
    die "the binaries need ${not_listed[*]}: add them to $MANIFEST (and the Dockerfiles)"
  if [[ "$flavor" == cuda ]]; then
    mkdir -p "$context/cuda-lib"
    for lib in "${cuda_libs[@]}"; do
      is_driver_lib "$(basename "$lib")" &&
        die "$lib is a driver library; the image must not carry it"
      cp -L "$lib" "$context/cuda-lib/$(basename "$lib")"
    done
    log "CUDA libraries carried: ${cuda_libs[*]}"
  fi
  log "packages: ${packages[*]}"
  step_done "$name"

  step "$name" "mmdebstrap $SUITE (variant essential + ${#packages[@]} packages)"
  rm -rf "$layout"
  local bundle=$WORK/$name-bundle
  umoci init --layout "$layout"
  umoci new --image "$layout:$tag"
  umoci unpack --image "$layout:$tag" "$bundle"
  local rootfs=$bundle/rootfs
  local include
  include=$(
    IFS=,
    echo "${packages[*]}"
  )
  # shellcheck disable=SC2016  # the hook's $1 is mmdebstrap's (the root filesystem), not ours
  mmdebstrap --quiet --variant=essential --include="$include" \
    --dpkgopt='path-exclude=/usr/share/doc/*' --dpkgopt='path-include=/usr/share/doc/*/copyright' \
    --dpkgopt='path-exclude=/usr/share/man/*' --dpkgopt='path-exclude=/usr/share/locale/*' \
    --customize-hook='rm -rf "$1"/var/cache/apt/* "$1"/var/lib/apt/lists/*' \
    "$SUITE" "$rootfs" "$DEBIAN_SOURCES"
  step_done "$name"

  step "$name" "our files and the $USER_NAME user"
  for entry in "${BINARIES[@]}"; do
    install -D -m 0755 "$context/bin/$(basename "${entry##* }")" "$rootfs${entry##* }"
  done
  mkdir -p "$(dirname "$rootfs$PYTHON_DEST")"
  cp -r "$context/python/zeroshard" "$rootfs$PYTHON_DEST"
  chmod -R a+rX "$rootfs$PYTHON_DEST"
  if [[ "$flavor" == cuda ]]; then
    install -d "$rootfs$CUDA_LIB_DIR"
    cp "$context"/cuda-lib/* "$rootfs$CUDA_LIB_DIR/"
    echo "$CUDA_LIB_DIR" >"$rootfs/etc/ld.so.conf.d/zeroshard-cuda.conf"
    chroot "$rootfs" /sbin/ldconfig
  fi
  echo "$USER_NAME:x:$USER_GID:" >>"$rootfs/etc/group"
  echo "$USER_NAME:x:$USER_UID:$USER_GID:ZeroShard:$USER_HOME:/usr/sbin/nologin" \
    >>"$rootfs/etc/passwd"
  if [[ -f "$rootfs/etc/shadow" ]]; then echo "$USER_NAME:!:19000::::::" >>"$rootfs/etc/shadow"; fi
  install -d -m 0755 -o "$USER_UID" -g "$USER_GID" "$rootfs$USER_HOME"
  local dir
  for dir in "${HOME_DIRS[@]}"; do
    install -d -m 0755 -o "$USER_UID" -g "$USER_GID" "$rootfs$USER_HOME/$dir"
  done
  step_done "$name"

  step "$name" "ldd check inside the root filesystem"
  local binary output unresolved=() missing_here
  for entry in "${BINARIES[@]}"; do
    binary=${entry##* }
    output=$(chroot "$rootfs" /usr/bin/ldd "$binary" 2>&1) || true
    mapfile -t missing_here < <(awk '$2 == "=>" && $3 == "not" { print $1 }' <<<"$output")
    for lib in "${missing_here[@]}"; do
      if [[ "$flavor" == cuda ]] && is_driver_lib "$lib"; then continue; fi
      unresolved+=("$binary: $lib")
    done
    if ! grep -q '=>' <<<"$output"; then unresolved+=("$binary: ldd failed: $output"); fi
  done
  if ((${#unresolved[@]})); then
    printf 'build.sh: unresolved in the image: %s\n' "${unresolved[@]}" >&2
    die "$name: libraries missing from the root filesystem (above)"
  fi
  chroot --userspec="$USER_UID:$USER_GID" "$rootfs" /usr/bin/python3 -c 'import zeroshard' ||
    die "$name: python3 -c 'import zeroshard' fails in the image"
  if [[ "$flavor" == cuda ]]; then
    log "the CUDA image expects the NVIDIA container toolkit on the node to inject the driver" \
      "(${DRIVER_LIBS[*]}); every other library resolves inside the image"
  else
    log "every library of every binary resolves inside the image"
  fi
  step_done "$name"

  step "$name" "umoci repack + config, skopeo copy"
  umoci repack --image "$layout:$tag" "$bundle"
  local description="ZeroShard coordinator, worker, CLI and Python client ($flavor)"
  local config=(
    --config.user="$USER_UID:$USER_GID"
    --config.workingdir="$USER_HOME"
    --config.env="PATH=$PATH_IN_IMAGE"
    --config.env="HOME=$USER_HOME"
    --config.entrypoint="$ENTRYPOINT"
    --config.label="org.opencontainers.image.version=$VERSION"
    --config.label="org.opencontainers.image.revision=$REVISION"
    --config.label="org.opencontainers.image.title=$name"
    --config.label="org.opencontainers.image.source=$SOURCE"
    --config.label="org.opencontainers.image.description=$description"
    --author="ZeroShard deploy/images/build.sh"
  )
  if [[ "$flavor" == cuda ]]; then
    # What the NVIDIA container toolkit reads to inject the driver into the container.
    config+=(
      --config.env="NVIDIA_VISIBLE_DEVICES=all"
      --config.env="NVIDIA_DRIVER_CAPABILITIES=compute,utility"
    )
  fi
  umoci config --image "$layout:$tag" "${config[@]}"
  umoci gc --layout "$layout"
  rm -f "$tarball"
  skopeo copy --quiet "oci:$layout:$tag" "docker-archive:$tarball:$name:$VERSION"
  rm -rf "$bundle"
  step_done "$name"
  log "$name:$VERSION (revision $REVISION): $tarball ($(du -h "$tarball" | cut -f1))," \
    "OCI layout $layout"
}

if ((build_cpu)); then build_image cpu; fi
if ((build_cuda)); then build_image cuda; fi
