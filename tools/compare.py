#!/usr/bin/env python3
"""The seed's comparison, side by side with PyTorch on this machine, as a report with plots.

    tools/compare.py                                  # seed and medium, W = 2 and 4 (minutes)
    tools/compare.py --presets=seed --world_sizes=2 --steps=6 --out=/tmp/r/report.md

Trains the same model (the catalog preset), on the same data and initial weights (the generator of
docs/workloads.md, through tools/reference/workload_reference.py) with the same AdamW
hyperparameters, six ways at each W: ZeroShard ddp, zero1, zero2 and zero3 (--zeroshard_modes;
built-in workload, a real local cluster from deploy/local/cluster.py) and torch DDP +
torch.optim.AdamW and DDP + ZeroRedundancyOptimizer on gloo (the torch of --torch_python, Debian's
by default). Then it times the AdamW kernels (tests/bench:optimizer_bench against
tests/bench/torch_adamw.py, alternating).
Every measurement goes to <out dir>/raw/*.json; the markdown and the PNG plots are made from those
files only. The whole run holds --lock (the shared benchmark lock) when that file exists.

Reuses tests/bench/e2e_vs_torch.py (the torch optimizer choice, the watch parsing, VmHWM) and
compare_torch_adamw.py / torch_adamw.py (the kernel timings); tools/compare_test.py checks a
reduced run.
"""

import argparse
import contextlib
import datetime
import fcntl
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO_ROOT, "tests", "bench"))
sys.path.insert(0, os.path.join(REPO_ROOT, "tools", "reference"))
sys.path.insert(0, os.path.join(REPO_ROOT, "tools"))
import compare_torch_adamw  # noqa: E402  (the kernel comparison's runner)
import e2e_vs_torch as e2e  # noqa: E402  (the end-to-end benchmark's torch and watch helpers)
import workload_reference  # noqa: E402  (docs/workloads.md's generator, bit for bit)

CLUSTER_SCRIPT = os.path.join(REPO_ROOT, "deploy", "local", "cluster.py")
TORCH_ADAMW_SCRIPT = os.path.join(REPO_ROOT, "tests", "bench", "torch_adamw.py")
TORCH_ATTACH_SCRIPT = os.path.join(REPO_ROOT, "tests", "bench", "torch_attach.py")
STUBS_DIR = os.path.join(REPO_ROOT, "python", "zeroshard", "_proto")
ATTACHED_VARIANTS = ["zeroshard_ddp", "zeroshard_zero2"]
BUILD_TARGETS = e2e.BUILD_TARGETS + ["//tests/bench:optimizer_bench"]
PRESETS = {"seed": [10, 64, 10], "medium": [1024, 4096, 4096, 1024]}
DEFAULT_STEPS = {"seed": 40, "medium": 10}
TORCH_VARIANTS = ["torch_ddp", "torch_zero"]
# The ZeroShard modes --zeroshard_modes picks from (all by default), in this order.
ZEROSHARD_MODES = ["ddp", "zero1", "zero2", "zero3"]
VARIANTS = TORCH_VARIANTS + [f"zeroshard_{mode}" for mode in ZEROSHARD_MODES]
# The reference every variant's final parameters are compared with.
REFERENCE_VARIANT = "torch_ddp"
FP32 = 4
# Adam's two moments per parameter.
ADAM_STATE_BYTES = 8
MEMORY_CATEGORIES = ["params_bytes", "grads_bytes", "optimizer_state_bytes", "other_bytes"]
MIB = 1 << 20


def say(message):
    print(f"compare: {message}", file=sys.stderr, flush=True)


def load_averages():
    return [round(x, 2) for x in os.getloadavg()]


def catalog_order(layers):
    """The catalog's tensor order and torch's names (docs/workloads.md, "The model")."""
    names = []
    for layer in reversed(range(len(layers) - 1)):
        names += [f"{2 * layer}.bias", f"{2 * layer}.weight"]
    return names


def param_count(layers):
    return sum(layers[i] * layers[i + 1] + layers[i + 1] for i in range(len(layers) - 1))


# The ZeroShard run whose plan's ZeRO formula a torch variant shares (same model, optimizer and
# W): torch's ZeroRedundancyOptimizer shards the optimizer state only, as zero1.
FORMULA_OF_TORCH_VARIANT = {"torch_ddp": "zeroshard_ddp", "torch_zero": "zeroshard_zero1"}


def formula_bytes(variant, run):
    """The ZeRO paper's per-rank bytes (parameters, gradients, master copies and optimizer state,
    the sharded ones divided by W) as the coordinator served them with the variant's plan."""
    name = FORMULA_OF_TORCH_VARIANT.get(variant["variant"], variant["variant"])
    formula = next(v for v in run["variants"] if v["variant"] == name)["model_state_formula"]
    # gather_pool_bytes: zero3's pool, absent (0) in other modes.
    return int(sum(float(formula.get(key, 0.0)) for key in (
        "params_bytes", "grads_bytes", "master_bytes", "optimizer_state_bytes",
        "gather_pool_bytes")))


# --- the torch side (runs under --torch_python) ------------------------------------------------


