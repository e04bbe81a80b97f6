#!/usr/bin/env python3
"""The DDP vs ZeRO demo: runs the document's job on a running ZeroShard cluster and compares.

Runs one job per (optimizer, mode) -- by default SGD lr 0.01 (the document's) and AdamW
(docs/workloads.md's recommended demo config), each in `ddp`, `zero2` and `zero3` mode -- through
the `zeroshard` CLI, then prints side-by-side tables: loss at the first and last step, the largest
|parameter difference| from ddp of each other mode of the same optimizer (each job's final state
through `zeroshard export`; 0 expected, docs/design.md "Bitwise"; a failed export is an
error), the optimizer-state bytes per worker the engine measured against the ZeRO formula, the
median iteration time (forward + backward + step) and engine step time, every memory category
the worker counts (the engine's, the communicator's staging, the workload's buffers) and each
worker's peak RSS (read from /proc for local workers: each resets its peak when a run starts).

Parameter groups follow torch's default (torch.optim.AdamW(model.parameters())): one group, so
every tensor, biases included, takes the optimizer's weight decay; --no_decay PATTERNS moves
tensors into a group without weight decay. The header says which.

Usually started by tools/demo.sh inside deploy/local/cluster.py, which sets
ZEROSHARD_COORDINATOR, ZEROSHARD_CLI, ZEROSHARD_LOG_DIR, ZEROSHARD_WORKERS and
ZEROSHARD_WORKER_PIDS.
Standard library only (NumPy is used for the parameter comparison when it is installed).
"""

import argparse
import array
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO_ROOT, "tests", "bench"))
sys.path.insert(0, os.path.join(REPO_ROOT, "tools"))
import e2e_vs_torch  # noqa: E402  (vmhwm_bytes: a process's peak RSS; standard library only)
import safetensors_file  # noqa: E402  (reads the exported files; standard library only)
# sharding/model_catalog.cc's presets (layer sizes of the MLP).
PRESET_LAYERS = {
    "seed": [10, 64, 10],
    "small": [512, 1024, 512],
    "medium": [1024, 4096, 4096, 1024],
    "large": [8192, 12288, 12288, 8192],
    "deep": [1024] + [2048] * 17 + [1024],
}
# Steps by preset when --steps is not given: the document's 80 for seed, fewer for big models
# (each step of `medium` moves ~100 MB per worker on two shared cores).
DEFAULT_STEPS = {"seed": 80, "small": 20, "medium": 4, "large": 2, "deep": 3}
LR = {"sgd": 0.01, "adamw": 0.01, "adam": 0.01, "lion": 0.001, "adagrad": 0.01}


class DemoError(Exception):
    """An expected failure, printed as one line."""


def say(message=""):
    print(message, flush=True)


def parameter_count(layers):
    return sum(layers[i] * layers[i + 1] + layers[i + 1] for i in range(len(layers) - 1))


def format_bytes(n):
    if n is None:
        return "-"
    if n < 1024 * 1024:
        return f"{n:,} B"
    return f"{n / (1024 * 1024):,.1f} MiB"


