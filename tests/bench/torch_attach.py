#!/usr/bin/env python3
"""Attached PyTorch trainers against torch's own data-parallel optimizers (figures in
docs/performance/torch_attach.md).

    /usr/bin/python3 tests/bench/torch_attach.py --bin_dir "$(bazel info -c opt bazel-bin)"
    /opt/zs-torch/bin/python tests/bench/torch_attach.py --model=gpt --bin_dir ...  # FSDP2 vs zero3

Not a test, and not run in CI (//tests/bench:torch_attach_test runs it with tiny sizes). Run
without ZEROSHARD_RANK in the environment, it is the driver: it starts itself under
`python3 -m zeroshard.launch --workers W` on a fresh local cluster (needs the three binaries of
`bazel build -c opt //apps/coordinator:zeroshard-coordinator //worker:zeroshard-worker
//client:zeroshard` and the stubs of `python/generate_stubs.sh python/zeroshard/_proto`). Under
the launcher, each process is one rank's trainer: the same model, seeded alike on every rank
(--model mlp, the default: 1024-4096-4096-1024, ReLU, MSE loss, 32 samples per rank; --model
gpt: a nanoGPT-style transformer, 8 blocks of width 512, vocabulary 8192, 2 sequences of 64
tokens per rank, cross-entropy on random tokens, lm_head tied to the token embedding), one
thread, trained with AdamW in these ways (--variants; mlp's default the first four without
torch_fsdp2, gpt's torch_fsdp2 and zeroshard_zero3), in --rounds rounds (the variants' order
reversed every other round), each run --warmup + --steps + --memory_steps iterations:
  torch_ddp        torch DDP (gloo, gradient_as_bucket_view) + the best AdamW this torch takes
                   (fused, else foreach, else the loop);
  torch_zero       torch DDP + ZeroRedundancyOptimizer(that AdamW);
  torch_fsdp2      FSDP2: fully_shard on every block (mlp: every Linear) and on the root (gloo,
                   CPU mesh, default reshard_after_forward) + the best AdamW that steps its
                   DTensors (each candidate tried on a small DTensor first); needs torch >= 2.4;
  zeroshard_ddp    zt.ShardedOptimizer(mode="ddp"), attached to this rank's worker;
  zeroshard_zero2  zt.ShardedOptimizer(mode="zero2");
  zeroshard_zero3  zt.ShardedOptimizer(mode="zero3") (the parameters sharded too).
When torch_fsdp2 and zeroshard_zero3 both ran, the driver prints a last line
  {"bench":"torch_attach","compare":"zero3_vs_fsdp2","iter_ratio","pss_ratio","loss_fsdp2",
   "loss_zero3","loss_max_rel_diff",...}: zero3 / FSDP2 of iter_ms and of peak_rss_bytes, and
both final losses (rank 0's batch; every iteration's in each line's losses_rank0).

Rank 0 prints one JSON line per variant:
  {"bench":"torch_attach","variant","iter_ms","limit_ms","over_limit","step_ms","peak_rss_bytes",
   "opt_state_bytes_per_rank", ...}
iter_ms: forward + backward + step() + zero_grad(), the slowest rank's per iteration; step_ms:
step() alone. limit_ms: the variant's own forward + backward + update with communication
skipped, every rank at once, after the variant's run (--limit_steps iterations): torch's
DDP and ZeRO run no_sync forward + backward and the update of the rank's own shard (the inner
optimizer of ZeroRedundancyOptimizer, no broadcast); FSDP2 forward + backward of a plain copy of
the model and the same AdamW's update of plain tensors shaped as the rank's shards; ZeroShard's
run forward + backward of a plain copy of the model (no hooks, no hand-over) plus the update_ms
its worker reported in the run (the update of its shard, which involves no communication).
over_limit = iter_ms / limit_ms.
The times are medians over the measured iterations of a round, then the median over rounds
(per-round values in *_rounds). peak_rss_bytes: each rank's memory is the sum of the PSS
(/proc/PID/smaps_rollup) of its trainer and, for ZeroShard, its worker daemon, sampled every
--sample_ms by a thread of the trainer during the warm-up and the --memory_steps iterations after
the measured ones (not during those: a sample costs milliseconds of CPU); the field is the
largest rank's peak sample (median over rounds), measured by default (--memory_launches 1) in a
launch of its own per variant after the timing launch, so that no variant's trainer carries what
the others left in its process (the timing launch's figure is peak_rss_bytes_in_run).
opt_state_bytes_per_rank: torch: the bytes of the optimizer's state tensors on the rank that
holds the most (ZeroRedundancyOptimizer: its shard; FSDP2: its DTensors' local shards);
ZeroShard: the worker's own count (StepMetrics.memory.optimizer_state_bytes of rank 0, whose
pieces are as large as every rank's).
"""

import argparse
import contextlib
import ctypes
import gc
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
VARIANTS = ["torch_ddp", "torch_zero", "torch_fsdp2", "zeroshard_ddp", "zeroshard_zero2",
            "zeroshard_zero3"]
# What --variants runs when not given, per --model.
DEFAULT_VARIANTS = {"mlp": ["torch_ddp", "torch_zero", "zeroshard_ddp", "zeroshard_zero2"],
                    "gpt": ["torch_fsdp2", "zeroshard_zero3"]}
# The variants the compare line (issue 39's target) sets against each other: zero3 / FSDP2.
COMPARED = ("zeroshard_zero3", "torch_fsdp2")
LEARNING_RATE = 1e-3
WEIGHT_DECAY = 0.01  # torch's AdamW default, on every tensor
# Distinct batches each rank cycles through (made before timing starts).
BATCHES = 4
# How long rank 0 waits for its worker's first memory report of a ZeroShard run, and a rank for
# its worker to be idle again after one.
REPORT_TIMEOUT_S = 30.0
# smaps_rollup's parts of Pss (Pss_Anon, ...).
PSS_KINDS = ("Anon", "File", "Shmem")
IDLE_TIMEOUT_S = 60.0