def reference_mlp(torch, layers, role):
    """nn.Sequential(Linear, ReLU, ...) holding the generator's initial tensors of `role`."""
    import numpy as np

    model = e2e.torch_mlp(torch, layers)
    linears = [m for m in model if isinstance(m, torch.nn.Linear)]
    with torch.no_grad():
        for layer, linear in enumerate(linears):
            for kind, is_bias in (("weight", False), ("bias", True)):
                values = workload_reference.layer_tensor(role, layers, e2e.SEED, layer, is_bias)
                getattr(linear, kind).copy_(torch.from_numpy(np.ascontiguousarray(values)))
    return model


def torch_rank_main(rank, config, out_dir):
    """One torch rank: warm-up and measured iterations on the generator's data; writes its
    per-step figures (and, on rank 0, the final parameters) to out_dir."""
    import numpy as np
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    world_size, layers = config["world_size"], config["layers"]
    e2e.join_torch_group(torch, dist, config, rank)
    student = reference_mlp(torch, layers, workload_reference.ROLE_STUDENT)
    teacher = reference_mlp(torch, layers, workload_reference.ROLE_TEACHER).requires_grad_(False)
    samples = torch.from_numpy(workload_reference.inputs(layers, e2e.SEED, 0, e2e.DATASET_SIZE))
    model = DistributedDataParallel(student, gradient_as_bucket_view=True)
    optimizer, inner, described, refused = e2e.make_torch_optimizer(
        torch, config["variant"], model.parameters())
    update_seconds, _ = e2e.time_inner_updates(optimizer, inner)
    loss_fn = torch.nn.MSELoss()
    global_batch = e2e.PER_RANK_BATCH * world_size
    steps = []
    dist.barrier()
    for step in range(config["warmup"] + config["steps"]):
        start = time.perf_counter()
        first = step * global_batch + rank * e2e.PER_RANK_BATCH
        x = samples[torch.arange(first, first + e2e.PER_RANK_BATCH) % e2e.DATASET_SIZE]
        with torch.no_grad():
            y = teacher(x)
        loss = loss_fn(model(x), y)
        loss.backward()
        computed = time.perf_counter()
        before = len(update_seconds)
        optimizer.step()
        stepped = time.perf_counter()
        optimizer.zero_grad(set_to_none=False)  # DDP's bucket views stay, as ZeroShard's grads
        done = time.perf_counter()
        update = update_seconds[-1] if len(update_seconds) > before else stepped - computed
        steps.append({"loss": loss.item(), "iteration_ms": (done - start) * 1e3,
                      "compute_ms": (computed - start) * 1e3,
                      "update_ms": update * 1e3,
                      "comm_after_backward_ms": (stepped - computed - update) * 1e3})
    state_bytes = sum(t.numel() * t.element_size() for s in inner.state.values()
                      for t in s.values() if torch.is_tensor(t) and t.dim() > 0)
    params = sum(p.numel() for p in student.parameters())
    record = {
        "rank": rank,
        "optimizer": described,
        "refused": refused,
        "steps": steps,
        "peak_rss_bytes": e2e.vmhwm_bytes(),
        "memory": {"params_bytes": FP32 * params, "grads_bytes": FP32 * params,
                   "optimizer_state_bytes": state_bytes},
        "torch_version": torch.__version__,
    }
    if rank == 0:
        state = student.state_dict()
        flat = np.concatenate([state[n].detach().numpy().ravel() for n in catalog_order(layers)])
        np.save(os.path.join(out_dir, "params.npy"), flat.astype(np.float32))
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump(record, f)
    dist.barrier()
    dist.destroy_process_group()


def torch_run(argv):
    """Subcommand: one torch variant at one W; writes --out (JSON) and --params_out (npy)."""
    parser = argparse.ArgumentParser(prog="compare.py torch-run")
    for name in ("--preset", "--variant", "--out", "--params_out"):
        parser.add_argument(name, required=True)
    for name in ("--world_size", "--steps", "--warmup"):
        parser.add_argument(name, type=int, required=True)
    args = parser.parse_args(argv)
    import torch
    import torch.multiprocessing

    import torch_adamw  # tests/bench: whether this torch has a fused CPU AdamW

    work = tempfile.mkdtemp(prefix="zs-compare-torch-")
    try:
        config = {"variant": args.variant, "layers": PRESETS[args.preset],
                  "world_size": args.world_size, "store": os.path.join(work, "store"),
                  "steps": args.steps, "warmup": args.warmup}
        torch.multiprocessing.spawn(torch_rank_main, args=(config, work),
                                    nprocs=args.world_size, join=True)
        ranks = []
        for rank in range(args.world_size):
            with open(os.path.join(work, f"rank{rank}.json")) as f:
                ranks.append(json.load(f))
        shutil.move(os.path.join(work, "params.npy"), args.params_out)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    # Every rank's micro-batch is the same size: the global loss is the mean of the ranks'.
    per_step = []
    for index in range(len(ranks[0]["steps"])):
        row = {key: max(r["steps"][index][key] for r in ranks)
               for key in ("iteration_ms", "compute_ms", "update_ms", "comm_after_backward_ms")}
        row["step"] = index + 1
        row["loss"] = statistics.fmean(r["steps"][index]["loss"] for r in ranks)
        per_step.append(row)
    result = {
        "variant": args.variant,
        "optimizer": ranks[0]["optimizer"],
        "optimizer_refused": ranks[0]["refused"],
        "torch_version": torch.__version__,
        "fused_cpu_adamw": torch_adamw.fused_cpu_adamw_works(torch),
        "steps": per_step,
        "peak_rss_bytes_per_rank": [r["peak_rss_bytes"] for r in ranks],
        "memory": max((r["memory"] for r in ranks),
                      key=lambda m: m["optimizer_state_bytes"]),
    }
    with open(args.out, "w") as f:
        json.dump(result, f)
    return 0


