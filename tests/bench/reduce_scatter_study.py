#!/usr/bin/env python3
"""The reduce-scatter under backward, knob by knob (issue 11, item 2): one real job per variant of
the reduction's settings, the variants interleaved in rounds, on this machine.

    tests/bench/reduce_scatter_study.py --bin_dir="$(bazel info -c opt bazel-bin)"
    tests/bench/reduce_scatter_study.py --variants=baseline,bucket_1m,pool_3 --rounds=3

Not a test, and not run in CI (figures in docs/performance/reduce_scatter.md).
Every variant trains the same job (`--job`, default `medium` at W = 2, AdamW, 32 samples per rank,
the settings of tests/bench/e2e_vs_torch.py) on a fresh local cluster (deploy/local/cluster.py)
whose workers get the variant's flags, and with the variant's bucket size. Each round runs every
variant once, odd rounds in the reverse order; the medians pool the rounds.

Prints one JSON line per variant, medians over the measured iterations of rank 0's StepMetrics:
  {"bench":"reduce_scatter","job","mode","variant","worker_flags","bucket_elems","iter_ms",
   "compute_ms","step_ms","exposed_ms","exposed_in_backward_ms","bucket_exposed_ms",
   "bucket_exposed_in_backward_ms","comm_ms","update_ms","param_wait_ms","compute_thread_cpu_ms",
   "comm_thread_cpu_ms","process_cpu_ms","cpu_per_core_ms","peak_rss_bytes", ...}
bucket_exposed_ms is the per-bucket median (bucket 0 is reduced first); cpu_per_core_ms is
process_cpu_ms times the world size divided by the CPUs this process may use: at the iteration's
wall time (iter_ms) the cores were full. iter_vs_reference compares each variant with the first
one listed, round by round (each round's medians, then the median of the ratios); on a shared
machine that is the figure to quote.
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import e2e_vs_torch as e2e  # noqa: E402  (the jobs, the CLI's events, peak RSS)

# Each variant: the workers' flags and the job's bucket size (None: the spec's default). Flags
# not named keep the worker's defaults.
VARIANTS = {
    "baseline": ([], None),
    "bucket_1m": ([], 1 << 20),
    "bucket_2m": ([], 1 << 21),
    "bucket_4m": ([], 1 << 22),
    "bucket_8m": ([], 1 << 23),
    "pool_1": (["--bucket_pool_size=1"], None),
    "pool_2": (["--bucket_pool_size=2"], None),
    "pool_3": (["--bucket_pool_size=3"], None),
    "pool_4": (["--bucket_pool_size=4"], None),
    "segment_256k": ([f"--gloo_segment_bytes={256 << 10}"], None),
    "segment_1m": ([f"--gloo_segment_bytes={1 << 20}"], None),
    "segment_4m": ([f"--gloo_segment_bytes={4 << 20}"], None),
    "staging_2": (["--gloo_staging_segments=2"], None),
    "staging_8": (["--gloo_staging_segments=8"], None),
    "lanes_1": (["--gloo_lanes=1"], None),
    "lanes_2": (["--gloo_lanes=2"], None),
    "pin_training": (["--thread_pinning=training"], None),
    "pin_shared": (["--thread_pinning=shared"], None),
    "pin_spread": (["--thread_pinning=spread"], None),
    "comm_nice_-5": (["--comm_thread_nice=-5"], None),
    "comm_nice_5": (["--comm_thread_nice=5"], None),
    "comm_nice_10": (["--comm_thread_nice=10"], None),
}
DEFAULT_VARIANTS = [
    "baseline", "bucket_1m", "bucket_2m", "bucket_8m", "pool_3", "pool_4", "segment_256k",
    "segment_4m", "staging_2", "staging_8", "lanes_1", "pin_shared", "pin_spread",
    "comm_nice_-5", "comm_nice_5",
]


def say(message):
    print(f"reduce_scatter_study: {message}", file=sys.stderr, flush=True)


def parse_variant(text):
    """A catalogue name, or NAME=FLAG[+FLAG...][@BUCKET_ELEMS] for a combination, e.g.
    'best=--bucket_pool_size=3+--gloo_lanes=1@2097152'."""
    if text in VARIANTS:
        flags, bucket_elems = VARIANTS[text]
        return text, list(flags), bucket_elems
    if "=" not in text:
        raise ValueError(f"unknown variant '{text}' (known: {', '.join(VARIANTS)})")
    name, rest = text.split("=", 1)
    rest, _, bucket = rest.partition("@")
    flags = [f for f in rest.split("+") if f]
    return name, flags, int(bucket) if bucket else None


def median(values):
    values = [v for v in values if v is not None]
    return round(statistics.median(values), 3) if values else None


def client(argv):
    """Runs inside deploy/local/cluster.py: the variant's job, its measured steps' metrics and the
    workers' peak RSS as one JSON line appended to --results."""
    parser = argparse.ArgumentParser(prog="reduce_scatter_study.py client")
    parser.add_argument("--job", required=True)
    parser.add_argument("--mode", required=True)
    parser.add_argument("--variant", required=True)
    parser.add_argument("--bucket_elems", type=int, default=None)
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--warmup", type=int, required=True)
    parser.add_argument("--results", required=True)
    parser.add_argument("--job_timeout", type=float, required=True)
    args = parser.parse_args(argv)
    cli = os.environ["ZEROSHARD_CLI"]
    coordinator = f"--coordinator={os.environ['ZEROSHARD_COORDINATOR']}"
    pids = [int(p) for p in os.environ.get("ZEROSHARD_WORKER_PIDS", "").split(",") if p]
    world_size = e2e.JOBS[args.job]["world_size"]
    submit = [cli, coordinator, "submit", f"--name=rs-{args.job}-{args.mode}",
              f"--preset={args.job}", "--optimizer=adamw", f"--lr={e2e.LR}",
              f"--mode={args.mode}", f"--workers={world_size}",
              f"--steps={args.warmup + args.steps}",
              f"--global_batch={e2e.PER_RANK_BATCH * world_size}",
              f"--dataset_size={e2e.DATASET_SIZE}", f"--seed={e2e.SEED}", "--output=json"]
    if args.bucket_elems is not None:
        submit.append(f"--bucket_elems={args.bucket_elems}")
    submitted = subprocess.run(submit, capture_output=True, text=True, timeout=60)
    if submitted.returncode != 0:
        raise e2e.BenchError(f"{args.variant}: submit failed: {submitted.stderr.strip()}")
    job_id = json.loads(submitted.stdout)["id"]
    load = e2e.load_average()
    say(f"{args.job} {args.mode} {args.variant}: {job_id} (load average {load})")
    watched = subprocess.run([cli, coordinator, "watch", job_id, "--output=json"],
                             capture_output=True, text=True, timeout=args.job_timeout)
    progress, _, state, message = e2e.parse_watch_output(watched.stdout.splitlines())
    if watched.returncode != 0 or state != "SUCCEEDED":
        raise e2e.BenchError(f"{job_id} ended {state}: {message} {watched.stderr.strip()}")
    measured = [progress[s] for s in range(args.warmup + 1, args.warmup + args.steps + 1)
                if s in progress]
    if len(measured) != args.steps:
        raise e2e.BenchError(f"{job_id}: {len(measured)} of {args.steps} measured steps reported")
    peaks = [e2e.vmhwm_bytes(pid) for pid in pids]
    with open(args.results, "a") as f:
        f.write(json.dumps({"variant": args.variant, "measured": measured, "peaks": peaks,
                            "load_average": load}) + "\n")


