#!/usr/bin/env bash
# Builds the libFuzzer targets (--config=fuzz, clang + ASan + UBSan, own output base) and runs
# each for SECONDS (default 60) on a scratch copy of its seed corpus in tests/fuzz/corpus/.
# Fails when any target finds a crash, a leak, a timeout or a sanitizer report; the input that
# did it is kept and its path printed. Usage: tools/fuzz.sh [SECONDS] [TARGET...]
set -uo pipefail
cd "$(dirname "$0")/.."

seconds=${1:-60}
shift || true
targets=("$@")
if ((${#targets[@]} == 0)); then
  targets=(job_spec_text_fuzzer job_spec_validation_fuzzer request_validation_fuzzer strict_json_fuzzer)
fi

# Its own output base, so the fuzz build neither evicts nor waits on the normal one; no
# convenience symlinks, so .bazel/bin keeps pointing at the normal build.
bazel_fuzz=(bazel --output_base="$HOME/.cache/zeroshard-bazel-fuzz")
labels=("${targets[@]/#///tests/fuzz:}")
"${bazel_fuzz[@]}" build --config=fuzz --symlink_prefix=/ "${labels[@]}" 2>&1 |
  grep -v -E "^INFO: From |linux-sandbox"
if ((PIPESTATUS[0] != 0)); then
  echo "fuzz: build failed"
  exit 1
fi
bin=$("${bazel_fuzz[@]}" info --config=fuzz bazel-bin 2>/dev/null)

scratch=$(mktemp -d "${TMPDIR:-/tmp}/zeroshard-fuzz.XXXXXX")
failed=()
for target in "${targets[@]}"; do
  # libFuzzer adds what it finds to its first corpus directory: that is the scratch copy, never
  # the repository's seeds.
  corpus="$scratch/$target/corpus"
  artifacts="$scratch/$target/artifacts"
  mkdir -p "$corpus" "$artifacts"
  cp tests/fuzz/corpus/"$target"/* "$corpus"/
  echo "fuzz: $target for ${seconds}s from $(ls "$corpus" | wc -l) seeds"
  if "$bin/tests/fuzz/$target" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 \
    -print_final_stats=1 -artifact_prefix="$artifacts/" "$corpus" >"$scratch/$target/log" 2>&1; then
    grep -E "^(stat::number_of_executed_runs|stat::peak_rss_mb)|DONE" "$scratch/$target/log" |
      tr '\n' ' '
    echo
  else
    tail -n 60 "$scratch/$target/log"
    echo "fuzz: $target FAILED; input(s): $(ls -d "$artifacts"/* 2>/dev/null | tr '\n' ' ')"
    failed+=("$target")
  fi
done
if ((${#failed[@]})); then
  echo "fuzz: failed: ${failed[*]} (logs and inputs in $scratch)"
  exit 1
fi
rm -rf "$scratch"
echo "fuzz: ${#targets[@]} targets ran ${seconds}s each, nothing found"