def parse_args(argv):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="mlp", choices=["mlp", "gpt"],
                        help="mlp: --layers, MSE loss; gpt: a nanoGPT-style transformer "
                        "(--blocks, --d_model, --heads, --vocab, --seq), cross-entropy on random "
                        "tokens, lm_head tied to the token embedding")
    parser.add_argument("--layers", default="1024,4096,4096,1024",
                        help="mlp: the widths, comma-separated")
    parser.add_argument("--blocks", type=int, default=8, help="gpt: transformer blocks")
    parser.add_argument("--d_model", type=int, default=512, help="gpt: embedding width")
    parser.add_argument("--heads", type=int, default=8, help="gpt: attention heads")
    parser.add_argument("--vocab", type=int, default=8192, help="gpt: vocabulary size")
    parser.add_argument("--seq", type=int, default=64, help="gpt: tokens per sequence")
    parser.add_argument("--batch", type=int, default=None,
                        help="samples (gpt: sequences) per rank (default: mlp 32, gpt 2)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=20,
                        help="measured iterations of each variant in each round")
    parser.add_argument("--warmup", type=int, default=3,
                        help="iterations before the measured ones, in every round")
    parser.add_argument("--variants", default=None,
                        help=f"comma-separated, of {', '.join(VARIANTS)} (default: mlp "
                        f"{','.join(DEFAULT_VARIANTS['mlp'])}; gpt "
                        f"{','.join(DEFAULT_VARIANTS['gpt'])})")
    parser.add_argument("--torch_adamw", default="auto", choices=["auto", "fused", "foreach",
                                                                   "loop"],
                        help="torch's AdamW: auto takes fused, else foreach, else the loop")
    parser.add_argument("--overlap_all_gather", action=argparse.BooleanOptionalAction, default=True,
                        help="ZeroShard's variants: zt.ShardedOptimizer(overlap_all_gather=...); "
                        "--no-overlap_all_gather makes step() wait for the whole all-gather")
    parser.add_argument("--limit_steps", type=int, default=10,
                        help="iterations without communication after each variant's run, in "
                        "every round (limit_ms)")
    parser.add_argument("--memory_steps", type=int, default=5,
                        help="iterations after the measured ones, in every round: PSS is sampled "
                        "during the warm-up and these, not during the measured iterations")
    parser.add_argument("--sample_ms", type=float, default=50.0, help="PSS sampling period")
    parser.add_argument("--memory_launches", type=int, default=1, choices=[0, 1],
                        help="driver: 1 (default) measures each variant's memory again in a "
                        "launch of its own (fresh trainer processes, one round of --warmup + "
                        "--memory_launch_steps + --memory_steps iterations) and reports that as "
                        "peak_rss_bytes; the in-run figure stays in peak_rss_bytes_in_run")
    parser.add_argument("--memory_launch_steps", type=int, default=5,
                        help="driver: measured iterations of each memory launch")
    parser.add_argument("--workers", type=int, default=2, help="driver: ranks (W)")
    parser.add_argument("--bin_dir", default=None,
                        help="driver: the -c opt binaries (default: `bazel info -c opt "
                        "bazel-bin` in this checkout)")
    parser.add_argument("--log_dir", default=None,
                        help="driver: the cluster's logs and attach sockets (keep it short; "
                        "default: a new /tmp/zs-ta-* directory)")
    args = parser.parse_args(argv)
    args.layers = [int(width) for width in args.layers.split(",")]
    if args.batch is None:
        args.batch = {"mlp": 32, "gpt": 2}[args.model]
    if args.variants is None:
        args.variants = DEFAULT_VARIANTS[args.model]
    else:
        args.variants = [v for v in args.variants.split(",") if v]
    unknown = [v for v in args.variants if v not in VARIANTS]
    if unknown or not args.variants:
        parser.error(f"--variants: {unknown or 'none'}; choose from {', '.join(VARIANTS)}")
    if len(args.layers) < 2 or min(args.layers) < 1:
        parser.error("--layers: at least two positive widths")
    if min(args.blocks, args.d_model, args.heads, args.vocab, args.seq) < 1:
        parser.error("--blocks, --d_model, --heads, --vocab and --seq must be >= 1")
    if args.d_model % args.heads:
        parser.error(f"--d_model ({args.d_model}) must be a multiple of --heads ({args.heads})")
    if (args.rounds < 1 or args.steps < 1 or args.batch < 1 or args.memory_steps < 1
            or args.limit_steps < 1):
        parser.error("--rounds, --steps, --memory_steps, --limit_steps and --batch must be >= 1")
    if args.warmup < 0:
        parser.error("--warmup must be >= 0")
    return args


# --- the driver ---------------------------------------------------------------------------------