# --- the ZeroShard side (runs under deploy/local/cluster.py) ------------------------------------


def zeroshard_client(argv):
    """Subcommand: one job per mode on the cluster that runs it; appends a JSON line per job to
    --results and saves its final parameters as <params_prefix><mode>.npy."""
    import numpy as np

    import safetensors_file

    parser = argparse.ArgumentParser(prog="compare.py zeroshard-client")
    for name in ("--preset", "--modes", "--results", "--params_prefix"):
        parser.add_argument(name, required=True)
    for name in ("--world_size", "--steps", "--warmup"):
        parser.add_argument(name, type=int, required=True)
    args = parser.parse_args(argv)
    cli = [os.environ["ZEROSHARD_CLI"], f"--coordinator={os.environ['ZEROSHARD_COORDINATOR']}"]
    pids = [int(p) for p in os.environ.get("ZEROSHARD_WORKER_PIDS", "").split(",") if p]
    total = args.warmup + args.steps
    for mode in args.modes.split(","):
        submitted = subprocess.run(
            cli + ["submit", f"--name=compare-{args.preset}-{mode}", f"--preset={args.preset}",
                   "--optimizer=adamw", f"--lr={e2e.LR}", f"--mode={mode}",
                   f"--workers={args.world_size}", f"--steps={total}",
                   f"--global_batch={e2e.PER_RANK_BATCH * args.world_size}",
                   f"--dataset_size={e2e.DATASET_SIZE}", f"--seed={e2e.SEED}", "--output=json"],
            capture_output=True, text=True, timeout=60)
        if submitted.returncode != 0:
            raise e2e.BenchError(f"{args.preset} {mode}: submit failed: {submitted.stderr}")
        job_id = json.loads(submitted.stdout)["id"]
        watched = subprocess.run(cli + ["watch", job_id, "--output=json"], capture_output=True,
                                 text=True, timeout=1200)
        progress, _, state, message = e2e.parse_watch_output(watched.stdout.splitlines())
        if watched.returncode != 0 or state != "SUCCEEDED":
            raise e2e.BenchError(f"{job_id} ended {state}: {message} {watched.stderr.strip()}")
        # Each worker resets its peak when a run starts: read right after the job, it is the job's.
        peaks = [e2e.vmhwm_bytes(pid) for pid in pids]
        path = os.path.join(os.environ["ZEROSHARD_LOG_DIR"], f"{job_id}.safetensors")
        exported = subprocess.run(cli + ["export", job_id, f"--output={path}"],
                                  capture_output=True, text=True, timeout=300)
        if exported.returncode != 0:
            raise e2e.BenchError(f"{job_id}: export failed: {exported.stderr.strip()}")
        plan = subprocess.run(cli + ["plan", job_id, "--output=json"], capture_output=True,
                              text=True, timeout=60)
        if plan.returncode != 0:
            raise e2e.BenchError(f"{job_id}: plan failed: {plan.stderr.strip()}")
        formula = json.loads(plan.stdout).get("model_state_formula", {})
        tensors, _ = safetensors_file.read_safetensors(path)
        layers = PRESETS[args.preset]
        flat = np.concatenate([np.frombuffer(tensors[n].data, dtype="<f4")
                               for n in catalog_order(layers)])
        np.save(f"{args.params_prefix}{mode}.npy", flat)
        os.remove(path)
        steps = []
        for step in range(1, total + 1):
            metrics = progress.get(step)
            if metrics is None:
                raise e2e.BenchError(f"{job_id}: no progress for step {step}")
            steps.append({
                "step": step,
                "loss": float(metrics.get("loss", 0.0)),
                "iteration_ms": float(metrics.get("iteration_ms", 0.0)),
                "compute_ms": float(metrics.get("compute_ms", 0.0)),
                "update_ms": float(metrics.get("update_ms", 0.0)),
                "exposed_comm_ms": e2e.zeroshard_exposed_comm_ms(metrics),
            })
        memory = {k: int(v) for k, v in progress[total].get("memory", {}).items()}
        with open(args.results, "a") as f:
            f.write(json.dumps({"variant": f"zeroshard_{mode}", "job_id": job_id, "steps": steps,
                                "peak_rss_bytes_per_rank": peaks, "memory": memory,
                                "model_state_formula": formula}) + "\n")


# --- the driver ----------------------------------------------------------------------------------


def run_torch_variant(args, preset, world_size, variant, scratch):
    out = os.path.join(scratch, f"{variant}.json")
    command = [args.torch_python, os.path.abspath(__file__), "torch-run", f"--preset={preset}",
               f"--variant={variant}", f"--world_size={world_size}",
               f"--steps={args.steps_for[preset]}", f"--warmup={args.warmup}", f"--out={out}",
               f"--params_out={os.path.join(scratch, variant + '.npy')}"]
    env = dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", GLOO_SOCKET_IFNAME="lo")
    if subprocess.run(command, env=env, stdin=subprocess.DEVNULL).returncode != 0:
        raise e2e.BenchError(f"{preset} W={world_size} {variant}: the torch run failed")
    with open(out) as f:
        return json.load(f)


