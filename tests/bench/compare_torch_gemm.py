#!/usr/bin/env python3
"""Our GEMMs against torch's, same minutes: alternates gemm_bench and torch_gemm.py.

Each round runs gemm_bench once per side of ours (`ours`: the environment as it is, as workers
inherit it; each --variant adds environment variables, e.g. OPENBLAS_CORETYPE=SkylakeX, or
LD_PRELOAD / LD_LIBRARY_PATH for another BLAS) and torch_gemm.py once per --python, all on the
calls `gemm_bench --list` prints; every other round runs them in the reverse order, so a load that
rises or falls during the run falls on every side alike. Every JSON line is printed with "side"
and "round" added, then per job and shape one "gemm_vs_torch" line (each side's median GFLOP/s
over the rounds, and ours / side), and per job one "gemm_iteration_vs_torch" line (the summed ms
of an iteration's GEMMs). Wall-time medians leave out a run whose process got less than
--min_cpu_per_wall of a core while timing (its "cpu_per_wall": other processes took the core;
"runs_used" says how many are left); the CPU-time medians ("gflops_cpu", "ms_cpu": the thread's
CPU time, which descheduling does not advance) use every run. Run it under the bench lock; build
first:
  bazel build -c opt //tests/bench:gemm_bench
  flock /tmp/zs/bench.lock tests/bench/compare_torch_gemm.py [--rounds=5] \\
      [--variant=skylakex:OPENBLAS_CORETYPE=SkylakeX] \\
      [--python=/opt/zs-torch/bin/python,/usr/bin/python3]
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--reps", type=int, default=15, help="timed passes inside each run")
    parser.add_argument("--jobs", default="medium:2,seed:4", help="gemm_bench --jobs")
    parser.add_argument("--python", default="/opt/zs-torch/bin/python,/usr/bin/python3",
                        help="comma-separated Pythons whose torch is timed (empty: none)")
    parser.add_argument("--variant", action="append", default=[],
                        help="NAME:VAR=VALUE[,VAR=VALUE...]: another gemm_bench side")
    parser.add_argument("--min_cpu_per_wall", type=float, default=0.95,
                        help="runs below this CPU time / wall time are left out of the medians")
    parser.add_argument("--bench", default=os.path.join(REPO, ".bazel/bin/tests/bench/gemm_bench"))
    return parser.parse_args()


def run_json_lines(command: list, env: dict, side: str, round_index: int) -> list:
    result = subprocess.run(command, check=True, capture_output=True, text=True, env=env)
    sys.stderr.write(result.stderr)
    lines = []
    for text in result.stdout.splitlines():
        if not text.startswith("{"):
            continue
        line = json.loads(text)
        line.update({"side": side, "round": round_index})
        print(json.dumps(line, separators=(",", ":")), flush=True)
        lines.append(line)
    return lines


def main() -> int:
    args = parse_args()
    bench_args = [f"--jobs={args.jobs}", f"--reps={args.reps}"]
    sides = [("ours", [args.bench] + bench_args, dict(os.environ))]
    for variant in args.variant:
        name, _, assignments = variant.partition(":")
        env = dict(os.environ)
        for assignment in filter(None, assignments.split(",")):
            key, _, value = assignment.partition("=")
            env[key] = value
        sides.append((name, [args.bench] + bench_args, env))

    listing = subprocess.run([args.bench, "--list", f"--jobs={args.jobs}"], check=True,
                             capture_output=True, text=True).stdout
    with tempfile.NamedTemporaryFile("w", suffix=".jsonl", delete=False) as shapes_file:
        shapes_file.write(listing)
    for python in filter(None, args.python.split(",")):
        sides.append((f"torch:{python}", [python, os.path.join(REPO, "tests/bench/torch_gemm.py"),
                                          f"--shapes={shapes_file.name}", f"--reps={args.reps}"],
                      dict(os.environ)))

    lines = []
    loads = []
    try:
        for round_index in range(args.rounds):
            loads.append(round(os.getloadavg()[0], 2))
            order = sides if round_index % 2 == 0 else list(reversed(sides))
            for side, command, env in order:
                lines += run_json_lines(command, env, side, round_index)
    finally:
        os.unlink(shapes_file.name)

    # A torch side is named by its version once it has run.
    label = {}
    for line in lines:
        if line["side"].startswith("torch:"):
            label[line["side"]] = f"torch {line['torch_version']}"
    for line in lines:
        line["side"] = label.get(line["side"], line["side"])
    side_names = list(dict.fromkeys(line["side"] for line in lines))
    # A run (side, round, job) counts when its process had the core to itself while timing.
    kept = {(line["side"], line["round"], line["job"]) for line in lines
            if line["bench"] == "gemm_iteration"
            and (line["cpu_per_wall"] or 0) >= args.min_cpu_per_wall}

    def medians(bench: str, key_fields: tuple, value: str, every_run: bool = False) -> dict:
        grouped = {}
        for line in lines:
            if line["bench"] == bench and (
                    every_run or (line["side"], line["round"], line["job"]) in kept):
                key = tuple(line[field] for field in key_fields)
                grouped.setdefault(key, {}).setdefault(line["side"], []).append(line[value])
        return {key: {side: statistics.median(values) for side, values in by_side.items()}
                for key, by_side in grouped.items()}

    libraries = {line["side"]: line["library"] for line in lines if line["bench"] == "gemm"}
    shapes = {(line["job"], line["shape"]): line for line in lines if line["bench"] == "gemm"}

    def ours_over(by_side: dict, ours_faster_when_larger: bool) -> dict:
        return {side: round(by_side["ours"] / by_side[side] if ours_faster_when_larger
                            else by_side[side] / by_side["ours"], 3)
                for side in side_names if side in by_side and side != "ours" and "ours" in by_side}

    def by_name(by_side: dict, digits: int) -> dict:
        return {side: round(by_side[side], digits) for side in side_names if side in by_side}

    # Keyed by every run's CPU medians, so a job with no run left for the wall medians still shows.
    wall_rates = medians("gemm", ("job", "shape"), "gflops")
    for key, cpu_rates in medians("gemm", ("job", "shape"), "gflops_cpu", every_run=True).items():
        shape, by_side = shapes[key], wall_rates.get(key, {})
        print(json.dumps({
            "bench": "gemm_vs_torch", "job": key[0], "shape": key[1], "kind": shape["kind"],
            "m": shape["m"], "n": shape["n"], "k": shape["k"], "rounds": args.rounds,
            "gflops": by_name(by_side, 2), "ours_over": ours_over(by_side, True),
            "gflops_cpu": by_name(cpu_rates, 2), "ours_over_cpu": ours_over(cpu_rates, True),
        }, separators=(",", ":")), flush=True)
    for field in ("ms_blocked_dw", "ms_whole_dw"):
        wall_ms = medians("gemm_iteration", ("job",), field)
        for key, cpu_ms in medians("gemm_iteration", ("job",), field + "_cpu",
                                   every_run=True).items():
            by_side = wall_ms.get(key, {})
            print(json.dumps({
                "bench": "gemm_iteration_vs_torch", "job": key[0], "sum": field,
                "ms": by_name(by_side, 4), "ours_over": ours_over(by_side, False),
                "ms_cpu": by_name(cpu_ms, 4), "ours_over_cpu": ours_over(cpu_ms, False),
                "runs_used": {side: sum(1 for run in kept if run[0] == side and run[2] == key[0])
                              for side in side_names},
                "library": {side: libraries.get(side) for side in side_names},
                "rounds": args.rounds, "load_average": loads,
            }, separators=(",", ":")), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
