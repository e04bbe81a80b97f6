"""GPU check of attached trainers on CUDA workers (docs/pytorch.md, "CUDA workers"): the same
seeded job (attach_cuda_script.py) on a local cluster of CPU workers and of CUDA workers
(--device=cuda:0), ddp and zero2, W=1; the final parameters must agree.

    python3 attach_cuda_check.py --bin_dir BIN --repo_root ROOT [--log_dir DIR]

ROOT holds deploy/local/cluster.py and python/zeroshard (with its generated _proto stubs); BIN
the coordinator/, worker/ and client/ binaries of a --config=cuda build. Prints PASS/FAIL per
check and ends with "ALL PASSED: 0 failed" (exit 0); exit 1 on a failed check, 2 when the
machine cannot run it (no CUDA device, or a module missing).
Tolerance: the trainer's forward and backward run on different devices (cuBLAS sums in its own
order), so parameters may differ by float rounding amplified over the steps: |cuda - cpu| <=
1e-4 * max|cpu| per tensor.
"""

import argparse
import os
import subprocess
import sys
import time

TOLERANCE = 1e-4
STEPS = 20


def run_job(args, device, mode, world_size, out):
    log_dir = os.path.join(args.log_dir, f"{device}-{mode}-w{world_size}")
    os.makedirs(log_dir, exist_ok=True)
    env = dict(os.environ)
    python_root = os.path.join(args.repo_root, "python")
    env["PYTHONPATH"] = os.pathsep.join(p for p in [python_root, env.get("PYTHONPATH")] if p)
    env.pop("ZEROSHARD_COORDINATOR", None)
    command = [sys.executable, os.path.join(args.repo_root, "deploy", "local", "cluster.py"),
               "--workers", str(world_size), "--bin_dir", args.bin_dir, "--log_dir", log_dir,
               f"--worker_flag=--device={'cuda:0' if device == 'cuda' else 'cpu'}", "--",
               sys.executable, "-m", "zeroshard.launch", "--workers", str(world_size),
               os.path.join(os.path.dirname(os.path.abspath(__file__)), "attach_cuda_script.py"),
               "--device", device, "--mode", mode, "--steps", str(STEPS), "--out", out]
    started = time.monotonic()
    result = subprocess.run(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, timeout=600)
    print(f"  {device} {mode} W={world_size}: exit {result.returncode} in "
          f"{time.monotonic() - started:.1f} s (logs: {log_dir})", flush=True)
    if result.returncode != 0:
        print(result.stdout[-4000:], flush=True)
    return result.returncode == 0


def compare(torch, reference_path, candidate_path):
    reference = torch.load(reference_path)
    candidate = torch.load(candidate_path)
    worst = 0.0
    for name, expected in reference.items():
        got = candidate[name]
        scale = max(float(expected.abs().max()), 1e-12)
        worst = max(worst, float((got - expected).abs().max()) / scale)
    return worst


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--bin_dir", required=True)
    parser.add_argument("--repo_root", required=True)
    parser.add_argument("--log_dir", default="/tmp/zs-attach-gpu")
    args = parser.parse_args()
    try:
        import torch
        import grpc  # noqa: F401 (zeroshard.torch talks to the coordinator)
        import google.protobuf  # noqa: F401
    except ImportError as e:
        print(f"SKIP attach_cuda_check: {e} (this python needs torch, grpcio and protobuf)")
        return 2
    if not torch.cuda.is_available():
        print("SKIP attach_cuda_check: torch sees no CUDA device")
        return 2
    os.makedirs(args.log_dir, exist_ok=True)
    failed = 0
    # W=2 needs two GPUs (NCCL refuses two ranks on one device) and a cluster whose workers
    # each get their own --device: not done yet.
    for mode in ("ddp", "zero2"):
        outputs = {}
        ran = True
        for device in ("cpu", "cuda"):
            outputs[device] = os.path.join(args.log_dir, f"params-{device}-{mode}.pt")
            ran = run_job(args, device, mode, 1, outputs[device]) and ran
        if not ran:
            print(f"FAIL attach {mode} W=1: a job failed (above)")
            failed += 1
            continue
        worst = compare(torch, outputs["cpu"], outputs["cuda"])
        verdict = "PASS" if worst <= TOLERANCE else "FAIL"
        failed += verdict == "FAIL"
        print(f"{verdict} attach {mode} W=1, {STEPS} AdamW steps: max |cuda - cpu| / max|cpu| "
              f"= {worst:.3g} (tolerance {TOLERANCE:g})", flush=True)
    if failed:
        print(f"FAILED: {failed} failed")
        return 1
    print("ALL PASSED: 0 failed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