def run_zeroshard(args, preset, world_size, scratch):
    log_dir = os.path.join(scratch, "cluster")
    results = os.path.join(scratch, "zeroshard.jsonl")
    command = [sys.executable, CLUSTER_SCRIPT, f"--workers={world_size}",
               f"--bin_dir={args.bin_dir}", f"--log_dir={log_dir}", "--worker_threads=1", "--",
               sys.executable, os.path.abspath(__file__), "zeroshard-client",
               f"--preset={preset}", f"--modes={','.join(args.zeroshard_modes)}",
               f"--world_size={world_size}", f"--steps={args.steps_for[preset]}",
               f"--warmup={args.warmup}", f"--results={results}",
               f"--params_prefix={os.path.join(scratch, 'zeroshard_')}"]
    status = subprocess.run(command, stdin=subprocess.DEVNULL, stdout=sys.stderr).returncode
    shutil.rmtree(os.path.join(log_dir, "checkpoints"), ignore_errors=True)
    if status != 0:
        raise e2e.BenchError(f"{preset} W={world_size}: the ZeroShard cluster failed (logs in "
                             f"{log_dir})")
    with open(results) as f:
        return [json.loads(line) for line in f if line.strip()]


def ensure_stubs():
    """zeroshard.torch needs the gRPC stubs outside Bazel (docs/pytorch.md). Made every run (it
    takes well under a second): stubs left from an older checkout would miss newer fields."""
    subprocess.run([os.path.join(REPO_ROOT, "python", "generate_stubs.sh"), STUBS_DIR],
                   check=True)


def run_attached(args, preset, world_size):
    """tests/bench/torch_attach.py's ZeroShard variants (torch trainers attached to workers through
    zeroshard.torch) on the preset's widths: its JSON lines. Its trainers draw their own weights
    and data, so only time and memory compare."""
    ensure_stubs()
    command = [args.torch_python, TORCH_ATTACH_SCRIPT,
               f"--layers={','.join(str(w) for w in PRESETS[preset])}",
               f"--workers={world_size}", f"--bin_dir={args.bin_dir}", "--rounds=1",
               f"--steps={args.steps_for[preset]}", f"--warmup={args.warmup}",
               f"--variants={','.join(ATTACHED_VARIANTS)}", "--memory_launches=0"]
    result = subprocess.run(command, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, text=True)
    if result.returncode != 0:
        raise e2e.BenchError(f"{preset} W={world_size}: torch_attach.py failed")
    return [json.loads(line) for line in result.stdout.splitlines() if line.startswith("{")]


def run_training(args, preset, world_size):
    """All five variants of one (preset, W): the raw record, max |Δparam| included."""
    import numpy as np

    # Under /tmp, not a test's long TMPDIR: the workers' unix sockets allow 107-byte paths.
    scratch = tempfile.mkdtemp(prefix=f"zs-compare-{preset}-w{world_size}-", dir="/tmp")
    try:
        load_before = load_averages()
        variants = []
        for variant in TORCH_VARIANTS:
            say(f"{preset} W={world_size} {variant} (load {load_before[0]})")
            variants.append(run_torch_variant(args, preset, world_size, variant, scratch))
        say(f"{preset} W={world_size} zeroshard {','.join(args.zeroshard_modes)}")
        variants += run_zeroshard(args, preset, world_size, scratch)
        attached = []
        if args.attached:
            say(f"{preset} W={world_size} attached torch trainers "
                f"{','.join(ATTACHED_VARIANTS)}")
            attached = run_attached(args, preset, world_size)
        reference = np.load(os.path.join(scratch, f"{REFERENCE_VARIANT}.npy")).astype(np.float64)
        for record in variants:
            params = np.load(os.path.join(scratch, f"{record['variant']}.npy"))
            if params.size != reference.size:
                raise e2e.BenchError(f"{record['variant']}: {params.size} parameters, torch has "
                                     f"{reference.size}")
            record["max_abs_dparam_vs_torch_ddp"] = float(
                np.max(np.abs(params.astype(np.float64) - reference)))
        return {"preset": preset, "world_size": world_size, "layers": PRESETS[preset],
                "params": param_count(PRESETS[preset]), "warmup": args.warmup,
                "per_rank_batch": e2e.PER_RANK_BATCH, "lr": e2e.LR,
                "reference_variant": REFERENCE_VARIANT, "max_abs_param": float(
                    np.max(np.abs(reference))),
                "load_average_before": load_before, "load_average_after": load_averages(),
                "variants": variants, "attached": attached}
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def run_kernels(args):
    """optimizer_bench against torch_adamw.py (its best impl, and foreach too when that is
    fused), alternating for --kernel_rounds rounds: every JSON line."""
    ours_command = [args.optimizer_bench, f"--params={args.kernel_params}", "--reps=5",
                    "--threads=2", "--cases=adamw"]
    torch_command = [args.torch_python, TORCH_ADAMW_SCRIPT, f"--params={args.kernel_params}",
                     "--reps=5", "--threads=1,2"]
    lines = []
    for number in range(args.kernel_rounds):
        say(f"kernels, round {number + 1}/{args.kernel_rounds}")
        lines += compare_torch_adamw.run_json_lines(ours_command)
        best = compare_torch_adamw.run_json_lines(torch_command + ["--impl=auto"])
        lines += best
        # Where this torch has a fused CPU AdamW, its foreach one is timed as well.
        if any(line["impl"] != "foreach" for line in best):
            lines += compare_torch_adamw.run_json_lines(torch_command + ["--impl=foreach"])
    return {"params": args.kernel_params, "rounds": args.kernel_rounds, "lines": lines}