def drive(args, argv):
    """Starts this script's ranks under zeroshard.launch on a fresh local cluster; then, with
    --memory_launches, each variant alone in a launch of its own for its memory."""
    bin_dir = args.bin_dir
    if bin_dir is None:
        bin_dir = subprocess.run(["bazel", "info", "-c", "opt", "bazel-bin"], cwd=REPO_ROOT,
                                 check=True, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                 text=True).stdout.strip()
    log_dir = args.log_dir or tempfile.mkdtemp(prefix="zs-ta-", dir="/tmp")
    env = dict(os.environ)
    env.pop("ZEROSHARD_COORDINATOR", None)  # a cluster of its own: nothing else on the workers
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in [os.path.join(REPO_ROOT, "python"), env.get("PYTHONPATH", "")] if p)
    env["OMP_NUM_THREADS"] = "1"
    env["GLOO_SOCKET_IFNAME"] = "lo"
    # Every argument but the driver's own goes to the trainers.
    driver_flags = ("--workers", "--bin_dir", "--log_dir", "--memory_launches",
                    "--memory_launch_steps")
    trainer_argv = []
    skip = False
    for arg in argv:
        if skip:
            skip = False
            continue
        name = arg.split("=", 1)[0]
        if name in driver_flags:
            skip = "=" not in arg
            continue
        trainer_argv.append(arg)

    def launch(launch_log_dir, extra_argv):
        """One launch on a cluster of its own: (exit status, its JSON lines). Other stdout lines
        (the cluster's) are passed through."""
        command = [sys.executable, "-m", "zeroshard.launch", "--workers", str(args.workers),
                   "--bin_dir", bin_dir, "--log_dir", launch_log_dir, os.path.abspath(__file__)]
        print(f"torch_attach: {' '.join(command + trainer_argv + extra_argv)} "
              f"(logs in {launch_log_dir})", file=sys.stderr, flush=True)
        result = subprocess.run(command + trainer_argv + extra_argv, env=env,
                                stdout=subprocess.PIPE, text=True)
        lines = []
        for line in result.stdout.splitlines():
            if line.startswith("{"):
                lines.append(json.loads(line))
            else:
                print(line, flush=True)
        return result.returncode, lines

    def print_lines(lines):
        for line in lines:
            print(json.dumps(line), flush=True)
        compared = compare_line(lines)
        if compared is not None:
            print(json.dumps(compared), flush=True)

    status, lines = launch(log_dir, [])
    if status != 0 or not args.memory_launches:
        print_lines(lines)
        return status
    # A trainer that ran the other variants first keeps some of their memory (allocator caches,
    # torch's and gloo's buffers): what one variant needs is measured in fresh processes.
    for index, line in enumerate(lines):
        memory_status, memory_lines = launch(
            os.path.join(log_dir, f"m{index}"),
            ["--variants", line["variant"], "--rounds", "1", "--steps",
             str(args.memory_launch_steps)])
        if memory_status != 0 or len(memory_lines) != 1:
            print(f"torch_attach: the memory launch of {line['variant']} failed "
                  f"(exit {memory_status})", file=sys.stderr, flush=True)
            return memory_status or 1
        alone = memory_lines[0]
        line["peak_rss_bytes_in_run"] = line["peak_rss_bytes"]
        line["peak_rss_bytes"] = alone["peak_rss_bytes"]
        line["memory_launch"] = {key: alone[key] for key in (
            "peak_pss_by_rank_rounds", "peak_pss_parts_by_rank_rounds",
            "peak_pss_kinds_by_rank_rounds", "pss_at_start_parts_by_rank_rounds",
            "load_average_rounds")
            if key in alone}
    print_lines(lines)
    return 0


def compare_line(lines):
    """Issue 39's comparison, when both ran: zero3 / FSDP2 of iter_ms and peak_rss_bytes (each
    rank's trainer + worker PSS against FSDP2's trainer), and both final losses; None otherwise."""
    by_variant = {line["variant"]: line for line in lines}
    if not all(v in by_variant for v in COMPARED):
        return None
    zero3, fsdp2 = (by_variant[v] for v in COMPARED)
    loss_zero3 = median(zero3["final_loss_rounds"])
    loss_fsdp2 = median(fsdp2["final_loss_rounds"])
    steps = list(zip(zero3["losses_rank0"], fsdp2["losses_rank0"]))
    return {
        "bench": "torch_attach", "compare": "zero3_vs_fsdp2",
        "iter_ratio": round(zero3["iter_ms"] / fsdp2["iter_ms"], 3),
        "pss_ratio": round(zero3["peak_rss_bytes"] / fsdp2["peak_rss_bytes"], 3),
        "iter_ms_zero3": zero3["iter_ms"], "iter_ms_fsdp2": fsdp2["iter_ms"],
        "peak_rss_bytes_zero3": zero3["peak_rss_bytes"],
        "peak_rss_bytes_fsdp2": fsdp2["peak_rss_bytes"],
        "loss_fsdp2": loss_fsdp2, "loss_zero3": loss_zero3,
        # Rank 0's loss per iteration of the first round, the largest relative difference.
        "loss_max_rel_diff": round(max(abs(a - b) / max(abs(b), 1e-12) for a, b in steps), 6)
        if steps else None,
        "targets": {"iter_ratio": 0.7, "pss_ratio": 0.9},
        "fsdp2_optimizer": fsdp2["optimizer"],
        "model": zero3["model"], "world_size": zero3["world_size"],
    }


# --- memory -------------------------------------------------------------------------------------


def smaps_rollup(pid):
    """{"Pss": bytes, "Rss": bytes, ...} of /proc/PID/smaps_rollup."""
    values = {}
    with open(f"/proc/{pid}/smaps_rollup") as f:
        for line in f:
            parts = line.split()
            if len(parts) == 3 and parts[2] == "kB":
                values[parts[0].rstrip(":")] = int(parts[1]) * 1024
    return values


def worker_pid(attach_socket):
    """The worker daemon serving `attach_socket`: the process started with
    --attach_socket=<it>."""
    wanted = f"--attach_socket={attach_socket}"
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                args = f.read().decode(errors="replace").split("\0")
        except OSError:
            continue
        if wanted in args or any(a == "--attach_socket" and b == attach_socket
                                 for a, b in zip(args, args[1:])):
            return int(entry)
    raise RuntimeError(f"no process was started with {wanted}")