def run_variant(args, name, flags, bucket_elems, log_dir):
    """One job of the variant on a fresh cluster: the client's record."""
    world_size = e2e.JOBS[args.job]["world_size"]
    results = os.path.join(log_dir, "results.jsonl")
    command = [sys.executable, e2e.CLUSTER_SCRIPT, f"--workers={world_size}",
               f"--bin_dir={args.bin_dir}", f"--log_dir={log_dir}", "--worker_threads=1"]
    command += [f"--worker_flag={flag}" for flag in flags]
    command += ["--", sys.executable, os.path.abspath(__file__), "client", f"--job={args.job}",
                f"--mode={args.mode}", f"--variant={name}", f"--steps={args.steps}",
                f"--warmup={args.warmup}", f"--results={results}",
                f"--job_timeout={args.job_timeout}"]
    if bucket_elems is not None:
        command.append(f"--bucket_elems={bucket_elems}")
    status = subprocess.run(command, stdin=subprocess.DEVNULL, stdout=sys.stderr).returncode
    # The cluster's workers write each job's final checkpoint there (300 MB for medium): a study
    # of a hundred jobs would fill the disk.
    shutil.rmtree(os.path.join(log_dir, "checkpoints"), ignore_errors=True)
    if status != 0:
        raise e2e.BenchError(f"{name}: the cluster run failed (status {status}; logs in "
                             f"{log_dir})")
    with open(results) as f:
        return [json.loads(line) for line in f if line.strip()][-1]


def round_median(run, key="iteration_ms"):
    return median([float(m.get(key, 0.0)) for m in run["measured"]])