def machine():
    model = "unknown"
    with contextlib.suppress(OSError):
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    return {"cpu_model": model, "cores": os.cpu_count(), "kernel": platform.release()}


def build_binaries():
    say(f"building {' '.join(BUILD_TARGETS)} (bazel build -c opt)")
    if subprocess.run(["bazel", "build", "-c", "opt", *BUILD_TARGETS], cwd=REPO_ROOT).returncode:
        raise e2e.BenchError("the build failed")
    info = subprocess.run(["bazel", "info", "-c", "opt", "bazel-bin"], cwd=REPO_ROOT,
                          capture_output=True, text=True, check=True)
    return info.stdout.strip()


@contextlib.contextmanager
def bench_lock(path):
    """Holds the shared benchmark lock when its file exists; yields whether it did."""
    if not path or not os.path.exists(path):
        yield False
        return
    with open(path) as f:
        say(f"waiting for {path}")
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield True
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def measure(args, raw_dir):
    """Runs everything under the lock; writes raw/*.json."""
    with bench_lock(args.lock) as locked:
        meta = {"machine": machine(), "started": datetime.datetime.now(
            datetime.timezone.utc).isoformat(timespec="seconds"),
            "load_average_before": load_averages(), "lock": args.lock if locked else None,
            "command": " ".join(["tools/compare.py", *args.argv])}
        files = []
        for preset in args.presets:
            for world_size in args.world_sizes:
                record = run_training(args, preset, world_size)
                name = f"train-{preset}-w{world_size}.json"
                write_json(os.path.join(raw_dir, name), record)
                files.append(name)
        kernels = run_kernels(args)
        write_json(os.path.join(raw_dir, "kernels.json"), kernels)
        files.append("kernels.json")
        meta["load_average_after"] = load_averages()
    torch_info = subprocess.run(
        [args.torch_python, "-c", "import sys, json, torch; sys.path.insert(0, sys.argv[1]); "
         "import torch_adamw; print(json.dumps({'version': torch.__version__, "
         "'fused_cpu_adamw': torch_adamw.fused_cpu_adamw_works(torch)}))",
         os.path.join(REPO_ROOT, "tests", "bench")], capture_output=True, text=True, check=True)
    meta["torch"] = dict(json.loads(torch_info.stdout.strip().splitlines()[-1]),
                         python=args.torch_python)
    meta["raw_files"] = files
    write_json(os.path.join(raw_dir, "meta.json"), meta)


def write_json(path, value):
    with open(path, "w") as f:
        json.dump(value, f, indent=1)
        f.write("\n")


# --- the report (from raw/*.json only) ----------------------------------------------------------


def measured(variant, warmup):
    return variant["steps"][warmup:]


def median_of(variant, warmup, key):
    return statistics.median(step[key] for step in measured(variant, warmup))


def comm_of(step):
    """Communication the iteration waits for, on either side."""
    return step.get("exposed_comm_ms", step.get("comm_after_backward_ms", 0.0))


def training_row(run, variant):
    """The report's figures for one variant of one (preset, W)."""
    warmup = run["warmup"]
    steps = measured(variant, warmup)
    iteration = statistics.median(s["iteration_ms"] for s in steps)
    peaks = variant["peak_rss_bytes_per_rank"]
    return {
        "iteration_ms": iteration,
        "compute_ms": statistics.median(s["compute_ms"] for s in steps),
        "comm_ms": statistics.median(comm_of(s) for s in steps),
        "update_ms": statistics.median(s["update_ms"] for s in steps),
        "peak_rss_mib": max(peaks) / MIB,
        "formula_mib": formula_bytes(variant, run) / MIB,
        "state_mib": variant["memory"].get("optimizer_state_bytes", 0) / MIB,
        "final_loss": variant["steps"][-1]["loss"],
        "max_dparam": variant["max_abs_dparam_vs_torch_ddp"],
    }


def kernel_rows(kernels):
    """(side, threads) -> median GB/s over rounds; sides: zeroshard, baseline, torch_<impl>."""
    values = {}
    for line in kernels["lines"]:
        if line["bench"] == "optimizer":
            values.setdefault(("zeroshard", line["threads"]), []).append(line["gbps"])
            values.setdefault(("baseline", line["threads"]), []).append(line["baseline_gbps"])
        else:
            values.setdefault((f"torch_{line['impl']}", line["threads"]), []).append(line["gbps"])
    return {key: statistics.median(v) for key, v in values.items()}


