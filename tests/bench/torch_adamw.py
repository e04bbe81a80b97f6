#!/usr/bin/env python3
"""Companion of optimizer_bench: times torch.optim.AdamW on CPU on the same sizes, JSON lines.

Uses fused=True where this torch has a fused CPU AdamW (torch >= 2.4), else foreach (and says so
on stderr and in the "impl" field). GB/s use optimizer_bench's accounting (docs/kernels.md,
"Bytes moved per parameter": AdamW with fp32 gradients reads g, p, m, v and writes p, m, v, 28
bytes per parameter), so the figures compare directly with its "gbps".

Runs with Debian's /usr/bin/python3 (torch 1.13: foreach) or with the tools venv that
tools/make_torch_venv.sh makes (PyPI torch 2.x: fused):
  /opt/zs-torch/bin/python tests/bench/torch_adamw.py [--params=N] [--threads=1,2] [--reps=5]
--cpu_capability=avx2 sets ATEN_CPU_CAPABILITY before torch loads, so torch's kernels run on
AVX2 on an AVX-512 machine (compare with optimizer_bench --isa=avx2).
"""
import argparse
import json
import os
import statistics
import sys
import time

# The hyperparameters of optimizer_bench's AdamW case.
LR = 1e-3
BETAS = (0.9, 0.999)
EPS = 1e-8
WEIGHT_DECAY = 0.01
BYTES_PER_PARAM = 28


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--params", type=int, default=64 << 20, help="parameters per update")
    parser.add_argument("--threads", default="1,2", help="comma-separated torch thread counts")
    parser.add_argument("--reps", type=int, default=5, help="timed steps (at least 5; median)")
    parser.add_argument("--warmup", type=int, default=2, help="untimed steps per thread count")
    parser.add_argument("--impl", choices=["auto", "fused", "foreach"], default="auto",
                        help="auto: fused where torch has it on CPU, else foreach")
    parser.add_argument("--cpu_capability", choices=["default", "avx2", "avx512"],
                        help="sets ATEN_CPU_CAPABILITY (torch's kernel instruction set)")
    return parser.parse_args()


def version_tuple(version: str) -> tuple:
    parts = []
    for part in version.split("+")[0].split(".")[:2]:
        digits = "".join(ch for ch in part if ch.isdigit())
        parts.append(int(digits or 0))
    return tuple(parts)


def fused_cpu_adamw_works(torch) -> bool:
    """Whether this torch runs AdamW(fused=True) on CPU tensors (torch >= 2.4)."""
    if version_tuple(torch.__version__) < (2, 4):
        return False
    param = torch.zeros(16, requires_grad=True)
    param.grad = torch.ones(16)
    try:
        torch.optim.AdamW([param], fused=True).step()
    except (RuntimeError, TypeError, ValueError):
        return False
    return True


def cpu_capability(torch) -> str:
    try:
        return torch.backends.cpu.get_cpu_capability().lower()
    except AttributeError:  # torch < 2.0 cannot say
        return "unknown"


def main() -> int:
    args = parse_args()
    if args.cpu_capability:
        # Read once, when torch dispatches its first kernel: set it before the import.
        os.environ["ATEN_CPU_CAPABILITY"] = args.cpu_capability
    import torch  # pylint: disable=import-outside-toplevel

    reps = max(5, args.reps)
    impl = args.impl
    if impl == "auto":
        impl = "fused" if fused_cpu_adamw_works(torch) else "foreach"
        if impl == "foreach":
            print(f"torch_adamw: torch {torch.__version__} has no fused CPU AdamW (torch >= 2.4 "
                  "has): timing foreach=True", file=sys.stderr)

    n = args.params
    index = torch.arange(n, dtype=torch.int64)
    grad = ((index * 2654435761) % 2001).to(torch.float32) * 1e-3 - 1.0
    del index
    param = torch.full((n,), 0.5, dtype=torch.float32, requires_grad=True)
    param.grad = grad
    options = {"fused": True} if impl == "fused" else {"foreach": True}
    optimizer = torch.optim.AdamW([param], lr=LR, betas=BETAS, eps=EPS,
                                  weight_decay=WEIGHT_DECAY, **options)

    for threads in (int(t) for t in args.threads.split(",")):
        torch.set_num_threads(threads)
        for _ in range(args.warmup):
            optimizer.step()
        seconds = []
        for _ in range(reps):
            start = time.perf_counter()
            optimizer.step()
            seconds.append(time.perf_counter() - start)
        median = statistics.median(seconds)
        print(json.dumps({
            "bench": "torch_adamw",
            "torch_version": torch.__version__,
            "impl": impl,
            "isa": cpu_capability(torch),
            "threads": torch.get_num_threads(),
            "params": n,
            "bytes_per_param": BYTES_PER_PARAM,
            "reps": reps,
            "seconds": round(median, 5),
            "ms": round(median * 1e3, 3),
            "gbps": round(BYTES_PER_PARAM * n / median / 1e9, 2),
        }, separators=(",", ":")), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