def summarize(args, name, flags, bucket_elems, runs, reference_runs):
    """The variant's JSON line from its runs (one per round); `reference_runs` are the first
    variant's, round by round."""
    measured = [m for run in runs for m in run["measured"]]
    world_size = e2e.JOBS[args.job]["world_size"]
    cpus = len(os.sched_getaffinity(0))

    def field(key):
        return [float(m.get(key, 0.0)) for m in measured]

    def buckets(key):
        per_step = [[float(x) for x in m.get(key, [])] for m in measured]
        count = max((len(p) for p in per_step), default=0)
        return [median([p[b] for p in per_step if b < len(p)]) for b in range(count)]

    in_backward = [sum(float(x) for x in m.get("bucket_exposed_in_backward_ms", []))
                   for m in measured]
    peaks = [max(p for p in run["peaks"] if p is not None) for run in runs
             if any(p is not None for p in run["peaks"])]
    return {
        "bench": "reduce_scatter",
        "job": args.job,
        "world_size": world_size,
        "mode": args.mode,
        "variant": name,
        "worker_flags": flags,
        "bucket_elems": bucket_elems,
        "iter_ms": median(field("iteration_ms")),
        "compute_ms": median(field("compute_ms")),
        "step_ms": median(field("step_ms")),
        "exposed_ms": median(field("exposed_comm_ms")),
        "exposed_in_backward_ms": median(in_backward),
        "bucket_exposed_ms": buckets("bucket_exposed_ms"),
        "bucket_exposed_in_backward_ms": buckets("bucket_exposed_in_backward_ms"),
        "comm_ms": median(field("comm_ms")),
        "update_ms": median(field("update_ms")),
        "param_wait_ms": median(field("param_wait_ms")),
        "compute_thread_cpu_ms": median(field("compute_thread_cpu_ms")),
        "comm_thread_cpu_ms": median(field("comm_thread_cpu_ms")),
        "process_cpu_ms": median(field("process_cpu_ms")),
        "cpu_per_core_ms": median([float(m.get("process_cpu_ms", 0.0)) * world_size / cpus
                                   for m in measured]),
        "bucket_bytes": int(measured[-1].get("memory", {}).get("bucket_bytes", 0)),
        "peak_rss_bytes": max(peaks) if peaks else None,
        # Each round's median iteration over the reference's in the same round (run next to
        # it), then the median of those: the comparison that load changes between rounds spare.
        "iter_vs_reference": median([round_median(run) / round_median(ref)
                                     for run, ref in zip(runs, reference_runs)]),
        "iter_ms_per_round": [round_median(run) for run in runs],
        # The quietest round's median: what the variant does when the machine is least shared.
        "iter_ms_best_round": min(round_median(run) for run in runs),
        "steps": len(measured),
        "rounds": len(runs),
        "load_average": [run["load_average"] for run in runs],
    }


def parse_args(argv):
    parser = argparse.ArgumentParser(
        description="The reduction's knobs, one real job per variant, interleaved in rounds.")
    parser.add_argument("--job", default="medium", choices=sorted(e2e.JOBS))
    parser.add_argument("--mode", default="zero2", choices=["ddp", "zero1", "zero2"])
    parser.add_argument("--variants", default=",".join(DEFAULT_VARIANTS),
                        help="comma-separated catalogue names, or NAME=FLAG+FLAG@BUCKET_ELEMS "
                             f"(catalogue: {', '.join(VARIANTS)})")
    parser.add_argument("--steps", type=int, default=10, help="measured iterations per round")
    parser.add_argument("--warmup", type=int, default=3, help="iterations before measuring")
    parser.add_argument("--rounds", type=int, default=2, help="rounds of every variant")
    parser.add_argument("--bin_dir", default=None,
                        help="the -c opt bazel-bin holding the binaries (default: build them)")
    parser.add_argument("--log_dir", default=None, help="cluster logs (default: a new /tmp dir)")
    parser.add_argument("--job_timeout", type=float, default=600.0, help="seconds per job")
    args = parser.parse_args(argv)
    try:
        args.variants = [parse_variant(v.strip()) for v in args.variants.split(",") if v.strip()]
    except ValueError as e:
        parser.error(f"--variants: {e}")
    if args.steps < 1 or args.warmup < 1 or args.rounds < 1:
        parser.error("--steps, --warmup and --rounds: at least 1")
    return args


def main(argv):
    if argv[:1] == ["client"]:
        client(argv[1:])
        return 0
    args = parse_args(argv)
    args.bin_dir = args.bin_dir or e2e.build_binaries()
    log_root = args.log_dir or tempfile.mkdtemp(prefix="zs-rs-study-")
    runs = {}
    for number in range(args.rounds):
        order = args.variants if number % 2 == 0 else list(reversed(args.variants))
        for name, flags, bucket_elems in order:
            log_dir = os.path.join(log_root, f"round{number + 1}-{name}")
            say(f"round {number + 1}/{args.rounds}: {name} (load average {e2e.load_average()})")
            runs.setdefault(name, []).append(run_variant(args, name, flags, bucket_elems,
                                                         log_dir))
    reference = runs[args.variants[0][0]]
    for name, flags, bucket_elems in args.variants:
        e2e.emit(summarize(args, name, flags, bucket_elems, runs[name], reference))
    say(f"cluster logs in {log_root}")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except e2e.BenchError as e:
        say(f"error: {e}")
        sys.exit(1)
    except subprocess.TimeoutExpired as e:
        say(f"error: timed out: {e}")
        sys.exit(1)