def plot_all(runs, kernels, out_dir):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colors = {"torch_ddp": "#d62728", "torch_zero": "#ff7f0e", "zeroshard_ddp": "#1f77b4",
              "zeroshard_zero1": "#2ca02c", "zeroshard_zero2": "#9467bd",
              "zeroshard_zero3": "#8c564b"}
    # The curves lie on top of each other: dashes keep each one visible.
    styles = {"torch_ddp": "-", "torch_zero": (0, (6, 3)), "zeroshard_ddp": (0, (3, 3)),
              "zeroshard_zero1": (0, (1, 2)), "zeroshard_zero2": (0, (6, 2, 1, 2)),
              "zeroshard_zero3": (0, (2, 1))}
    columns = len(runs)

    figure, axes = plt.subplots(1, columns, figsize=(4.2 * columns, 3.4), squeeze=False)
    for axis, run in zip(axes[0], runs):
        for variant in run["variants"]:
            steps = [s["step"] for s in variant["steps"]]
            losses = [s["loss"] for s in variant["steps"]]
            axis.plot(steps, losses, label=f"{variant['variant']} "
                      f"(max|Δp| {variant['max_abs_dparam_vs_torch_ddp']:.1e})",
                      color=colors[variant["variant"]], linewidth=1,
                      linestyle=styles[variant["variant"]])
        axis.set_yscale("log")
        axis.set_title(f"{run['preset']}, W = {run['world_size']}", fontsize=9)
        axis.set_xlabel("step", fontsize=8)
        axis.legend(fontsize=6)
    axes[0][0].set_ylabel("loss (global batch)", fontsize=8)
    save(figure, os.path.join(out_dir, "loss.png"))

    def memory_parts(run, variant):
        memory = variant["memory"]
        counted = sum(memory.get(c, 0) for c in MEMORY_CATEGORIES[:3])
        # ZeroShard's MemoryBreakdown also counts buckets, staging and the workload.
        other = max(0, memory.get("total_bytes", counted) - counted)
        return [(category, memory.get(category, 0) / MIB, color)
                for category, color in (("params_bytes", "#4c72b0"), ("grads_bytes", "#55a868"),
                                        ("optimizer_state_bytes", "#c44e52"))] + [
            ("other_bytes", other / MIB, "#8c8c8c")]

    def peak_rss_dots(axis, index, run, variant):
        for rank, peak in enumerate(variant["peak_rss_bytes_per_rank"]):
            axis.plot(index - 0.25 + 0.5 * rank / max(1, run["world_size"] - 1), peak / MIB,
                      "k.", markersize=4, label="peak RSS per rank" if index == rank == 0
                      else None)

    plot_stacked_bars(
        plt, runs, memory_parts,
        lambda run, variant: (training_row(run, variant)["formula_mib"], "ZeRO formula",
                              {"linestyle": "--", "linewidth": 1}),
        "MiB per rank", os.path.join(out_dir, "memory.png"), decorate=peak_rss_dots)

    def iteration_parts(run, variant):
        row = training_row(run, variant)
        other = max(0.0, row["iteration_ms"] - row["compute_ms"] - row["comm_ms"]
                    - row["update_ms"])
        return [("compute", row["compute_ms"], "#4c72b0"),
                ("exposed comm", row["comm_ms"], "#dd8452"),
                ("update", row["update_ms"], "#55a868"), ("other", other, "#8c8c8c")]

    # Medians of the parts need not add up to the iteration's median.
    plot_stacked_bars(
        plt, runs, iteration_parts,
        lambda run, variant: (training_row(run, variant)["iteration_ms"], "iteration (median)",
                              {"linewidth": 1.5}),
        "ms per iteration (median)", os.path.join(out_dir, "iteration.png"))

    rows = kernel_rows(kernels)
    sides = sorted({side for side, _ in rows}, key=lambda s: (s != "zeroshard", s))
    threads = sorted({t for _, t in rows})
    figure, axis = plt.subplots(figsize=(5, 3.2))
    width = 0.8 / len(sides)
    for number, side in enumerate(sides):
        axis.bar([t + number * width for t in range(len(threads))],
                 [rows.get((side, t), 0.0) for t in threads], width=width, label=side)
    axis.set_xticks([t + 0.4 - width / 2 for t in range(len(threads))])
    axis.set_xticklabels([f"{t} thread(s)" for t in threads], fontsize=8)
    axis.set_ylabel("GB/s (28 bytes a parameter)", fontsize=8)
    axis.set_title(f"AdamW fp32, {kernels['params']:,} parameters", fontsize=9)
    axis.legend(fontsize=7)
    save(figure, os.path.join(out_dir, "kernels.png"))


def plot_stacked_bars(plt, runs, parts, marker, ylabel, path, decorate=None):
    """One panel per (preset, W) run: a stacked bar per variant from parts(run, variant) ->
    [(label, value, color)], a black line across it at marker(run, variant) -> (value, label,
    line style), and decorate(axis, index, run, variant) for anything more."""
    figure, axes = plt.subplots(1, len(runs), figsize=(4.2 * len(runs), 3.6), squeeze=False)
    for axis, run in zip(axes[0], runs):
        names = [v["variant"] for v in run["variants"]]
        for index, variant in enumerate(run["variants"]):
            bottom = 0.0
            for label, value, color in parts(run, variant):
                axis.bar(index, value, bottom=bottom, color=color, width=0.6,
                         label=label if index == 0 else None)
                bottom += value
            if decorate is not None:
                decorate(axis, index, run, variant)
            value, label, style = marker(run, variant)
            axis.plot([index - 0.35, index + 0.35], [value] * 2, color="black",
                      label=label if index == 0 else None, **style)
        axis.set_xticks(range(len(names)))
        axis.set_xticklabels([n.replace("zeroshard_", "zs_") for n in names], rotation=30,
                             fontsize=7)
        axis.set_title(f"{run['preset']}, W = {run['world_size']}", fontsize=9)
        axis.legend(fontsize=6)
    axes[0][0].set_ylabel(ylabel, fontsize=8)
    save(figure, path)


