#!/usr/bin/env python3
"""Our AdamW fp32 against torch's, same minutes: alternates optimizer_bench and torch_adamw.py.

Each round runs `optimizer_bench --cases=adamw` (1 and 2 threads) and then torch_adamw.py (1 and
2 threads), in that order, so the two sides see the same machine load; every JSON line is
printed, then one summary line per thread count: the median over rounds of each side's GB/s and
their ratio (ours / torch). Build first: bazel build -c opt //tests/bench:optimizer_bench
  tests/bench/compare_torch_adamw.py --python=/opt/zs-torch/bin/python [--rounds=5] [--isa=avx2]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--params", type=int, default=64 << 20)
    parser.add_argument("--reps", type=int, default=5, help="repetitions inside each run")
    parser.add_argument("--isa", choices=["auto", "avx2", "avx512"], default="auto",
                        help="both sides' instruction set (torch: ATEN_CPU_CAPABILITY)")
    parser.add_argument("--python", default="/opt/zs-torch/bin/python",
                        help="the Python whose torch is timed")
    parser.add_argument("--bench",
                        default=os.path.join(REPO, ".bazel/bin/tests/bench/optimizer_bench"))
    return parser.parse_args()


def run_json_lines(command: list) -> list:
    result = subprocess.run(command, check=True, capture_output=True, text=True)
    sys.stderr.write(result.stderr)
    lines = [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]
    for line in lines:
        print(json.dumps(line, separators=(",", ":")), flush=True)
    return lines


def main() -> int:
    args = parse_args()
    ours_command = [args.bench, f"--params={args.params}", f"--reps={args.reps}", "--threads=2",
                    "--cases=adamw", f"--isa={args.isa}"]
    torch_command = [args.python, os.path.join(REPO, "tests/bench/torch_adamw.py"),
                     f"--params={args.params}", f"--reps={args.reps}", "--threads=1,2"]
    if args.isa != "auto":
        torch_command.append(f"--cpu_capability={args.isa}")
    ours, theirs = {}, {}
    for _ in range(args.rounds):
        for line in run_json_lines(ours_command):
            ours.setdefault(line["threads"], []).append(line)
        for line in run_json_lines(torch_command):
            theirs.setdefault(line["threads"], []).append(line)
    for threads in sorted(ours):
        ours_gbps = statistics.median(line["gbps"] for line in ours[threads])
        torch_gbps = statistics.median(line["gbps"] for line in theirs.get(threads, []))
        print(json.dumps({
            "bench": "adamw_vs_torch",
            "threads": threads,
            "rounds": args.rounds,
            "params": args.params,
            "isa": ours[threads][0]["isa"],
            "torch_isa": theirs[threads][0]["isa"],
            "torch_version": theirs[threads][0]["torch_version"],
            "torch_impl": theirs[threads][0]["impl"],
            "ours_gbps": ours_gbps,
            "torch_gbps": torch_gbps,
            "ratio": round(ours_gbps / torch_gbps, 3),
            "ours_gbps_all": [line["gbps"] for line in ours[threads]],
            "torch_gbps_all": [line["gbps"] for line in theirs[threads]],
        }, separators=(",", ":")), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