class PssSampler:
    """Samples the summed PSS of `pids` every `period_s` on a thread of its own while active, and
    keeps the largest sample. Reading smaps_rollup walks a process's page tables (about 10 ms of
    CPU for 300 MB resident here), so the timed iterations run paused. Thread contract: start(),
    pause(), resume() and stop() from one thread; the results after stop()."""

    def __init__(self, pids, period_s):
        self._pids = list(pids)
        self._period_s = period_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._mu = threading.Lock()
        self._active = True  # guarded by _mu, which a sample holds throughout
        self.samples = 0
        self.sample_seconds = 0.0  # wall time spent reading smaps_rollup
        self.peak_total = 0
        self.peak_parts = []  # each pid's PSS at the peak sample
        self.peak_rss_parts = []  # each pid's RSS at the peak sample
        # Each pid's PSS at the peak sample by kind: anonymous (heap), file (libraries), shmem
        # (the worker's shared blocks, mapped by both).
        self.peak_kinds_parts = []

    def _sample(self):
        start = time.perf_counter()
        rollups = [smaps_rollup(pid) for pid in self._pids]
        self.sample_seconds += time.perf_counter() - start
        total = sum(r["Pss"] for r in rollups)
        self.samples += 1
        if total > self.peak_total:
            self.peak_total = total
            self.peak_parts = [r["Pss"] for r in rollups]
            self.peak_rss_parts = [r["Rss"] for r in rollups]
            self.peak_kinds_parts = [{kind: r[f"Pss_{kind}"] for kind in PSS_KINDS
                                      if f"Pss_{kind}" in r} for r in rollups]

    def _run(self):
        while not self._stop.wait(self._period_s):
            with self._mu:
                if self._active:
                    self._sample()

    def start(self):
        self._sample()
        self._thread.start()

    def pause(self):
        """Returns once no sample is in progress; none starts until resume()."""
        with self._mu:
            self._active = False

    def resume(self):
        with self._mu:
            self._active = True

    def stop(self):
        self._stop.set()
        self._thread.join()
        self._sample()


def return_freed_memory():
    """Gives the heap's freed pages back to the kernel, so that one variant's leftovers do not
    count towards the next one's PSS."""
    gc.collect()
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)


# --- the trainer --------------------------------------------------------------------------------


def median(values):
    return statistics.median(values) if values else None


def build_model(torch, args):
    """The --model, seeded: the same initial model on every rank and in every variant (DDP and
    FSDP2 need it; the job takes rank 0's)."""
    torch.manual_seed(0)
    if args.model == "gpt":
        return build_gpt(torch, args)
    return build_mlp(torch, args.layers)


def build_mlp(torch, layers):
    modules = []
    for index in range(len(layers) - 1):
        modules.append(torch.nn.Linear(layers[index], layers[index + 1]))
        if index + 2 < len(layers):
            modules.append(torch.nn.ReLU())
    return torch.nn.Sequential(*modules)


