#!/usr/bin/env python3
"""End to end against PyTorch: the same MLP jobs trained by torch DDP, torch's
ZeroRedundancyOptimizer and ZeroShard's ddp, zero1 and zero2 (and zero3 when asked for), timed
on this machine in one run.

    tests/bench/e2e_vs_torch.py                      # seed (W = 4) and medium (W = 2), all variants
    tests/bench/e2e_vs_torch.py --jobs=medium --bin_dir="$(bazel info -c opt bazel-bin)"
    tests/bench/e2e_vs_torch.py --jobs=deep --variants=zeroshard_zero2,zeroshard_zero3 \
        --bin_dir="$(bazel info -c opt bazel-bin)"   # issue 38: zero3 / zero2 on deep, W = 2

Not a test, and not run in CI (figures and the venv in docs/performance/e2e_vs_torch.md). It uses
the newest torch it can import: it looks at its own interpreter, the tools
venv's (/opt/zs-torch/bin/python) and Debian's (/usr/bin/python3), re-runs itself under the one
with the newest torch, and says so on stderr and in `torch_version` when that is Debian's 1.13
(no fused AdamW on the CPU before torch 2.4).

Every side trains the same shapes (nn.Sequential(Linear, ReLU, ..., Linear) student and a frozen
teacher of the same shapes whose forward makes the targets, MSE loss), 32 samples per rank, one
thread per rank, AdamW (lr 1e-3, torch's defaults otherwise), over gloo / ZeroShard's Gloo
backend on loopback. Torch: W processes (torch.multiprocessing, a FileStore rendezvous), the
model wrapped in DistributedDataParallel, with the best AdamW this torch takes (fused, else
foreach) or ZeroRedundancyOptimizer wrapping it. ZeroShard: a real local cluster
(deploy/local/cluster.py, W workers, `--threads=1`), jobs through the `zeroshard` CLI, metrics
from `watch --output=json`, peak RSS from each worker's /proc/<pid>/status. Every variant runs
in --rounds rounds (2), the second in the reverse order, and its medians pool the rounds.

Prints one JSON line per variant (medians over the measured iterations after warm-up):
  {"bench":"e2e","job","world_size","variant","torch_version","iter_ms","limit_ms","over_limit",
   "step_ms","exposed_comm_ms","peak_rss_bytes", ...breakdown fields}
and one "e2e_targets" line per job with the target ratios. limit_ms is the variant's own
forward + backward + update with communication skipped, all W processes running at once (the
machine's limit for it); over_limit = iter_ms / limit_ms. Torch: the no-comm iterations each rank
runs after the measured ones (no_sync, the optimizer's step on the rank's own shard). ZeroShard:
W ddp jobs of one worker each, run at once on the same cluster (the same per-rank batch, so the
same forward and backward, and no peer to talk to), for forward + backward, plus the update_ms of
the variant's own run (the update of its shard, which involves no communication). ddp for every
mode: a one-worker zero1 or zero2 job still copies its gradients into the owned shard (the
reduce-scatter of one rank), which torch's no_sync iterations do not do (NO_COMM_MODE). What
each field means on each side is in docs/performance/e2e_vs_torch.md.
"""

import argparse
import calendar
import contextlib
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CLUSTER_SCRIPT = os.path.join(REPO_ROOT, "deploy", "local", "cluster.py")
BUILD_TARGETS = [
    "//apps/coordinator:zeroshard-coordinator",
    "//client:zeroshard",
    "//worker:zeroshard-worker",
]
VENV_PYTHON = "/opt/zs-torch/bin/python"
DEBIAN_PYTHON = "/usr/bin/python3"
# Set when this script re-ran itself under the chosen interpreter, so that it does not choose again.
CHOSEN_ENV = "ZS_E2E_TORCH_CHOSEN"

# sharding/model_catalog.cc's presets, the world size each runs at, and how many iterations are
# measured by default: seed is bound by latency and cheap, so it gets more of them.
JOBS = {
    "seed": {"layers": [10, 64, 10], "world_size": 4, "steps": 60},
    "medium": {"layers": [1024, 4096, 4096, 1024], "world_size": 2, "steps": 20},
    # 18 Linear layers (16 of 2048 x 2048): zero3's job (issue 38).
    "deep": {"layers": [1024] + [2048] * 17 + [1024], "world_size": 2, "steps": 20},
    # deep with buckets of 2,098,176 elements: the output layer is one bucket and each
    # 2048 x 2048 layer exactly two, so no two modules share a bucket (zero3 then copies no
    # boundary bucket between gather windows). Both zero2 and zero3 run with it.
    "deep-aligned": {"layers": [1024] + [2048] * 17 + [1024], "world_size": 2, "steps": 20,
                     "preset": "deep", "bucket_elems": 2098176},
}
VARIANTS = ["torch_ddp", "torch_zero", "zeroshard_ddp", "zeroshard_zero1", "zeroshard_zero2",
            "zeroshard_zero3"]
