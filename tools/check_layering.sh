#!/usr/bin/env bash
# The layering rule, checked with bazel query over non-test targets: the control plane
# (coordinator/, dashboard/, client/) never depends on the data plane (worker/, kernels/), nor the
# other way round. Shared libraries (common, numerics, jobspec, sharding, checkpoint, security,
# http, proto) may be used by both; the process wiring in apps/ sits above both; tests are exempt.
# Usage: tools/check_layering.sh            check the tree; exit 1 naming each offending path
#        tools/check_layering.sh --self_test  also show that a deliberate bad dependency fails
set -euo pipefail
cd "$(dirname "$0")/.."

CONTROL="//coordinator/... + //dashboard/... + //client/..."
DATA="//worker/... + //kernels/..."

# Non-test rules of a set: no tests, nothing testonly.
non_test() { echo "(kind(rule, $1) - tests($1) - attr(testonly, 1, $1))"; }

# Prints "from -> to" for one shortest path from `from_set`'s non-test rules into `to_set`; empty
# when there is none.
violations() {
  local from_set=$1 to_set=$2
  local hits
  hits=$(bazel query --keep_going --noshow_progress \
    "$(non_test "$from_set") intersect rdeps($(non_test "$from_set"), $to_set)" 2>/dev/null || true)
  for target in $hits; do
    local path
    path=$(bazel query --noshow_progress "somepath($target, $to_set)" 2>/dev/null | tr '\n' ' ')
    echo "  $target: $path"
  done
}

check() {
  local failed=0 found
  found=$(violations "$CONTROL" "$DATA")
  if [[ -n "$found" ]]; then
    echo "check_layering: the control plane depends on the data plane:"
    echo "$found"
    failed=1
  fi
  found=$(violations "$DATA" "$CONTROL")
  if [[ -n "$found" ]]; then
    echo "check_layering: the data plane depends on the control plane:"
    echo "$found"
    failed=1
  fi
  return $failed
}

if [[ "${1:-}" == "--self_test" ]]; then
  # A deliberate bad dependency in a scratch package of the control plane: the check must fail
  # and name it. The package is removed whatever happens.
  scratch=coordinator/layering_self_test
  trap 'rm -rf "$scratch"' EXIT
  mkdir -p "$scratch"
  cat >"$scratch/BUILD.bazel" <<'BUILD'
cc_library(
    name = "bad",
    deps = ["//worker/engine"],
)
BUILD
  if out=$(check); then
    echo "check_layering: the self test's bad dependency was not found"
    exit 1
  fi
  if ! grep -q "//coordinator/layering_self_test:bad" <<<"$out"; then
    echo "check_layering: the self test's failure does not name the bad target:"
    echo "$out"
    exit 1
  fi
  echo "check_layering: a deliberate bad dependency fails: $(grep -m1 layering_self_test <<<"$out")"
  # Private default visibility refuses it at build time too: //worker/engine lists its users.
  if built=$(bazel build --nobuild --noshow_progress //coordinator/layering_self_test:bad 2>&1); then
    echo "check_layering: the self test's bad dependency builds: visibility does not refuse it"
    exit 1
  fi
  if ! grep -q "is not visible from target '//coordinator/layering_self_test:bad'" <<<"$built"; then
    echo "check_layering: the self test's bad dependency failed to build for another reason:"
    echo "$built" | tail -5
    exit 1
  fi
  echo "check_layering: and visibility refuses to build it"
  rm -rf "$scratch"
  trap - EXIT
fi

check
echo "check_layering: the control plane and the data plane do not depend on each other"