def build_gpt(torch, args):
    """A nanoGPT-style transformer: token + position embeddings, --blocks blocks of LayerNorm ->
    causal self-attention (qkv and proj Linears, the softmax over masked scores written out, so
    that torch 1.13 runs it too) -> LayerNorm -> MLP (4x, GELU), a final LayerNorm and an lm_head
    tied to the token embedding's weight; nanoGPT's initialisation."""
    nn = torch.nn
    width, heads = args.d_model, args.heads

    class SelfAttention(nn.Module):
        def __init__(self):
            super().__init__()
            self.qkv = nn.Linear(width, 3 * width)
            self.proj = nn.Linear(width, width)

        def forward(self, x):
            batch, seq, _ = x.shape
            q, k, v = (t.view(batch, seq, heads, width // heads).transpose(1, 2)
                       for t in self.qkv(x).split(width, dim=2))
            scores = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(width // heads))
            causal = torch.ones(seq, seq, dtype=torch.bool, device=x.device).tril()
            attention = torch.softmax(scores.masked_fill(~causal, float("-inf")), dim=-1)
            return self.proj((attention @ v).transpose(1, 2).reshape(batch, seq, width))

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln_1 = nn.LayerNorm(width)
            self.attn = SelfAttention()
            self.ln_2 = nn.LayerNorm(width)
            self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(),
                                     nn.Linear(4 * width, width))

        def forward(self, x):
            x = x + self.attn(self.ln_1(x))
            return x + self.mlp(self.ln_2(x))

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.wte = nn.Embedding(args.vocab, width)
            self.wpe = nn.Embedding(args.seq, width)
            self.blocks = nn.ModuleList([Block() for _ in range(args.blocks)])
            self.ln_f = nn.LayerNorm(width)
            self.lm_head = nn.Linear(width, args.vocab, bias=False)
            self.lm_head.weight = self.wte.weight
            for name, p in self.named_parameters():
                if name.endswith("bias"):
                    nn.init.zeros_(p)
                elif p.dim() == 2:
                    std = 0.02
                    if name.endswith("attn.proj.weight") or name.endswith("mlp.2.weight"):
                        std /= math.sqrt(2 * args.blocks)  # nanoGPT's residual projections
                    nn.init.normal_(p, mean=0.0, std=std)

        def forward(self, tokens):
            positions = torch.arange(tokens.shape[1], device=tokens.device)
            x = self.wte(tokens) + self.wpe(positions)
            for block in self.blocks:
                x = block(x)
            return self.lm_head(self.ln_f(x))

    return GPT()


def make_batches(torch, args, rank):
    """BATCHES (input, target) pairs of this rank, the same in every variant: mlp: normal
    inputs and targets; gpt: random tokens, the target the input shifted by one."""
    generator = torch.Generator().manual_seed(1000 + rank)
    if args.model == "gpt":
        batches = []
        for _ in range(BATCHES):
            tokens = torch.randint(args.vocab, (args.batch, args.seq + 1), generator=generator)
            batches.append((tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()))
        return batches
    return [(torch.randn(args.batch, args.layers[0], generator=generator),
             torch.randn(args.batch, args.layers[-1], generator=generator))
            for _ in range(BATCHES)]


def loss_of(torch, args, forward, x, y):
    """The --model's loss: mlp: MSE; gpt: cross-entropy of the next token."""
    out = forward(x)
    if args.model == "gpt":
        return torch.nn.functional.cross_entropy(out.reshape(-1, out.shape[-1]), y.reshape(-1))
    return torch.nn.functional.mse_loss(out, y)


def fully_shard_function():
    """torch's FSDP2 fully_shard, or None under a torch without it (1.13, whose
    torch.distributed.fsdp does not even import under Python 3.11: ValueError)."""
    try:
        from torch.distributed.fsdp import fully_shard
        return fully_shard
    except (ImportError, ValueError):
        pass
    try:
        from torch.distributed._composable.fsdp import fully_shard
        return fully_shard
    except (ImportError, ValueError):
        return None


def fsdp2_shard(torch, dist, args, model):
    """FSDP2 as its users wrap a transformer: fully_shard on every block (gpt; mlp: every Linear)
    and on the root, over a CPU mesh of every rank, default reshard_after_forward."""
    from torch.distributed.device_mesh import init_device_mesh

    fully_shard = fully_shard_function()
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    units = (model.blocks if args.model == "gpt"
             else [m for m in model if isinstance(m, torch.nn.Linear)])
    for unit in units:
        fully_shard(unit, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


def dtensor_probe(torch, like):
    """A trial step(flags) of AdamW on a small parameter placed as `like` (an FSDP2 DTensor):
    AdamW's constructor accepts flags whose step may then refuse DTensors. No communication."""
    try:
        from torch.distributed.tensor import DTensor
    except ImportError:
        from torch.distributed._tensor import DTensor

    def probe(flags):
        def placed(values):
            return DTensor.from_local(values, like.device_mesh, like.placements, run_check=False)
        p = torch.nn.Parameter(placed(torch.zeros(4)))
        p.grad = placed(torch.ones(4))
        torch.optim.AdamW([p], lr=LEARNING_RATE, weight_decay=WEIGHT_DECAY, **flags).step()
    return probe


def torch_adamw(torch, choice, params, zero, probe=None):
    """torch's AdamW (inside ZeroRedundancyOptimizer when `zero`) with the first of the flags
    `choice` allows that this torch accepts (and `probe(flags)` runs without raising, where
    given); (optimizer, description, the refused flags with why)."""
    from torch.distributed.optim import ZeroRedundancyOptimizer

    candidates = {"auto": [{"fused": True}, {"foreach": True}, {}], "fused": [{"fused": True}],
                  "foreach": [{"foreach": True}], "loop": [{"foreach": False}]}[choice]
    refused = []
    params = list(params)
    for flags in candidates:
        described = "AdamW(" + ", ".join(f"{k}={v}" for k, v in flags.items()) + ")"
        try:
            if probe is not None:
                probe(flags)
            if zero:
                optimizer = ZeroRedundancyOptimizer(params, optimizer_class=torch.optim.AdamW,
                                                    lr=LEARNING_RATE, weight_decay=WEIGHT_DECAY,
                                                    **flags)
                return optimizer, f"ZeroRedundancyOptimizer({described})", refused
            optimizer = torch.optim.AdamW(params, lr=LEARNING_RATE, weight_decay=WEIGHT_DECAY,
                                          **flags)
            return optimizer, described, refused
        except (TypeError, RuntimeError, ValueError, AssertionError) as e:
            refused.append(f"{described}: {str(e).splitlines()[0][:120]}")
    raise RuntimeError(f"no AdamW accepted: {'; '.join(refused)}")


def state_bytes(optimizer):
    """Bytes of the optimizer state tensors this process holds."""
    total = 0
    for state in optimizer.state.values():
        for value in state.values():
            if hasattr(value, "to_local"):  # FSDP2's DTensor: this rank's shard
                value = value.to_local()
            if hasattr(value, "element_size"):
                total += value.numel() * value.element_size()
    return total


class PhaseTimer:
    """Wall time of named phases of one zt.ShardedOptimizer's hooks and step(), by wrapping its
    connection's calls (zero3: call_gather and send_release are its parameters' gathers) and
    its zero2/zero3 segment hand-over (the package's internals: measurement only); with
    `per_tensor`, each tensor's hand-over and the compute before it too. Thread contract: the
    training thread only (the hooks run on it)."""

    def __init__(self, optimizer, per_tensor=True):
        self.seconds = {}
        self.counts = {}
        self._last_hand_over_end = None
        connection = optimizer._connection  # attaches
        call, send = connection.call, connection.send
        hand_over = getattr(optimizer._attachment, "hand_over", None)
        send_segments = getattr(hand_over, "send_segments", None)

        def timed_call(request, *args, **kwargs):
            start = time.perf_counter()
            try:
                return call(request, *args, **kwargs)
            finally:
                self.add(f"call_{request.WhichOneof('request')}", time.perf_counter() - start)

        def timed_send(request):
            start = time.perf_counter()
            try:
                return send(request)
            finally:
                self.add(f"send_{request.WhichOneof('request')}", time.perf_counter() - start)

        def timed_send_segments(t, *args):
            start = time.perf_counter()
            try:
                return send_segments(t, *args)
            finally:
                end = time.perf_counter()
                self.add("hand_over", end - start)
                if per_tensor:
                    # The timeline of backward: each tensor's hand-over, and the compute before
                    # it since the previous one's (tensors in plan order: the last layer's first).
                    self.add(f"hand_over_t{t}", end - start)
                    if self._last_hand_over_end is not None:
                        self.add(f"compute_before_t{t}", start - self._last_hand_over_end)
                self._last_hand_over_end = end

        connection.call, connection.send = timed_call, timed_send
        if send_segments is not None:  # ddp and zero1 have no segment hand-over
            hand_over.send_segments = timed_send_segments

    def add(self, phase, seconds):
        self.seconds[phase] = self.seconds.get(phase, 0.0) + seconds
        self.counts[phase] = self.counts.get(phase, 0) + 1

    def take(self):
        """The phases since the last take(): ({phase: ms}, {phase: count})."""
        taken = ({k: v * 1e3 for k, v in self.seconds.items()}, dict(self.counts))
        self.seconds.clear()
        self.counts.clear()
        self._last_hand_over_end = None
        return taken


def wait_until_idle(worker_name):
    """Waits until the coordinator lists `worker_name` as IDLE: the last ZeroShard run on it has
    ended, so that its teardown neither overlaps the next variant nor counts in its memory."""
    import zeroshard
    from zeroshard._proto.zeroshard.v1 import worker_pb2

    deadline = time.monotonic() + IDLE_TIMEOUT_S
    with zeroshard.Client() as client:
        while True:
            states = [w.state for w in client.workers(timeout=10) if w.name == worker_name]
            if states == [worker_pb2.IDLE]:
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"worker {worker_name} is not idle after "
                                   f"{IDLE_TIMEOUT_S:.0f} s")
            time.sleep(0.05)


def run_variant(torch, dist, zt, args, variant, batches, daemon):
    """One round of one variant on this rank: returns its record (per-iteration phases, memory,
    optimizer state)."""
    from torch.nn.parallel import DistributedDataParallel

    wait_until_idle(os.environ["ZEROSHARD_WORKERS"].split(",")[zt.rank()])
    return_freed_memory()
    dist.barrier()
    pids = [os.getpid()] + ([daemon] if variant.startswith("zeroshard") else [])
    at_start = [smaps_rollup(pid)["Pss"] for pid in pids]
    sampler = PssSampler(pids, args.sample_ms / 1e3)
    sampler.start()
    model = build_model(torch, args)
    record = {"variant": variant, "pss_at_start_parts": at_start,
              "param_elems": sum(p.numel() for p in model.parameters())}
    timer = None
    if variant == "torch_fsdp2":
        forward = fsdp2_shard(torch, dist, args, model)
        optimizer, record["optimizer"], record["refused"] = torch_adamw(
            torch, args.torch_adamw, model.parameters(), False,
            probe=dtensor_probe(torch, next(model.parameters())))
        inner = optimizer

        def zero_grad():
            optimizer.zero_grad(set_to_none=True)
    elif variant.startswith("torch"):
        forward = DistributedDataParallel(model, gradient_as_bucket_view=True)
        optimizer, record["optimizer"], record["refused"] = torch_adamw(
            torch, args.torch_adamw, forward.parameters(), variant == "torch_zero")
        inner = optimizer.optim if variant == "torch_zero" else optimizer

        def zero_grad():
            optimizer.zero_grad(set_to_none=True)
    else:
        forward = model
        mode = variant.split("_", 1)[1]
        optimizer = zt.ShardedOptimizer(model, "adamw", lr=LEARNING_RATE,
                                        weight_decay=WEIGHT_DECAY, mode=mode,
                                        overlap_all_gather=args.overlap_all_gather)
        record["optimizer"] = (f"zt.ShardedOptimizer(adamw, mode={mode}, "
                               f"overlap_all_gather={args.overlap_all_gather})")
        timer = PhaseTimer(optimizer, per_tensor=args.model == "mlp")
        zero_grad = optimizer.zero_grad
    iterations = []
    losses = []  # every iteration's, this rank's batch
    timed = range(args.warmup, args.warmup + args.steps)
    for step in range(args.warmup + args.steps + args.memory_steps):
        if step == timed.start:
            sampler.pause()
        elif step == timed.stop:
            sampler.resume()
        x, y = batches[step % len(batches)]
        cpu_start = time.process_time()
        start = time.perf_counter()
        loss = loss_of(torch, args, forward, x, y)
        forwarded = time.perf_counter()
        loss.backward()
        backwarded = time.perf_counter()
        optimizer.step()
        stepped = time.perf_counter()
        zero_grad()
        done = time.perf_counter()
        cpu = time.process_time() - cpu_start
        phases = timer.take() if timer is not None else ({}, {})
        losses.append(loss.item())
        if step in timed:
            iterations.append({"iter": done - start, "forward": forwarded - start,
                               "backward": backwarded - forwarded, "step": stepped - backwarded,
                               "zero_grad": done - stepped, "cpu": cpu,
                               "phases_ms": phases[0], "phase_counts": phases[1]})
    dist.barrier()
    sampler.stop()
    record["iterations"] = iterations
    if timer is None:
        dist.barrier()
        record["no_comm"] = time_without_communication(torch, args, variant, model, forward,
                                                       optimizer, batches)
    record["peak_pss"] = sampler.peak_total
    record["peak_pss_parts"] = sampler.peak_parts
    record["peak_rss_parts"] = sampler.peak_rss_parts
    record["peak_kinds_parts"] = sampler.peak_kinds_parts
    record["pss_samples"] = sampler.samples
    record["pss_sample_ms"] = sampler.sample_seconds / sampler.samples * 1e3
    record["loss"] = loss.item()
    record["losses"] = losses
    if timer is None:
        record["opt_state_bytes"] = state_bytes(inner)
    else:
        record.update(zeroshard_report(zt, optimizer))
        zt.finish(optimizer)
        wait_until_idle(os.environ["ZEROSHARD_WORKERS"].split(",")[zt.rank()])
        dist.barrier()
        record["no_comm"] = time_without_communication(torch, args, variant, model, forward,
                                                       optimizer, batches)
        if zt.rank() == 0:
            record["worker_steps"] = worker_step_metrics(
                record["job_id"], range(args.warmup + 1, args.warmup + args.steps + 1))
    return record


def time_without_communication(torch, args, variant, model, forward, optimizer, batches):
    """The variant's iterations with communication skipped, on every rank at once: seconds per
    iteration (torch DDP and ZeRO: forward + backward + the update of this rank's own shard;
    FSDP2: forward + backward of a plain copy of the model (the same seed) + the same AdamW's
    update of tensors shaped as this rank's shards; ZeroShard: forward + backward of a plain copy
    of the model, whose update is the worker's)."""
    if variant == "torch_fsdp2":
        plain = build_model(torch, args)
        shards = [torch.nn.Parameter(p.to_local().detach().clone()) for p in model.parameters()]
        for shard in shards:
            shard.grad = torch.zeros_like(shard)
        flags = {k: optimizer.defaults[k] for k in ("fused", "foreach")
                 if optimizer.defaults.get(k) is not None}
        update = torch.optim.AdamW(shards, lr=LEARNING_RATE, weight_decay=WEIGHT_DECAY, **flags)

        def iteration(x, y):
            loss_of(torch, args, plain, x, y).backward()
            update.step()
            plain.zero_grad(set_to_none=True)
    elif variant.startswith("torch"):
        inner = optimizer.optim if variant == "torch_zero" else optimizer

        def iteration(x, y):
            with forward.no_sync():
                loss_of(torch, args, forward, x, y).backward()
            inner.step()
            optimizer.zero_grad(set_to_none=True)
    else:
        plain = build_model(torch, args)  # zero3's parameters hold no values after zt.finish

        def iteration(x, y):
            loss_of(torch, args, plain, x, y).backward()
            plain.zero_grad(set_to_none=True)

    iteration(*batches[0])  # the first allocation of the gradients
    seconds = []
    for step in range(args.limit_steps):
        start = time.perf_counter()
        iteration(*batches[step % len(batches)])
        seconds.append(time.perf_counter() - start)
    return seconds


def worker_step_metrics(job_id, steps):
    """Rank 0's worker's StepMetrics of `steps` (the job's PROGRESS events, once it ended): where
    the worker's side of each iteration went, ms."""
    import zeroshard
    from zeroshard._proto.zeroshard.v1 import job_pb2

    with zeroshard.Client() as client:
        events = list(client.watch(job_id, timeout=REPORT_TIMEOUT_S))
    metrics = {}
    for event in events:
        if event.type == job_pb2.PROGRESS and event.progress.step in steps:
            m = event.progress
            metrics[m.step] = {
                "compute": m.compute_ms, "step": m.step_ms, "update": m.update_ms,
                "exposed_comm": m.exposed_comm_ms, "param_wait": m.param_wait_ms,
                "iteration": m.iteration_ms,
                # After Engine::Step: AttachedTrainer::StepApplied waiting for the all-gathers.
                "gather_wait": m.iteration_ms - m.compute_ms - m.step_ms,
                "exposed_in_backward": sum(m.bucket_exposed_in_backward_ms),
                "compute_thread_cpu": m.compute_thread_cpu_ms,
                "comm_thread_cpu": m.comm_thread_cpu_ms, "process_cpu": m.process_cpu_ms}
    return list(metrics.values())


def zeroshard_report(zt, optimizer):
    """Rank 0: its worker's memory report (StepMetrics.memory of the job's progress) and every
    rank's owned elements from the shard plan; other ranks: nothing."""
    if zt.rank() != 0:
        return {}
    import zeroshard

    with zeroshard.Client() as client:
        deadline = time.monotonic() + REPORT_TIMEOUT_S
        while True:
            job = client.get(optimizer._job_id, timeout=10)
            if job.progress.memory.total_bytes > 0:
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"job {optimizer._job_id}: no memory report from rank 0's "
                                   f"worker within {REPORT_TIMEOUT_S:.0f} s")
            time.sleep(0.05)
        owned = []
        for rank in range(zt.world_size()):
            plan = client.plan(optimizer._job_id, rank=rank, timeout=10)
            owned.append(sum(piece.flat_end - piece.flat_begin for piece in plan.pieces))
    memory = job.progress.memory
    return {"opt_state_bytes": memory.optimizer_state_bytes,
            "worker_memory": {"params": memory.params_bytes, "grads": memory.grads_bytes,
                              "optimizer_state": memory.optimizer_state_bytes,
                              "buckets": memory.bucket_bytes,
                              # zero3's full parameters in use; the collectives' buffers.
                              "gather_pool": getattr(memory, "gather_pool_bytes", 0),
                              "comm_scratch": getattr(memory, "comm_scratch_bytes", 0),
                              "comm_staging": getattr(memory, "comm_staging_bytes", 0),
                              "total": memory.total_bytes},
            "worker_vmhwm_bytes": job.progress.vmhwm_bytes,
            "owned_elems_by_rank": owned, "job_id": optimizer._job_id}