# What runs without --variants: zero3 only when asked for, so that the default run stays the
# comparison the earlier figures (docs/performance/e2e_vs_torch.md) were measured with.
DEFAULT_VARIANTS = [v for v in VARIANTS if v != "zeroshard_zero3"]
PER_RANK_BATCH = 32
DATASET_SIZE = 1024
SEED = 0
LR = 1e-3
# torch.optim.AdamW's defaults, which ZeroShard's AdamW shares (tests/integration/torch_adamw_test).
ADAMW_OPTIONS = {"lr": LR, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.01}
MIN_MEASURED = 10

# The targets: (job, variant, reference variant, largest ratio of their iter_ms); a reference of
# "limit" is the variant's own limit_ms (the ratio is its over_limit).
TARGETS = [
    ("medium", "zeroshard_zero2", "torch_zero", 0.60),
    ("medium", "zeroshard_ddp", "torch_ddp", 0.75),
    ("medium", "zeroshard_zero2", "limit", 1.15),
    ("medium", "zeroshard_zero2", "zeroshard_ddp", 1.0),
    ("seed", "zeroshard_zero2", "torch_ddp", 0.8),
    # Issue 38: zero3's second gather, before backward, is prefetched under compute.
    ("deep", "zeroshard_zero3", "zeroshard_zero2", 1.20),
    ("deep-aligned", "zeroshard_zero3", "zeroshard_zero2", 1.20),
]


class BenchError(Exception):
    """An expected failure, printed as one line."""


def say(message):
    print(f"e2e_vs_torch: {message}", file=sys.stderr, flush=True)


def emit(record):
    print(json.dumps(record, separators=(",", ":")), flush=True)


def median_ms(values):
    return round(statistics.median(values) * 1e3, 3) if values else None


def over_limit(iterations, limits):
    """iter_ms / limit_ms of the medians (None without a limit)."""
    if not iterations or not limits or statistics.median(limits) <= 0:
        return None
    return round(statistics.median(iterations) / statistics.median(limits), 3)


def slowest_rank(per_rank):
    """Per-iteration maximum over ranks of equally long per-rank lists."""
    return [max(values) for values in zip(*per_rank)]


def load_average():
    try:
        return round(os.getloadavg()[0], 2)
    except OSError:
        return None


def vmhwm_bytes(pid="self"):
    """VmHWM of a process from /proc/<pid>/status, in bytes, or None when it cannot be read."""
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


# --- choosing the torch ----------------------------------------------------------------------


def version_key(version):
    """Orders torch version strings by their leading numbers ('2.15.0+cpu' > '1.13.0a0')."""
    numbers = re.match(r"(\d+)(?:\.(\d+))?(?:\.(\d+))?", version or "")
    if numbers is None:
        return (-1,)
    return tuple(int(part or 0) for part in numbers.groups())


def probe_torch(python):
    """torch.__version__ under `python`, or None when it has no importable torch."""
    if not (os.path.isfile(python) and os.access(python, os.X_OK)):
        return None
    try:
        result = subprocess.run(
            [python, "-c", "import torch; print(torch.__version__)"],
            capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    if result.returncode != 0:
        return None
    lines = result.stdout.strip().splitlines()
    return lines[-1] if lines else None


def choose_newest(found):
    """The (python, version) with the newest torch among `found` (in preference order on ties),
    or None when none has one."""
    best = None
    for python, version in found:
        if version is not None and (best is None or version_key(version) > version_key(best[1])):
            best = (python, version)
    return best


def is_fallback(version):
    """Before torch 2 there is no fused AdamW, and no CPU one before 2.4: not the torch the issue
    compares against."""
    return version_key(version) < (2,)


def select_torch_python(forced, venv_python):
    """Re-runs this script under the interpreter with the newest torch (or `forced`'s) unless it
    already is that one; returns (version, fallback note or None) for this interpreter."""
    version = os.environ.get(CHOSEN_ENV)
    if not version:
        candidates = [forced] if forced else [sys.executable, venv_python, DEBIAN_PYTHON]
        seen = []
        for python in candidates:
            if os.path.abspath(python) not in [os.path.abspath(p) for p in seen]:
                seen.append(python)
        found = [(python, probe_torch(python)) for python in seen]
        for python, found_version in found:
            say(f"{python}: {'torch ' + found_version if found_version else 'no importable torch'}")
        best = choose_newest(found)
        if best is None:
            raise BenchError(f"no torch in {', '.join(seen)}; make the venv as docs/performance.md "
                             "says (End to end against PyTorch)")
        python, version = best
        if os.path.abspath(python) != os.path.abspath(sys.executable):
            say(f"re-running under {python} (torch {version})")
            env = dict(os.environ)
            env[CHOSEN_ENV] = version
            os.execve(python, [python, os.path.abspath(__file__), *sys.argv[1:]], env)
    if not is_fallback(version):
        return version, None
    why = "forced with --torch_python" if forced else f"{venv_python} has no torch >= 2"
    return version, f"fallback to torch {version} ({sys.executable}): {why}"


# --- the torch side ----------------------------------------------------------------------------


def torch_mlp(torch, layers):
    modules = []
    for index in range(len(layers) - 1):
        modules.append(torch.nn.Linear(layers[index], layers[index + 1]))
        if index + 2 < len(layers):
            modules.append(torch.nn.ReLU())
    return torch.nn.Sequential(*modules)


def make_torch_optimizer(torch, variant, params):
    """The best AdamW this torch accepts, alone or inside ZeroRedundancyOptimizer: fused, else
    foreach, else the default loop. Returns (optimizer, inner optimizer, description, what was
    refused on the way)."""
    from torch.distributed.optim import ZeroRedundancyOptimizer

    params = list(params)
    refused = []
    for flags in ({"fused": True}, {"foreach": True}, {}):
        described = "AdamW(" + ", ".join(f"{k}={v}" for k, v in flags.items()) + ")"
        try:
            if variant == "torch_zero":
                optimizer = ZeroRedundancyOptimizer(
                    params, optimizer_class=torch.optim.AdamW, **ADAMW_OPTIONS, **flags)
                return optimizer, optimizer.optim, f"ZeroRedundancyOptimizer({described})", refused
            optimizer = torch.optim.AdamW(params, **ADAMW_OPTIONS, **flags)
            return optimizer, optimizer, described, refused
        except (TypeError, RuntimeError, ValueError) as e:
            refused.append(f"{described}: {str(e).splitlines()[0][:160]}")
    raise BenchError(f"{variant}: no AdamW accepted: {'; '.join(refused)}")


def join_torch_group(torch, dist, config, rank):
    """A torch rank's set-up: one thread (as ZeroShard's workers run), then the gloo group of
    config["world_size"] ranks through the file store config["store"]."""
    torch.set_num_threads(1)
    with contextlib.suppress(RuntimeError):  # only settable before the first parallel work
        torch.set_num_interop_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{config['store']}", rank=rank,
                            world_size=config["world_size"])