def save(figure, path):
    figure.tight_layout()
    figure.savefig(path, dpi=72)
    import matplotlib.pyplot as plt

    plt.close(figure)


def fmt(value):
    """The report's number format: 3 significant digits, whole numbers from 100 up (within 0.5%
    either way; the test reads them back)."""
    if abs(value) >= 100:
        return f"{value:.0f}"
    return f"{value:.3g}"


def write_report(raw_dir, out_path):
    with open(os.path.join(raw_dir, "meta.json")) as f:
        meta = json.load(f)
    runs = []
    for name in meta["raw_files"]:
        with open(os.path.join(raw_dir, name)) as f:
            (runs.append(json.load(f)) if name.startswith("train-") else None)
    with open(os.path.join(raw_dir, "kernels.json")) as f:
        kernels = json.load(f)
    out_dir = os.path.dirname(os.path.abspath(out_path))
    plot_all(runs, kernels, out_dir)
    torch_info = meta["torch"]
    fused = "available" if torch_info["fused_cpu_adamw"] else "not available (foreach only)"
    lines = [
        "# ZeroShard against PyTorch on this machine",
        "",
        f"Made by `{meta['command']}` ({meta['started']}); every figure comes from that run, "
        "saved as raw JSON in [raw/](raw/).",
        "",
        f"- Machine: {meta['machine']['cpu_model']}, {meta['machine']['cores']} cores "
        f"(Linux {meta['machine']['kernel']}).",
        f"- Load average (1, 5, 15 min): {meta['load_average_before']} before, "
        f"{meta['load_average_after']} after.",
        f"- torch {torch_info['version']} ({torch_info['python']}); fused CPU AdamW {fused}.",
        "- Ran under `flock " + meta["lock"] + "`." if meta["lock"] else
        "- Ran without the benchmark lock (no lock file).",
        "",
        "Every variant trains the same model from the same initial weights on the same batches "
        "(docs/workloads.md's generator), AdamW lr "
        f"{runs[0]['lr'] if runs else ''}, {e2e.PER_RANK_BATCH} samples per rank, one thread "
        "per rank, gloo on loopback. Times are medians over the iterations after "
        f"{runs[0]['warmup'] if runs else ''} warm-up ones, the slowest rank's per iteration "
        "(torch) or rank 0's StepMetrics (ZeroShard). Memory: peak RSS (VmHWM) of each rank's "
        "process (the torch rank, or the ZeroShard worker), the categories torch's tensors or "
        "the worker's MemoryBreakdown count, and the ZeRO formula for fp32 AdamW "
        "(4Ψ parameters + 4Ψ gradients + 8Ψ optimizer state, divided by W where sharded, "
        "plus zero3's gather pool; "
        "torch's ZeroRedundancyOptimizer shards the state only). max |Δparam| is the largest "
        "difference of the final parameters from torch DDP's. The variants of one (preset, W) "
        "run one after another in one round (torch DDP, torch ZeRO, ZeroShard ddp, zero1, "
        "zero2, zero3, then the attached trainers), so a load that changes during the run falls "
        "unevenly on them: compare within a column and read the load averages.",
        "",
        "## Training",
        "",
        "![loss](loss.png)",
        "",
        "![memory per rank](memory.png)",
        "",
        "![iteration time](iteration.png)",
        "",
        "| preset | W | variant | iteration ms | compute ms | exposed comm ms | update ms | "
        "peak RSS MiB (largest rank) | formula MiB | optimizer state MiB | final loss | "
        "max abs dparam vs torch_ddp |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for run in runs:
        for variant in run["variants"]:
            row = training_row(run, variant)
            lines.append(
                f"| {run['preset']} | {run['world_size']} | {variant['variant']} | "
                f"{fmt(row['iteration_ms'])} | {fmt(row['compute_ms'])} | {fmt(row['comm_ms'])} | "
                f"{fmt(row['update_ms'])} | {fmt(row['peak_rss_mib'])} | "
                f"{fmt(row['formula_mib'])} | {fmt(row['state_mib'])} | "
                f"{fmt(row['final_loss'])} | {fmt(row['max_dparam'])} |")
    optimizers = "; ".join(sorted({f"{v['variant']}: {v['optimizer']}" for run in runs
                                   for v in run["variants"] if v["variant"].startswith("torch_")}))
    largest = ", ".join(f"{run['preset']} W = {run['world_size']}: {fmt(run['max_abs_param'])}"
                        for run in runs)
    lines += ["", f"Torch's optimizers: {optimizers}. torch DDP all-reduces inside backward, "
              "so its communication is counted in compute; torch_zero's exposed communication is "
              "its step() beyond the inner AdamW (the parameter broadcasts). ZeroShard's is what "
              "the iteration waits for outside its update (tests/bench/e2e_vs_torch.py's "
              f"`zeroshard_exposed_comm_ms`). Largest |parameter| of torch DDP's final model: "
              f"{largest}.", ""]
    attached = [(run, line) for run in runs for line in run.get("attached", [])]
    if attached:
        lines += [
            "## Attached PyTorch trainers",
            "",
            "tests/bench/torch_attach.py on the same widths: torch computes forward and backward, "
            "zeroshard.torch's ShardedOptimizer hands the gradients to this rank's worker. Its "
            "trainers draw their own weights and data, so only time and memory compare. Memory "
            "is the largest rank's peak PSS of trainer and worker together.",
            "",
            "| preset | W | variant | iteration ms | step ms | peak PSS MiB |",
            "|---|---|---|---|---|---|",
        ]
        for run, line in attached:
            lines.append(f"| {run['preset']} | {run['world_size']} | attached_{line['variant']} | "
                         f"{fmt(line['iter_ms'])} | {fmt(line['step_ms'])} | "
                         f"{fmt(line['peak_rss_bytes'] / MIB)} |")
        lines.append("")
    rows = kernel_rows(kernels)
    lines += [
        "## Optimizer kernel",
        "",
        f"AdamW fp32 on {kernels['params']:,} parameters, {kernels['rounds']} alternating "
        "round(s) of tests/bench:optimizer_bench (ZeroShard's fused kernel and the machine's "
        "bandwidth baseline: one pass with the same reads and writes) and "
        "tests/bench/torch_adamw.py; medians over rounds.",
        "",
        "![kernels](kernels.png)",
        "",
        "| side | threads | GB/s |",
        "|---|---|---|",
    ]
    for (side, threads), gbps in sorted(rows.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        lines.append(f"| {side} | {threads} | {fmt(gbps)} |")
    lines.append("")
    with open(out_path, "w") as f:
        f.write("\n".join(lines))


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--presets", default="seed,medium")
    parser.add_argument("--world_sizes", default="2,4")
    parser.add_argument("--steps", type=int, default=None,
                        help="measured iterations per variant (default: seed 40, medium 10)")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--zeroshard_modes", default=",".join(ZEROSHARD_MODES),
                        help="the ZeroShard modes to run, comma-separated (default: all)")
    parser.add_argument("--out", default=os.path.join(REPO_ROOT, "report", "report.md"))
    parser.add_argument("--torch_python", default=e2e.DEBIAN_PYTHON)
    parser.add_argument("--bin_dir", default=None,
                        help="the bazel-bin holding the ZeroShard binaries and optimizer_bench "
                             "(default: bazel build -c opt them)")
    parser.add_argument("--attached", action=argparse.BooleanOptionalAction, default=True,
                        help="also time torch trainers attached through zeroshard.torch "
                             "(tests/bench/torch_attach.py)")
    parser.add_argument("--kernel_params", type=int, default=16 << 20)
    parser.add_argument("--kernel_rounds", type=int, default=3)
    parser.add_argument("--from_raw", action="store_true",
                        help="measure nothing: write the report and plots again from the raw "
                             "JSON beside --out")
    parser.add_argument("--lock", default="/tmp/zs/bench.lock",
                        help="held for the whole run when the file exists ('' for none)")
    args = parser.parse_args(argv)
    args.argv = argv
    args.presets = [p for p in args.presets.split(",") if p]
    args.world_sizes = [int(w) for w in args.world_sizes.split(",") if w]
    for preset in args.presets:
        if preset not in PRESETS:
            parser.error(f"--presets: unknown preset '{preset}'")
    if any(w < 2 for w in args.world_sizes):
        parser.error("--world_sizes: at least 2")
    args.zeroshard_modes = [m for m in args.zeroshard_modes.split(",") if m]
    for mode in args.zeroshard_modes:
        if mode not in ZEROSHARD_MODES:
            parser.error(f"--zeroshard_modes: unknown mode '{mode}'; known: "
                         f"{', '.join(ZEROSHARD_MODES)}")
    if args.warmup < 1 or (args.steps is not None and args.steps < 1):
        parser.error("--warmup and --steps: at least 1")
    args.steps_for = {p: args.steps or DEFAULT_STEPS[p] for p in PRESETS}
    return args


def main(argv):
    if argv[:1] == ["torch-run"]:
        return torch_run(argv[1:])
    if argv[:1] == ["zeroshard-client"]:
        zeroshard_client(argv[1:])
        return 0
    args = parse_args(argv)
    out_dir = os.path.dirname(os.path.abspath(args.out))
    raw_dir = os.path.join(out_dir, "raw")
    if not args.from_raw:
        args.bin_dir = args.bin_dir or build_binaries()
        args.optimizer_bench = os.path.join(args.bin_dir, "tests", "bench", "optimizer_bench")
        os.makedirs(raw_dir, exist_ok=True)
        measure(args, raw_dir)
    write_report(raw_dir, args.out)
    say(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except (e2e.BenchError, subprocess.CalledProcessError, subprocess.TimeoutExpired) as e:
        say(f"error: {e}")
        sys.exit(1)