def model_description(args):
    if args.model == "gpt":
        return (f"gpt(blocks={args.blocks}, d_model={args.d_model}, heads={args.heads}, "
                f"vocab={args.vocab}, seq={args.seq}, batch={args.batch}, tied lm_head)")
    return f"mlp({','.join(map(str, args.layers))}, batch={args.batch})"


def summarize(variant, rounds, world_size, torch_version, args):
    """The variant's JSON line from its rounds (each a list of W rank records)."""
    def per_round(key):
        """Per round: the median over iterations of the slowest rank's value, ms."""
        values = []
        for ranks in rounds:
            slowest = [max(r["iterations"][i][key] for r in ranks)
                       for i in range(len(ranks[0]["iterations"]))]
            values.append(round(median(slowest) * 1e3, 3))
        return values

    def phase_round(phase):
        """Per round: rank 0's median ms per iteration in a PhaseTimer phase."""
        return [round(median([it["phases_ms"].get(phase, 0.0) for it in ranks[0]["iterations"]]),
                      3) for ranks in rounds]

    iter_rounds = per_round("iter")
    step_rounds = per_round("step")
    # Per round: the median over the no-communication iterations of the slowest rank, plus, for
    # ZeroShard, the median update_ms of rank 0's worker in the run.
    limit_rounds = []
    for ranks in rounds:
        slowest = [max(r["no_comm"][i] for r in ranks) for i in range(len(ranks[0]["no_comm"]))]
        limit = median(slowest) * 1e3
        if variant.startswith("zeroshard"):
            updates = [m["update"] for m in ranks[0].get("worker_steps", [])]
            limit += median(updates) if updates else 0.0
        limit_rounds.append(round(limit, 3))
    peak_rounds = [max(r["peak_pss"] for r in ranks) for ranks in rounds]
    rank0 = [ranks[0] for ranks in rounds]
    line = {
        "bench": "torch_attach",
        "variant": variant,
        "iter_ms": round(median(iter_rounds), 3),
        "limit_ms": round(median(limit_rounds), 3),
        "over_limit": round(median(iter_rounds) / median(limit_rounds), 3),
        "step_ms": round(median(step_rounds), 3),
        "peak_rss_bytes": int(median(peak_rounds)),
        "opt_state_bytes_per_rank": int(median(
            [max(r["opt_state_bytes"] for r in ranks if "opt_state_bytes" in r)
             for ranks in rounds])),
        "world_size": world_size,
        "torch_version": torch_version,
        "optimizer": rank0[0]["optimizer"],
        "rounds": len(rounds),
        "steps": len(rank0[0]["iterations"]),
        "memory_steps": args.memory_steps,
        "model": model_description(args),
        "param_elems": rank0[0]["param_elems"],
        "iter_ms_rounds": iter_rounds,
        "limit_ms_rounds": limit_rounds,
        "step_ms_rounds": step_rounds,
        "forward_ms_rounds": per_round("forward"),
        "backward_ms_rounds": per_round("backward"),
        "zero_grad_ms_rounds": per_round("zero_grad"),
        "trainer_cpu_ms_rounds": per_round("cpu"),
        "peak_rss_bytes_rounds": peak_rounds,
        "peak_pss_by_rank_rounds": [[r["peak_pss"] for r in ranks] for ranks in rounds],
        "peak_pss_parts_by_rank_rounds": [[r["peak_pss_parts"] for r in ranks]
                                          for ranks in rounds],
        "peak_rss_parts_by_rank_rounds": [[r["peak_rss_parts"] for r in ranks]
                                          for ranks in rounds],
        "peak_pss_kinds_by_rank_rounds": [[r["peak_kinds_parts"] for r in ranks]
                                          for ranks in rounds],
        "pss_at_start_parts_by_rank_rounds": [[r["pss_at_start_parts"] for r in ranks]
                                              for ranks in rounds],
        "pss_samples_rounds": [min(r["pss_samples"] for r in ranks) for ranks in rounds],
        "pss_sample_ms_rounds": [round(ranks[0]["pss_sample_ms"], 3) for ranks in rounds],
        "final_loss_rounds": [round(r["loss"], 6) for r in rank0],
        # Rank 0's loss of every iteration of the first round (its own batches).
        "losses_rank0": [round(value, 6) for value in rank0[0]["losses"]],
        "load_average_rounds": [r["load_average"] for r in rank0],
    }
    if variant.startswith("torch"):
        line["optimizer_refused"] = rank0[0]["refused"]
        line["opt_state_bytes_by_rank"] = [r["opt_state_bytes"] for r in rounds[0]]
    else:
        line["opt_state_source"] = "rank 0's worker: StepMetrics.memory.optimizer_state_bytes"
        line["worker_memory_rank0"] = rank0[0]["worker_memory"]
        line["worker_vmhwm_bytes_rank0_rounds"] = [r["worker_vmhwm_bytes"] for r in rank0]
        line["owned_elems_by_rank"] = rank0[0]["owned_elems_by_rank"]
        phases = sorted({p for ranks in rounds for it in ranks[0]["iterations"]
                         for p in it["phases_ms"]})
        line["rank0_phase_ms_rounds"] = {p: phase_round(p) for p in phases}
        line["worker_rank0_ms_rounds"] = {
            key: [round(median([m[key] for m in r["worker_steps"]]), 3) if r["worker_steps"]
                  else None for r in rank0]
            for key in (rank0[0]["worker_steps"][0] if rank0[0]["worker_steps"] else {})}
        line["worker_rank0_reports_rounds"] = [len(r["worker_steps"]) for r in rank0]
        line["rank0_phase_counts"] = {
            p: median([it["phase_counts"].get(p, 0) for it in rank0[0]["iterations"]])
            for p in phases}
    return line