def time_inner_updates(optimizer, inner):
    """ZeroRedundancyOptimizer.step() = the inner optimizer's step on this rank's shard, then the
    parameter broadcasts: wraps the inner step so that each call's seconds are appended to the
    returned list (which stays empty for a plain optimizer, whose step is the update). Returns
    (that list, the timed inner step, for an update without the broadcasts)."""
    update_seconds = []
    inner_step = inner.step

    def timed_inner_step(*args, **kwargs):
        start = time.perf_counter()
        result = inner_step(*args, **kwargs)
        update_seconds.append(time.perf_counter() - start)
        return result

    if inner is not optimizer:
        inner.step = timed_inner_step
    return update_seconds, timed_inner_step


def torch_rank_main(rank, config, out_dir):
    """One torch rank: trains (warm-up, then measured iterations), then the same loop without
    gradient communication (the no-comm baseline); writes its timings to out_dir/rank<r>.json."""
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    world_size = config["world_size"]
    join_torch_group(torch, dist, config, rank)
    layers = config["layers"]
    torch.manual_seed(SEED)  # every rank starts from the same model, as DDP requires
    student = torch_mlp(torch, layers)
    teacher = torch_mlp(torch, layers).requires_grad_(False)
    dataset = torch.randn(DATASET_SIZE, layers[0], generator=torch.Generator().manual_seed(SEED))
    # Gradients as views of DDP's buckets: no copy out of them, no second gradient buffer.
    model = DistributedDataParallel(student, gradient_as_bucket_view=True)
    optimizer, inner, described, refused = make_torch_optimizer(
        torch, config["variant"], model.parameters())

    update_seconds, timed_inner_step = time_inner_updates(optimizer, inner)
    loss_fn = torch.nn.MSELoss()
    global_batch = PER_RANK_BATCH * world_size

    def iteration(step, communicate):
        start = time.perf_counter()
        first = step * global_batch + rank * PER_RANK_BATCH
        x = dataset[torch.arange(first, first + PER_RANK_BATCH) % DATASET_SIZE]
        with torch.no_grad():
            y = teacher(x)
        with contextlib.nullcontext() if communicate else model.no_sync():
            loss = loss_fn(model(x), y)
            loss.backward()
        computed = time.perf_counter()
        updates_before = len(update_seconds)
        if communicate or inner is optimizer:
            optimizer.step()
        else:
            timed_inner_step()  # this rank's shard only: no broadcast
        stepped = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        done = time.perf_counter()
        update = (update_seconds[-1] if len(update_seconds) > updates_before
                  else stepped - computed)
        return {"iter": done - start, "compute": computed - start, "step": stepped - computed,
                "update": update, "loss": loss.item()}

    warmup, steps = config["warmup"], config["steps"]
    dist.barrier()
    trained = [iteration(step, True) for step in range(warmup + steps)][warmup:]
    peak_training = vmhwm_bytes()
    dist.barrier()
    # The no-comm baseline comes after the measured run (its local gradients would add their own
    # buffers to the peak RSS), as pairs of one iteration with gradient communication and one
    # without, in alternating order, so that the two halves of a pair see the same load.
    step = warmup + steps
    iteration(step, False)  # the local gradients' first allocation
    paired, baseline = [], []
    for pair in range(steps):
        for communicate in (True, False) if pair % 2 == 0 else (False, True):
            step += 1
            (paired if communicate else baseline).append(iteration(step, communicate))
    dist.barrier()
    record = {
        "rank": rank,
        "optimizer": described,
        "refused": refused,
        "trained": trained,
        "paired": paired,
        "no_comm": baseline,
        "peak_rss_bytes": peak_training,
        "torch_version": torch.__version__,
    }
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump(record, f)
    dist.destroy_process_group()