def parse_args():
    parser = argparse.ArgumentParser(
        description="Runs the document's job in ddp, zero2 and zero3 mode and compares them."
    )
    parser.add_argument("--coordinator", default=os.environ.get("ZEROSHARD_COORDINATOR"))
    parser.add_argument(
        "--cli",
        default=os.environ.get("ZEROSHARD_CLI", os.path.join(REPO_ROOT, ".bazel/bin/client/zeroshard")),
        help="the zeroshard CLI (default: $ZEROSHARD_CLI, set by cluster.py)",
    )
    parser.add_argument(
        "--export_dir",
        default=os.environ.get("ZEROSHARD_LOG_DIR"),
        help="where each job's final state is exported to (<job_id>.safetensors) for the ddp/zero2 "
             "comparison (default: $ZEROSHARD_LOG_DIR, set by cluster.py, else a new temporary "
             "directory)",
    )
    parser.add_argument("--workers", type=int, default=int(os.environ.get("ZEROSHARD_WORKERS", "4")))
    parser.add_argument("--preset", default="seed", choices=sorted(PRESET_LAYERS))
    parser.add_argument("--steps", type=int, default=None, help="default: 80 for seed, fewer for big presets")
    parser.add_argument("--global_batch", type=int, default=128)
    parser.add_argument("--dataset_size", type=int, default=1024)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--optimizers", default="sgd,adamw", help="comma-separated")
    parser.add_argument("--modes", default="ddp,zero2,zero3",
                        help="comma-separated ddp, zero1, zero2, zero3; the first is the reference")
    parser.add_argument("--sgd_lr", type=float, default=LR["sgd"], help="the document's 0.01")
    parser.add_argument(
        "--adamw_lr", type=float, default=LR["adamw"],
        help="docs/workloads.md's recommended demo config (0.01)",
    )
    parser.add_argument(
        "--no_decay", default=None, metavar="PATTERNS",
        help="comma-separated tensor-name patterns (e.g. '*.bias') without weight decay "
             "(default: none, torch's default: every tensor decays)",
    )
    parser.add_argument("--job_timeout", type=float, default=600.0, help="seconds per job")
    parser.add_argument(
        "--worker_pids", default=os.environ.get("ZEROSHARD_WORKER_PIDS", ""),
        help="comma-separated process ids of local workers, whose peak RSS the memory table "
             "shows (default: ZEROSHARD_WORKER_PIDS; without it, rank 0's reported peak)",
    )
    args = parser.parse_args()
    try:
        args.worker_pids = [int(p) for p in args.worker_pids.split(",") if p.strip()]
    except ValueError:
        parser.error(f"--worker_pids: not a list of process ids: {args.worker_pids!r}")
    if not args.coordinator:
        parser.error("--coordinator (or ZEROSHARD_COORDINATOR) is required; "
                     "run me through deploy/local/cluster.py or tools/demo.sh")
    if not args.export_dir:
        args.export_dir = tempfile.mkdtemp(prefix="zeroshard-demo-export-")
    if args.steps is None:
        args.steps = DEFAULT_STEPS[args.preset]
    args.optimizers = [o.strip() for o in args.optimizers.split(",") if o.strip()]
    args.modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    for optimizer in args.optimizers:
        if optimizer not in LR:
            parser.error(f"--optimizers: unknown optimizer '{optimizer}' (known: {', '.join(LR)})")
    if args.workers < 1 or args.global_batch % args.workers != 0:
        parser.error("--global_batch must be a multiple of --workers")
    return args


class Run:
    """One job: its spec, its id, and what its events said."""

    def __init__(self, optimizer, mode, lr):
        self.optimizer = optimizer
        self.mode = mode
        self.lr = lr
        self.job_id = None
        self.state = None
        self.message = ""
        self.losses = []
        self.step_ms = []
        self.iteration_ms = []
        self.memory = {}
        self.peak_rss = []  # bytes per worker (VmHWM since the run started), or rank 0's alone
        self.weight_decay = None
        self.param_groups = []
        self.generations = 0
        self.params_path = None
        self.seconds = 0.0
        # The ZeRO formula's bytes per rank, as the coordinator serves them with the plan
        # (ShardPlan.model_state_formula, JSON field names).
        self.formula = {}


def cli(args, *command, check=True):
    argv = [args.cli, f"--coordinator={args.coordinator}", *command]
    try:
        result = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    except FileNotFoundError:
        raise DemoError(f"{args.cli} not found; build it with: bazel build -c opt //client:zeroshard") from None
    if check and result.returncode != 0:
        raise DemoError(f"{' '.join(command[:1])}: {result.stderr.strip() or 'exit ' + str(result.returncode)}")
    return result


def groups_text(weight_decay, param_groups):
    """The job's parameter groups as the service stored them, in words."""
    if weight_decay is None:
        return "weight decay: not reported"
    default = f"weight decay {weight_decay:g}"
    if not param_groups:
        return f"{default} on every tensor (one parameter group, torch's default)"
    parts = []
    for group in param_groups:
        decay = group.get("weight_decay", weight_decay)
        text = f"{', '.join(group.get('patterns', []))}: weight decay {float(decay):g}"
        if "lr_scale" in group:
            text += f", lr ×{float(group['lr_scale']):g}"
        parts.append(text)
    return f"{'; '.join(parts)}; every other tensor: {default}"


