#!/usr/bin/env python3
"""Counts test targets in a `bazel test` log: prints "N passed, M failed".

Every target in Bazel's closing summary counts once: PASSED (cached or not) is a pass;
FAILED, FAILED TO BUILD, TIMEOUT, FLAKY, NO STATUS and INCOMPLETE are failures.
"""
import re
import sys

LINE = re.compile(r"^(//\S+)\s+(?:\(cached\)\s+)?(PASSED|FAILED TO BUILD|FAILED|TIMEOUT|FLAKY|NO STATUS|INCOMPLETE)\b")


def main(path: str) -> None:
    results = {}
    with open(path, errors="replace") as log:
        for line in log:
            match = LINE.match(line)
            if match:
                results[match.group(1)] = match.group(2)
    passed = sum(1 for r in results.values() if r == "PASSED")
    print(f"{passed} passed, {len(results) - passed} failed")


if __name__ == "__main__":
    main(sys.argv[1])