def summarize_torch(job, variant, world_size, rounds, torch_version, warmup):
    """The variant's JSON line from every round's rank records (one list of W per round)."""
    def column(phase, key):
        return [value for ranks in rounds
                for value in slowest_rank([[it[key] for it in r[phase]] for r in ranks])]

    iteration = column("trained", "iter")
    # The limit: iterations without gradient communication (no_sync) whose step is the update of
    # this rank's shard alone (ZeroRedundancyOptimizer's inner step, no broadcast).
    limit = column("no_comm", "iter")
    compute = column("trained", "compute")
    step = column("trained", "step")
    update = column("trained", "update")
    no_comm_compute = column("no_comm", "compute")
    # Communication in step() beyond the update: ZeRO's parameter broadcasts (0 for DDP, whose
    # step is the update).
    step_comm = [a - b for a, b in zip(step, update)]
    # DDP's cost in forward + backward (bucket copies, the all-reduce it waits for at the end of
    # backward): per pair, with communication minus without.
    backward_comm = [a - b for a, b in zip(column("paired", "compute"), no_comm_compute)]
    exposed = statistics.median(backward_comm) + statistics.median(step_comm)
    peaks = [max((r["peak_rss_bytes"] for ranks in rounds for r in ranks if r["rank"] == rank),
                 default=None) for rank in range(world_size)]
    rank0 = [next(r for r in ranks if r["rank"] == 0) for ranks in rounds]
    return {
        "bench": "e2e",
        "job": job,
        "world_size": world_size,
        "variant": variant,
        "torch_version": torch_version,
        "iter_ms": median_ms(iteration),
        "limit_ms": median_ms(limit),
        "over_limit": over_limit(iteration, limit),
        "step_ms": median_ms(step),
        "exposed_comm_ms": round(exposed * 1e3, 3),
        "peak_rss_bytes": max(peaks) if all(p is not None for p in peaks) else None,
        "optimizer": rank0[0]["optimizer"],
        "optimizer_refused": rank0[0]["refused"],
        "steps": len(iteration),
        "rounds": len(rounds),
        "warmup": warmup,
        "per_rank_batch": PER_RANK_BATCH,
        "compute_ms": median_ms(compute),
        "compute_no_comm_ms": median_ms(no_comm_compute),
        "compute_paired_ms": median_ms(column("paired", "compute")),
        "update_ms": median_ms(update),
        "backward_comm_ms": median_ms(backward_comm),
        "step_comm_ms": median_ms(step_comm),
        "iter_ms_rank0": median_ms([it["iter"] for r in rank0 for it in r["trained"]]),
        "peak_rss_bytes_per_rank": peaks,
        "final_loss": round(rank0[-1]["trained"][-1]["loss"], 6),
    }


def run_torch_round(job, variant, steps, warmup):
    """One round of a torch variant in fresh processes: every rank's record."""
    import torch.multiprocessing

    spec = JOBS[job]
    world_size = spec["world_size"]
    work = tempfile.mkdtemp(prefix=f"zs-e2e-{job}-{variant}-")
    try:
        config = {
            "variant": variant,
            "layers": spec["layers"],
            "world_size": world_size,
            "store": os.path.join(work, "store"),
            "steps": steps,
            "warmup": warmup,
        }
        try:
            torch.multiprocessing.spawn(torch_rank_main, args=(config, work), nprocs=world_size,
                                        join=True)
        except Exception as e:  # a rank's exception, with its traceback in the message
            raise BenchError(f"{job} {variant}: a torch rank failed: {e}") from None
        ranks = []
        for rank in range(world_size):
            with open(os.path.join(work, f"rank{rank}.json")) as f:
                ranks.append(json.load(f))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    for refusal in ranks[0]["refused"]:
        say(f"{job} {variant}: refused {refusal}")
    return ranks


# --- the ZeroShard side ------------------------------------------------------------------------