def run_job(args, run):
    name = f"demo-{args.preset}-{run.optimizer}-{run.mode}"
    command = [
        "submit", f"--name={name}", f"--preset={args.preset}",
        f"--optimizer={run.optimizer}", f"--lr={run.lr}", f"--mode={run.mode}",
        f"--workers={args.workers}", f"--steps={args.steps}",
        f"--global_batch={args.global_batch}", f"--dataset_size={args.dataset_size}",
        f"--seed={args.seed}", "--output=json",
    ]
    if args.no_decay:
        command.append(f"--no_decay={args.no_decay}")
    submitted = cli(args, *command)
    try:
        job = json.loads(submitted.stdout)
    except json.JSONDecodeError:
        raise DemoError(f"submit printed no job: {submitted.stdout.strip()[:200]!r}") from None
    run.job_id = job.get("id")
    if not run.job_id:
        raise DemoError("submit printed no job id")
    spec = job.get("spec", {})
    run.weight_decay = float(spec.get("optimizer", {}).get("weight_decay", 0.0))
    run.param_groups = spec.get("param_groups", [])
    say(f"  submitted {run.job_id} ({name}): {groups_text(run.weight_decay, run.param_groups)}")
    started = time.monotonic()
    watch = subprocess.Popen(
        [args.cli, f"--coordinator={args.coordinator}", "watch", run.job_id, "--output=json"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    timed_out = threading.Event()

    def on_timeout():
        timed_out.set()
        watch.kill()

    timer = threading.Timer(args.job_timeout, on_timeout)
    timer.start()
    report_every = max(1, args.steps // 8)
    try:
        for line in watch.stdout:
            line = line.strip()
            if not line:
                continue
            try:
                event = json.loads(line)
            except json.JSONDecodeError:
                continue
            kind = event.get("type")
            if kind == "GENERATION_STARTED":
                run.generations += 1
                if run.generations > 1:
                    say(f"  generation {event.get('generation')} started (restart from step 0)")
                    run.losses, run.step_ms, run.iteration_ms = [], [], []
            elif kind == "STATE_CHANGED":
                run.state = event.get("state")
                run.message = event.get("message", "")
            elif kind == "PROGRESS":
                progress = event.get("progress", {})
                step = int(progress.get("step", 0))
                run.losses.append(float(progress.get("loss", 0.0)))
                run.step_ms.append(float(progress.get("step_ms", 0.0)))
                run.iteration_ms.append(float(progress.get("iteration_ms", 0.0)))
                run.memory = {k: int(v) for k, v in progress.get("memory", {}).items()}
                run.peak_rss = [int(progress.get("vmhwm_bytes", 0))]
                if step == 1 or step % report_every == 0 or step == args.steps:
                    say(f"    step {step:>4}/{args.steps}  loss {run.losses[-1]:.6g}  "
                        f"iteration {run.iteration_ms[-1]:.1f} ms (engine step "
                        f"{run.step_ms[-1]:.1f} ms)")
        watch.wait()
    finally:
        timer.cancel()
    run.seconds = time.monotonic() - started
    if timed_out.is_set():
        cli(args, "cancel", run.job_id, "--reason=demo timeout", check=False)
        raise DemoError(f"{run.job_id} did not finish within {args.job_timeout:g}s (cancelled it)")
    if watch.returncode != 0 or run.state != "SUCCEEDED":
        stderr = watch.stderr.read().strip()
        raise DemoError(
            f"{run.job_id} ended {run.state or 'without a final state'}"
            f"{': ' + run.message if run.message else ''}{' (' + stderr + ')' if stderr else ''}"
        )
    say(f"  {run.job_id} SUCCEEDED in {run.seconds:.1f}s")
    # Each worker resets its peak RSS when a run starts, so right after the job it is the job's.
    peaks = [e2e_vs_torch.vmhwm_bytes(pid) for pid in args.worker_pids]
    if peaks and all(p is not None for p in peaks):
        run.peak_rss = peaks
    # Every rank commits the final checkpoint before it reports its last step, so the final state
    # exports once the job succeeded.
    plan = cli(args, "plan", run.job_id, "--output=json")
    run.formula = json.loads(plan.stdout).get("model_state_formula", {})
    path = os.path.join(args.export_dir, f"{run.job_id}.safetensors")
    exported = cli(args, "export", run.job_id, f"--output={path}", check=False)
    if exported.returncode != 0:
        raise DemoError(f"{run.job_id} succeeded but its final state does not export: "
                        f"{exported.stderr.strip()}")
    run.params_path = path


def read_params(path):
    """An exported file's tensors: {name: fp32 values}, NumPy arrays when NumPy is installed."""
    try:
        tensors, _ = safetensors_file.read_safetensors(path)
    except (OSError, ValueError) as e:
        raise DemoError(f"{path}: {e}") from None
    params = {}
    for name, tensor in tensors.items():
        if tensor.dtype != "F32":
            raise DemoError(f"{path}: {name} is {tensor.dtype}, not F32")
        try:
            import numpy
            params[name] = numpy.frombuffer(tensor.data, dtype="<f4")
        except ImportError:
            values = array.array("f")
            values.frombytes(tensor.data)
            if sys.byteorder != "little":
                values.byteswap()
            params[name] = values
    return params


def max_abs_diff(path_a, path_b):
    a, b = read_params(path_a), read_params(path_b)
    if sorted(a) != sorted(b) or any(len(a[name]) != len(b[name]) for name in a):
        raise DemoError(f"{path_a} and {path_b} hold different tensors")
    diff = 0.0
    for name in a:
        try:
            import numpy
            if len(a[name]):
                delta = numpy.abs(a[name].astype(numpy.float64) - b[name].astype(numpy.float64))
                diff = max(diff, float(numpy.max(delta)))
        except ImportError:
            diff = max(diff, max((abs(x - y) for x, y in zip(a[name], b[name])), default=0.0))
    return diff


def print_rows(headers, rows):
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(headers)]
    line = "  ".join(h.ljust(w) for h, w in zip(headers, widths)).rstrip()
    say(line)
    say("-" * len(line))
    for row in rows:
        say("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip())


def print_table(args, runs):
    headers = ["optimizer", "mode", "loss start", "loss end", "max|Δparam|",
               "opt state/worker", "ZeRO formula", "median iteration", "median step"]
    rows = []
    for run in runs:
        reference = next(r for r in runs if r.optimizer == run.optimizer)
        if run is reference:
            diff = "(reference)"
        else:
            diff = f"{max_abs_diff(reference.params_path, run.params_path):.3g}"
        arrays = int(run.formula.get("optimizer_state_copies", 0))
        formula = float(run.formula.get("optimizer_state_bytes", 0))
        formula_text = ("Ψ·%d·4" % arrays) if run.mode == "ddp" else ("Ψ·%d·4/%d" % (arrays, args.workers))
        rows.append([
            run.optimizer, run.mode,
            f"{run.losses[0]:.4g}" if run.losses else "-",
            f"{run.losses[-1]:.4g}" if run.losses else "-",
            diff,
            format_bytes(run.memory.get("optimizer_state_bytes", 0)),
            f"{format_bytes(int(round(formula)))} ({formula_text})",
            f"{statistics.median(run.iteration_ms):.2f} ms" if run.iteration_ms else "-",
            f"{statistics.median(run.step_ms):.2f} ms" if run.step_ms else "-",
        ])
    print_rows(headers, rows)


# StepMetrics.memory's categories (proto/zeroshard/v1/types.proto), in its order.
MEMORY_COLUMNS = [
    ("params", "params_bytes"),
    ("grads", "grads_bytes"),
    ("master", "master_bytes"),
    ("opt state", "optimizer_state_bytes"),
    ("buckets", "bucket_bytes"),
    ("comm scratch", "comm_scratch_bytes"),
    ("gather pool", "gather_pool_bytes"),
    ("comm staging", "comm_staging_bytes"),
    ("workload", "workload_bytes"),
    ("kernel tables", "kernel_tables_bytes"),
    ("total counted", "total_bytes"),
]


def print_memory_table(runs):
    headers = ["optimizer", "mode"] + [title for title, _ in MEMORY_COLUMNS] + ["peak RSS/worker"]
    rows = []
    for run in runs:
        peaks = " ".join(format_bytes(p) for p in run.peak_rss) if run.peak_rss else "-"
        rows.append([run.optimizer, run.mode] +
                    [format_bytes(run.memory.get(key, 0)) for _, key in MEMORY_COLUMNS] + [peaks])
    print_rows(headers, rows)


def main():
    args = parse_args()
    layers = PRESET_LAYERS[args.preset]
    psi = parameter_count(layers)
    lrs = {"sgd": args.sgd_lr, "adamw": args.adamw_lr}
    say(f"== ZeroShard demo: preset {args.preset} ({'→'.join(map(str, layers))}, Ψ = {psi:,} parameters), "
        f"{args.workers} workers, global batch {args.global_batch} "
        f"({args.global_batch // args.workers} per worker), {args.dataset_size:,} samples, "
        f"{args.steps} steps, coordinator {args.coordinator}")
    if args.no_decay:
        say(f"== Parameter groups: {args.no_decay} without weight decay, every other tensor takes the "
            "optimizer's (--no_decay)")
    else:
        say("== Parameter groups: torch's default, one group: every tensor, biases included, takes the "
            "optimizer's weight decay (--no_decay PATTERNS exempts tensors)")
    runs = []
    try:
        for optimizer in args.optimizers:
            for mode in args.modes:
                run = Run(optimizer, mode, lrs.get(optimizer, LR[optimizer]))
                say(f"== {optimizer} lr {run.lr:g}, mode {mode}")
                run_job(args, run)
                runs.append(run)
    except DemoError as e:
        say(f"demo: error: {e}")
        return 1
    except KeyboardInterrupt:
        say("demo: interrupted")
        return 130

    say()
    say(f"== Results ({args.workers} workers, preset {args.preset}, {args.steps} steps; "
        f"Ψ = {psi:,})")
    say("Memory is rank 0's, counted by the engine's allocator. Optimizer state is fp32: SGD "
        "without momentum keeps none, AdamW 2 arrays; the measured bytes include the shard plan's "
        "padding (tensors start at multiples of 64 elements, the flat space is padded to lcm(W, "
        "128)). The iteration is forward + backward + step; the step is Engine::Step after "
        "backward (the reductions still in flight, the update, issuing the all-gathers, which the "
        "next forward waits for layer by layer).")
    print_table(args, runs)
    say()
    say("Memory per worker by category (rank 0's report: the engine's allocator, the "
        "communicator's staging, the workload's buffers), and each worker's peak RSS during the "
        "job (VmHWM, the process's own ~21 MiB of code and libraries included):")
    print_memory_table(runs)
    say()
    status = 0
    for optimizer in args.optimizers:
        group = [r for r in runs if r.optimizer == optimizer]
        reference = group[0]
        for other in group[1:]:
            diff = max_abs_diff(reference.params_path, other.params_path)
            verdict = "bitwise equal" if diff == 0 else f"DIFFER (max |Δ| = {diff:.3g})"
            if diff != 0:
                status = 1
            say(f"{optimizer}: final parameters of {reference.mode} and {other.mode}: {verdict}")
            ddp_state = reference.memory.get("optimizer_state_bytes", 0)
            other_state = other.memory.get("optimizer_state_bytes", 0)
            if ddp_state > 0:
                say(f"{optimizer}: {other.mode} holds {other_state / ddp_state:.3f} of {reference.mode}'s "
                    f"optimizer state per worker (1/{args.workers} = {1 / args.workers:.3f}, plus padding)")
        if reference.losses:
            first, last = reference.losses[0], reference.losses[-1]
            change = f"×{first / last:.1f} lower" if 0 < last < first else "did not fall"
            say(f"{optimizer}: loss {first:.4g} → {last:.4g} over {args.steps} steps ({change})")
    return status


if __name__ == "__main__":
    try:
        sys.exit(main())
    except DemoError as e:  # from the comparison of the final parameters
        say(f"demo: error: {e}")
        sys.exit(1)