def train(args):
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    import torch
    import torch.distributed as dist

    import zeroshard.torch as zt

    torch.set_num_threads(1)
    with contextlib.suppress(RuntimeError):  # settable only before the first parallel work
        torch.set_num_interop_threads(1)
    zt.init()
    dist.init_process_group("gloo")
    rank, world_size = zt.rank(), zt.world_size()
    daemon = worker_pid(os.environ["ZEROSHARD_ATTACH_SOCKET"])
    batches = make_batches(torch, args, rank)
    results = {variant: [] for variant in args.variants}
    for round_index in range(args.rounds):
        order = args.variants if round_index % 2 == 0 else list(reversed(args.variants))
        for variant in order:
            load = os.getloadavg()[0]
            record = run_variant(torch, dist, zt, args, variant, batches, daemon)
            record["load_average"] = [round(load, 2), round(os.getloadavg()[0], 2)]
            gathered = [None] * world_size
            dist.all_gather_object(gathered, record)
            results[variant].append(gathered)
    if rank == 0:
        for variant in args.variants:
            print(json.dumps(summarize(variant, results[variant], world_size,
                                       torch.__version__, args)), flush=True)
    dist.barrier()
    dist.destroy_process_group()
    return 0


def main(argv):
    args = parse_args(argv)
    if "torch_fsdp2" in args.variants:
        import torch

        if fully_shard_function() is None:
            print(f"torch_attach: --variants torch_fsdp2 needs FSDP2 (torch.distributed.fsdp."
                  f"fully_shard, torch >= 2.4); {sys.executable} has torch {torch.__version__} "
                  f"(run /opt/zs-torch/bin/python)", file=sys.stderr, flush=True)
            return 2
    if not os.environ.get("ZEROSHARD_RANK"):
        return drive(args, argv)
    return train(args)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