def parse_event_time(text):
    """Seconds since the epoch of a protobuf JSON Timestamp ('2026-11-30T12:28:01.123456789Z')."""
    match = re.fullmatch(r"(\d{4})-(\d\d)-(\d\d)T(\d\d):(\d\d):(\d\d)(?:\.(\d+))?Z", text or "")
    if match is None:
        return None
    fields = [int(part) for part in match.groups()[:6]]
    fraction = match.group(7) or "0"
    return calendar.timegm(tuple(fields) + (0, 0, 0)) + int(fraction) / 10 ** len(fraction)


def zeroshard_exposed_comm_ms(metrics):
    """Communication the iteration waits for, from one step's StepMetrics: everything Step() does
    besides the update (waiting for reductions still in flight, the gradient statistics and their
    small all-reduce, the all-gather), or, when larger, the engine's own reduction wait (which
    also counts zero2's waits for a free bucket buffer during backward) plus the all-gather,
    counted only as far as it lies inside Step()."""
    step, update = float(metrics.get("step_ms", 0.0)), float(metrics.get("update_ms", 0.0))
    outside_update = max(0.0, step - update)
    allgather = min(float(metrics.get("allgather_ms", 0.0)), outside_update)
    return max(outside_update, float(metrics.get("exposed_comm_ms", 0.0)) + allgather)


def parse_watch_output(lines):
    """(progress by step, each step's event time, final state, message) from the JSON events of
    `zeroshard watch --output=json`; a restarted generation discards what came before it."""
    progress, times, state, message = {}, {}, None, ""
    for line in lines:
        line = line.strip()
        if not line:
            continue
        try:
            event = json.loads(line)
        except json.JSONDecodeError:
            continue
        kind = event.get("type")
        if kind == "GENERATION_STARTED":
            progress, times = {}, {}
        elif kind == "STATE_CHANGED":
            state, message = event.get("state"), event.get("message", "")
        elif kind == "PROGRESS":
            metrics = event.get("progress", {})
            step = int(metrics.get("step", 0))  # int64 fields come as strings
            progress[step] = metrics
            times[step] = parse_event_time(event.get("time"))
    return progress, times, state, message


def measured_steps(progress, times, steps, warmup):
    """The measured steps' metrics, and the wall between rank 0's reports of consecutive
    measured steps: each report follows its iteration, so their spacing is the whole loop, the
    report's RPC included. The last report comes after the final checkpoint is written, so the
    interval that ends there is left out."""
    measured = [progress[s] for s in range(warmup + 1, warmup + steps + 1)]
    intervals = [times[s] - times[s - 1] for s in range(warmup + 1, warmup + steps)
                 if times.get(s) is not None and times.get(s - 1) is not None]
    return measured, intervals


def summarize_zeroshard(job, mode, world_size, runs, warmup, torch_version):
    """The mode's JSON line from its runs (one per round): {"measured": [StepMetrics as JSON],
    "intervals": [seconds], "peaks": [bytes per rank]}."""
    measured = [m for run in runs for m in run["measured"]]

    def field(name):
        return [float(m.get(name, 0.0)) / 1e3 for m in measured]

    peaks = [max(p) if all(x is not None for x in p) else None
             for p in zip(*(run["peaks"] for run in runs))]
    # The limit: forward + backward of the one-worker jobs run at once (each step's slowest), plus
    # this run's own update (of its shard: no communication in it).
    no_comm_compute = [max(per_job) / 1e3 for run in runs
                       for per_job in zip(*run.get("no_comm_compute_ms", []))]
    update = field("update_ms")
    limit = ([statistics.median(no_comm_compute) + statistics.median(update)]
             if no_comm_compute and update else [])
    iteration = field("iteration_ms")
    return {
        "bench": "e2e",
        "job": job,
        "world_size": world_size,
        "variant": f"zeroshard_{mode}",
        "torch_version": torch_version,
        "iter_ms": median_ms(iteration),
        "limit_ms": median_ms(limit) if limit else None,
        "over_limit": over_limit(iteration, limit),
        "compute_no_comm_ms": median_ms(no_comm_compute) if no_comm_compute else None,
        "step_ms": median_ms(field("step_ms")),
        "exposed_comm_ms": median_ms([zeroshard_exposed_comm_ms(m) / 1e3 for m in measured]),
        "peak_rss_bytes": max(peaks) if peaks and all(p is not None for p in peaks) else None,
        "optimizer": "ADAMW",
        "steps": len(measured),
        "rounds": len(runs),
        "warmup": warmup,
        "per_rank_batch": PER_RANK_BATCH,
        "compute_ms": median_ms(field("compute_ms")),
        "update_ms": median_ms(field("update_ms")),
        "reduce_exposed_ms": median_ms(field("exposed_comm_ms")),
        "reduce_comm_ms": median_ms(field("comm_ms")),
        "allgather_ms": median_ms(field("allgather_ms")),
        "wall_per_iter_ms": median_ms([i for run in runs for i in run["intervals"]]),
        "peak_rss_bytes_per_rank": peaks,
        "final_loss": round(float(measured[-1].get("loss", 0.0)), 6),
    }


def submit_job(cli, coordinator, name, job, mode, workers, steps):
    """Submits one ZeroShard job of `workers` ranks (PER_RANK_BATCH samples each); its id."""
    spec = JOBS[job]
    bucket = [f"--bucket_elems={spec['bucket_elems']}"] if "bucket_elems" in spec else []
    submitted = subprocess.run(
        [cli, coordinator, "submit", f"--name={name}", f"--preset={spec.get('preset', job)}",
         *bucket, "--optimizer=adamw",
         f"--lr={LR}", f"--mode={mode}", f"--workers={workers}", f"--steps={steps}",
         f"--global_batch={PER_RANK_BATCH * workers}", f"--dataset_size={DATASET_SIZE}",
         f"--seed={SEED}", "--output=json"],
        capture_output=True, text=True, timeout=60)
    if submitted.returncode != 0:
        raise BenchError(f"{name}: submit failed: {submitted.stderr.strip()}")
    return json.loads(submitted.stdout)["id"]


def watch_jobs(cli, coordinator, job_ids, steps, timeout):
    """Watches the jobs to their end, all at once; (progress, times) of each, in order."""
    watchers = [subprocess.Popen([cli, coordinator, "watch", job_id, "--output=json"],
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
                for job_id in job_ids]
    results = []
    for job_id, watcher in zip(job_ids, watchers):
        try:
            out, err = watcher.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            for w in watchers:
                w.kill()
            raise
        progress, times, state, message = parse_watch_output(out.splitlines())
        if watcher.returncode != 0 or state != "SUCCEEDED":
            raise BenchError(f"{job_id} ended {state}: {message} {err.strip()}")
        missing = [s for s in range(1, steps + 1) if s not in progress]
        if missing:
            raise BenchError(f"{job_id}: no progress for steps {missing}")
        results.append((progress, times))
    return results


# The mode of the one-worker jobs that measure every mode's forward + backward without
# communication (the same forward and backward in every mode): ddp, whose gradients stay where
# backward wrote them. A one-worker zero1 or zero2 job would still copy every bucket into its
# owned gradient storage (its reduce-scatter of one rank, about the model's gradient bytes per
# iteration), which is communication's stand-in, not compute.
NO_COMM_MODE = "ddp"


def zeroshard_client(argv):
    """Runs inside deploy/local/cluster.py: per mode, the measured job of W workers, then W jobs
    of one worker each at once (the no-communication limit); one JSON line per mode to
    --results."""
    parser = argparse.ArgumentParser(prog="e2e_vs_torch.py zeroshard-client")
    parser.add_argument("--job", required=True, choices=sorted(JOBS))
    parser.add_argument("--modes", required=True)
    parser.add_argument("--steps", type=int, required=True)
    parser.add_argument("--warmup", type=int, required=True)
    parser.add_argument("--results", required=True)
    parser.add_argument("--job_timeout", type=float, required=True)
    args = parser.parse_args(argv)
    cli = os.environ["ZEROSHARD_CLI"]
    coordinator = f"--coordinator={os.environ['ZEROSHARD_COORDINATOR']}"
    pids = [int(p) for p in os.environ.get("ZEROSHARD_WORKER_PIDS", "").split(",") if p]
    world_size = JOBS[args.job]["world_size"]
    total = args.warmup + args.steps
    for mode in args.modes.split(","):
        job_id = submit_job(cli, coordinator, f"e2e-{args.job}-{mode}", args.job, mode,
                            world_size, total)
        load = load_average()
        say(f"{args.job} zeroshard_{mode}: {job_id} (load average {load})")
        ((progress, times),) = watch_jobs(cli, coordinator, [job_id], total, args.job_timeout)
        # Each worker resets its peak when a run starts: read right after the job, it is the job's.
        peaks = [vmhwm_bytes(pid) for pid in pids]
        measured, intervals = measured_steps(progress, times, args.steps, args.warmup)
        alone = [submit_job(cli, coordinator, f"e2e-{args.job}-{mode}-no-comm-{r}", args.job,
                            NO_COMM_MODE, 1, total) for r in range(world_size)]
        say(f"{args.job} zeroshard_{mode} without communication: {', '.join(alone)} at once")
        no_comm = [[float(m.get("compute_ms", 0.0))
                    for m in measured_steps(p, t, args.steps, args.warmup)[0]]
                   for p, t in watch_jobs(cli, coordinator, alone, total, args.job_timeout)]
        run = {"mode": mode, "measured": measured, "intervals": intervals, "peaks": peaks,
               "load_average": load, "no_comm_compute_ms": no_comm}
        with open(args.results, "a") as f:
            f.write(json.dumps(run) + "\n")


def build_binaries():
    say(f"building {' '.join(BUILD_TARGETS)} (bazel build -c opt)")
    build = subprocess.run(["bazel", "build", "-c", "opt", *BUILD_TARGETS], cwd=REPO_ROOT,
                           capture_output=True, text=True)
    if build.returncode != 0:
        sys.stderr.write(build.stderr[-4000:])
        raise BenchError("the build failed")
    info = subprocess.run(["bazel", "info", "-c", "opt", "bazel-bin"], cwd=REPO_ROOT,
                          capture_output=True, text=True)
    if info.returncode != 0:
        raise BenchError(f"bazel info -c opt bazel-bin failed: {info.stderr.strip()}")
    return info.stdout.strip()


def run_zeroshard_round(job, modes, steps, warmup, bin_dir, log_dir, job_timeout):
    """One round of ZeroShard jobs, one per mode in this order, on a fresh local cluster: the
    client's record of each."""
    world_size = JOBS[job]["world_size"]
    results = os.path.join(log_dir, "results.jsonl")
    command = [
        sys.executable, CLUSTER_SCRIPT, f"--workers={world_size}", f"--bin_dir={bin_dir}",
        f"--log_dir={log_dir}", "--worker_threads=1", "--",
        sys.executable, os.path.abspath(__file__), "zeroshard-client", f"--job={job}",
        f"--modes={','.join(modes)}", f"--steps={steps}", f"--warmup={warmup}",
        f"--results={results}", f"--job_timeout={job_timeout}",
    ]
    # The cluster's own stdout (the coordinator's address) must not mix with the JSON lines.
    status = subprocess.run(command, stdin=subprocess.DEVNULL, stdout=sys.stderr).returncode
    # Each job's final checkpoint (300 MB on medium) is not needed here.
    shutil.rmtree(os.path.join(log_dir, "checkpoints"), ignore_errors=True)
    if status != 0:
        raise BenchError(f"{job}: the ZeroShard cluster run failed (status {status}; logs in "
                         f"{log_dir})")
    with open(results) as f:
        return [json.loads(line) for line in f if line.strip()]


# --- the whole run -----------------------------------------------------------------------------


def round_plan(variants, rounds):
    """Each round's blocks in order: ("torch", variant) or ("zeroshard", [modes]). Odd rounds
    run the even rounds' order backwards, so that a load that rises or falls during the run
    falls on every variant alike."""
    torch_blocks = [("torch", v) for v in variants if v.startswith("torch_")]
    modes = [v[len("zeroshard_"):] for v in variants if v.startswith("zeroshard_")]
    blocks = torch_blocks + ([("zeroshard", modes)] if modes else [])
    backwards = [(kind, list(reversed(what)) if kind == "zeroshard" else what)
                 for kind, what in reversed(blocks)]
    return [blocks if r % 2 == 0 else backwards for r in range(rounds)]


def run_job(job, args, bin_dir, log_root, torch_version, note):
    """Every variant of `job`, round by round; the variants' JSON lines."""
    world_size = JOBS[job]["world_size"]
    steps = args.steps or JOBS[job]["steps"]
    per_round = -(-steps // args.rounds)
    torch_rounds, zeroshard_runs, loads = {}, {}, {}
    for number, blocks in enumerate(round_plan(args.variants, args.rounds)):
        for kind, what in blocks:
            load = load_average()
            if kind == "torch":
                say(f"{job} {what}, round {number + 1}/{args.rounds}: W = {world_size}, "
                    f"{args.warmup} + {per_round} iterations (load average {load})")
                torch_rounds.setdefault(what, []).append(
                    run_torch_round(job, what, per_round, args.warmup))
                loads.setdefault(what, []).append(load)
                continue
            log_dir = os.path.join(log_root, f"{job}-round{number + 1}")
            for run in run_zeroshard_round(job, what, per_round, args.warmup, bin_dir, log_dir,
                                           args.job_timeout):
                zeroshard_runs.setdefault(run["mode"], []).append(run)
                loads.setdefault(f"zeroshard_{run['mode']}", []).append(run["load_average"])
    records = []
    for variant in args.variants:
        if variant.startswith("torch_"):
            record = summarize_torch(job, variant, world_size, torch_rounds[variant],
                                     torch_version, args.warmup)
            record["torch_thp_alloc"] = args.torch_thp
            if note:
                record["torch_note"] = note
        else:
            record = summarize_zeroshard(job, variant[len("zeroshard_"):], world_size,
                                         zeroshard_runs[variant[len("zeroshard_"):]],
                                         args.warmup, torch_version)
        record["load_average"] = loads[variant]
        records.append(record)
        emit(record)
    return records


def target_lines(records):
    """One line per job: each target ratio this run measured (TARGETS), and whether it is met."""
    by_key = {(r["job"], r["variant"]): r for r in records}
    lines = {}
    for job, variant, reference, limit in TARGETS:
        ours = by_key.get((job, variant))
        if reference == "limit":
            theirs = {"iter_ms": ours.get("limit_ms")} if ours else None
        else:
            theirs = by_key.get((job, reference))
        if ours is None or theirs is None or not theirs["iter_ms"]:
            continue
        ratio = ours["iter_ms"] / theirs["iter_ms"]
        line = lines.setdefault(job, {"bench": "e2e_targets", "job": job,
                                      "world_size": ours["world_size"], "targets": []})
        line["targets"].append({"variant": variant, "reference": reference,
                                "ratio": round(ratio, 3), "limit": limit, "met": ratio <= limit})
    return list(lines.values())


def parse_args(argv):
    parser = argparse.ArgumentParser(
        description="ZeroShard ddp/zero1/zero2/zero3 against torch DDP and "
                    "ZeroRedundancyOptimizer, end to end, on this machine.")
    parser.add_argument("--jobs", default="seed,medium",
                        help=f"comma-separated: {', '.join(JOBS)}")
    parser.add_argument("--variants", default=",".join(DEFAULT_VARIANTS),
                        help=f"comma-separated, from {', '.join(VARIANTS)} (default: all but "
                             "zeroshard_zero3)")
    parser.add_argument("--steps", type=int, default=None,
                        help=f"measured iterations after warm-up, all rounds together (at least "
                             f"{MIN_MEASURED}; default: 60 for seed, 20 for medium and deep)")
    parser.add_argument("--warmup", type=int, default=3,
                        help="iterations before measuring, in every round")
    parser.add_argument("--rounds", type=int, default=2,
                        help="rounds of every variant, each measuring about steps / rounds "
                             "iterations, odd rounds in the reverse order (default 2)")
    parser.add_argument("--bin_dir", default=None,
                        help="the -c opt bazel-bin holding the ZeroShard binaries (default: "
                             "build them, then `bazel info -c opt bazel-bin`)")
    parser.add_argument("--torch_python", default=None,
                        help="use this interpreter's torch instead of choosing the newest")
    parser.add_argument("--venv_python", default=VENV_PYTHON,
                        help="the tools venv's interpreter, one of the candidates (default: "
                             "%(default)s)")
    parser.add_argument("--torch_thp", action=argparse.BooleanOptionalAction, default=True,
                        help="torch allocates big tensors on transparent huge pages "
                             "(THP_MEM_ALLOC_ENABLE=1; default: on)")
    parser.add_argument("--log_dir", default=None, help="cluster logs (default: a new /tmp dir)")
    parser.add_argument("--job_timeout", type=float, default=600.0, help="seconds per job")
    args = parser.parse_args(argv)
    args.jobs = [j.strip() for j in args.jobs.split(",") if j.strip()]
    args.variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    for job in args.jobs:
        if job not in JOBS:
            parser.error(f"--jobs: unknown job '{job}' (known: {', '.join(JOBS)})")
    for variant in args.variants:
        if variant not in VARIANTS:
            parser.error(f"--variants: unknown variant '{variant}'")
    if args.steps is not None and args.steps < MIN_MEASURED:
        parser.error(f"--steps: at least {MIN_MEASURED}")
    if args.rounds < 1:
        parser.error("--rounds: at least 1")
    if args.warmup < 1:
        parser.error("--warmup: at least 1 (the first iteration allocates everything)")
    return args


def main(argv):
    if argv[:1] == ["zeroshard-client"]:
        zeroshard_client(argv[1:])
        return 0
    args = parse_args(argv)
    # One thread per torch rank; set before torch is imported here and in the spawned ranks.
    os.environ["OMP_NUM_THREADS"] = "1"
    os.environ["MKL_NUM_THREADS"] = "1"
    os.environ["GLOO_SOCKET_IFNAME"] = "lo"
    # torch's CPU allocator returns big tensors to the kernel when they are freed, so every
    # backward faults its weight gradients in again, 4 KiB at a time (64 MB for medium's
    # 4096 x 4096); on transparent huge pages (torch >= 2.3 reads this) that cost mostly goes.
    if args.torch_thp:
        os.environ["THP_MEM_ALLOC_ENABLE"] = "1"
    else:
        os.environ.pop("THP_MEM_ALLOC_ENABLE", None)
    version, note = select_torch_python(args.torch_python, args.venv_python)
    import torch

    torch_version = torch.__version__
    if note:
        say(f"{note}: no fused AdamW, so torch runs its best older AdamW (foreach) and the "
            "comparison is not the one the targets ask for")
        torch_version = f"{torch_version} (fallback)"
    say(f"torch {torch.__version__} from {sys.executable}; load average {load_average()}")

    bin_dir, log_root = None, None
    if any(v.startswith("zeroshard_") for v in args.variants):
        bin_dir = args.bin_dir or build_binaries()
        log_root = args.log_dir or tempfile.mkdtemp(prefix="zs-e2e-")
        os.makedirs(log_root, exist_ok=True)
    records = []
    for job in args.jobs:
        records += run_job(job, args, bin_dir, log_root, torch_version, note)
    for line in target_lines(records):
        emit(line)
    if log_root:
        say(f"cluster logs in {log_root}")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except BenchError as e:
        say(f"error: {e}")
        sys.exit(1)
    except subprocess.TimeoutExpired as e:
        say(f"error: timed out: {e}")
        sys.exit(1)
