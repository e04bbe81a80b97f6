#!/usr/bin/env python3
"""Companion of gemm_bench: times the MLP's GEMMs through torch, same shapes and layouts, JSON lines.

Reads the calls from `gemm_bench --list` (a file, or - for stdin) and times, for each, the op
torch's autograd runs for nn.Linear on a 2-D input, on operands of the same shapes and strides:
  forward       addmm(bias, x, W.t())  (F.linear; the teacher's forward and the student's)
  input_grad    mm(dY, W)              (AddmmBackward: grad.mm(mat2.t()))
  weight_grad   mm(dY.t(), x)          (AddmmBackward: grad.t().mm(mat1), the weight being
                                        column-major as mat2 = W.t())
  a row block   mm(dY[:, rows].t(), x) (what autograd never issues: only to compare shapes)
Every result goes into a preallocated `out=` tensor, so the figures are the GEMMs and not the
allocator. One thread: OMP_NUM_THREADS, MKL_NUM_THREADS and OPENBLAS_NUM_THREADS are set to 1
before torch loads, and torch.set_num_threads(1). `library` is torch's BLAS (BLAS_INFO in
torch.__config__.show(): MKL inside the PyPI wheels; Debian's torch 1.13 calls libblas.so.3, i.e.
the system's OpenBLAS, whose own version, kernel and thread count are read from it).

  .bazel/bin/tests/bench/gemm_bench --list > /tmp/gemm_shapes.jsonl
  /opt/zs-torch/bin/python tests/bench/torch_gemm.py --shapes=/tmp/gemm_shapes.jsonl
  /usr/bin/python3 tests/bench/torch_gemm.py --shapes=/tmp/gemm_shapes.jsonl
--show_autograd_ops prints the aten ops and input shapes the profiler records for one forward
and backward of the first job's MLP (nn.Sequential of Linear and ReLU, MSE loss), which is where
the table above comes from.
"""
import argparse
import ctypes
import json
import os
import re
import statistics
import sys
import time

for _variable in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
    os.environ[_variable] = "1"

import torch  # noqa: E402  (after the thread variables, which torch reads when it loads)

def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", required=True, help="gemm_bench --list output, or -")
    parser.add_argument("--reps", type=int, default=15, help="timed passes (at least 10; median)")
    parser.add_argument("--warmup", type=int, default=3, help="untimed passes first")
    parser.add_argument("--show_autograd_ops", action="store_true")
    args = parser.parse_args()
    if args.reps < 10:
        parser.error("--reps: at least 10")
    return args


def loaded_library(fragment: str):
    """The path of a shared object this process has mapped whose name contains `fragment`."""
    with open("/proc/self/maps") as maps:
        for line in maps:
            path = line.split()[-1] if len(line.split()) >= 6 else ""
            if fragment in os.path.basename(path):
                return path
    return None


def describe_blas() -> dict:
    """torch's BLAS: library (name, version, kernel), threads as that library reports them."""
    config = torch.__config__.show()
    blas_info = re.search(r"BLAS_INFO=(\w+)", config)
    blas_info = blas_info.group(1) if blas_info else "unknown"
    info = {"blas_info": blas_info, "blas_threads": None}
    if blas_info == "mkl":
        version = re.search(r"Math Kernel Library Version ([\d.]+)", config)
        info["library"] = f"MKL {version.group(1) if version else '?'}"
        return info
    # Debian's build (BLAS_INFO=generic) calls sgemm_ from libblas.so.3, which with Debian's
    # OpenBLAS is a thin interface over libopenblas.so.0: report that library.
    sgemm_owner = None
    for fragment in ("libopenblas", "libblis", "libblas.so"):
        sgemm_owner = loaded_library(fragment)
        if sgemm_owner:
            break
    info["library"] = sgemm_owner or blas_info
    if sgemm_owner and "openblas" in os.path.basename(sgemm_owner):
        lib = ctypes.CDLL(sgemm_owner)
        lib.openblas_get_config.restype = ctypes.c_char_p
        lib.openblas_get_corename.restype = ctypes.c_char_p
        words = lib.openblas_get_config().decode().split()
        info["library"] = f"{words[0]} {words[1]} ({lib.openblas_get_corename().decode()})"
        info["blas_threads"] = lib.openblas_get_num_threads()
    return info


def read_shapes(path: str) -> list:
    stream = sys.stdin if path == "-" else open(path)
    with stream:
        return [json.loads(line) for line in stream
                if line.startswith("{") and json.loads(line).get("bench") == "gemm_shape"]


class Job:
    """One job's operands, shared between calls as the MLP shares them (x feeds the forward and
    the weight gradient, dY the weight and input gradients), and a runnable op per line."""

    def __init__(self, shapes: list):
        self.shapes = shapes
        self.tensors = {}
        self.ops = {}  # shape name -> list of zero-argument callables (forwards: one per weight)
        blocks = {}
        for shape in shapes:
            if shape["kind"] == "weight_grad_block":
                blocks.setdefault(shape["group"], []).append(shape)
        for shape in shapes:
            if shape["kind"] == "weight_grad_blocks":
                self.ops[shape["shape"]] = [
                    self.block_op(block) for block in blocks[shape["shape"]]]
            elif shape["kind"] != "weight_grad_block":
                self.ops[shape["shape"]] = self.make_ops(shape)
        for block_list in blocks.values():
            for block in block_list:
                self.ops[block["shape"]] = [self.block_op(block)]

    def tensor(self, key, rows: int, cols: int) -> torch.Tensor:
        if key not in self.tensors:
            self.tensors[key] = torch.rand(rows, cols) * 2 - 1
        return self.tensors[key]

    @staticmethod
    def check(shape: dict, **expected) -> None:
        for field, value in expected.items():
            if shape[field] != value:
                raise SystemExit(f"torch_gemm: {shape['shape']}: {field} is {shape[field]}, "
                                 f"this script's layout has {value}")

    def make_ops(self, shape: dict) -> list:
        m, n, k, layer = shape["m"], shape["n"], shape["k"], shape["layer"]
        kind = shape["kind"]
        if kind == "forward":
            # x [batch, in] row-major, W [out, in]: x W^T, i.e. NoTrans x Trans.
            self.check(shape, trans_a=False, trans_b=True, lda=k, ldb=k, ldc=n, bias=True)
            x = self.tensor(("x", layer), m, k)
            bias = self.tensor(("bias", layer), 1, n)[0]
            ops = []
            for copy in range(shape["calls_per_iteration"]):  # the teacher's and the student's
                weight = self.tensor(("w", layer, copy), n, k)
                out = self.tensor(("y", layer, copy), m, n)
                ops.append(lambda x=x, weight=weight, bias=bias, out=out:
                           torch.addmm(bias, x, weight.t(), out=out))
            return ops
        if kind == "input_grad":
            # dY [batch, out] times W [out, in]: NoTrans x NoTrans.
            self.check(shape, trans_a=False, trans_b=False, lda=k, ldb=n, ldc=n)
            grad = self.tensor(("dy", layer), m, k)
            weight = self.tensor(("w", layer, 1), k, n)
            out = self.tensor(("dx", layer), m, n)
            return [lambda: torch.mm(grad, weight, out=out)]
        if kind == "weight_grad":
            # dY^T [out, batch] (dY row-major: Trans, lda = out) times x [batch, in].
            self.check(shape, trans_a=True, trans_b=False, lda=m, ldb=n, ldc=n)
            grad = self.tensor(("dy", layer), k, m)
            x = self.tensor(("x", layer), k, n)
            out = self.tensor(("dw", layer), m, n)
            return [lambda: torch.mm(grad.t(), x, out=out)]
        raise SystemExit(f"torch_gemm: {shape['shape']}: unknown kind {kind}")

    def block_op(self, block: dict):
        m, n, k, layer = block["m"], block["n"], block["k"], block["layer"]
        out_size = block["lda"]
        self.check(block, trans_a=True, trans_b=False, ldb=n, ldc=n)
        grad = self.tensor(("dy", layer), k, out_size)
        x = self.tensor(("x", layer), k, n)
        first = block["a_offset"]
        rows_of_grad = grad[:, first:first + m].t()
        if block["cut_row"]:
            out = self.tensor(("row_scratch",), 1, n)
        else:
            dw = self.tensor(("dw_blocked", layer), out_size, n)
            out = dw[block["first_row"]:block["first_row"] + m]
        return lambda: torch.mm(rows_of_grad, x, out=out)


def max_rel_error(shape: dict, job: Job) -> float:
    """The largest error of sampled output rows against float64, each element divided by the sum
    of its terms' magnitudes (as gemm_bench reports it)."""
    layer, kind = shape["layer"], shape["kind"]
    if kind == "forward":
        a, b = job.tensors[("x", layer)], job.tensors[("w", layer, 0)].t()
        out, bias = job.tensors[("y", layer, 0)], job.tensors[("bias", layer)][0]
    elif kind == "input_grad":
        a, b = job.tensors[("dy", layer)], job.tensors[("w", layer, 1)]
        out, bias = job.tensors[("dx", layer)], None
    else:
        a, b = job.tensors[("dy", layer)].t(), job.tensors[("x", layer)]
        out = job.tensors[("dw" if kind == "weight_grad" else "dw_blocked", layer)]
        bias = None
    rows = torch.arange(0, a.shape[0], max(1, a.shape[0] // 64))
    exact = a[rows].double() @ b.double()
    magnitude = a[rows].double().abs() @ b.double().abs()
    if bias is not None:
        exact += bias.double()
        magnitude += bias.double().abs()
    error = (out[rows].double() - exact).abs() / magnitude.clamp_min(1e-300)
    return float(error.max())


def run_job(shapes: list, reps: int, warmup: int, blas: dict) -> None:
    job = Job(shapes)
    order = [s for s in shapes if s["kind"] != "weight_grad_block"]
    forwards = [s for s in order if s["kind"] == "forward"]
    backward = [s for s in order if s["kind"] != "forward"]
    # Wall and this thread's CPU time (what other processes taking the core do not advance;
    # with one thread, torch's BLAS runs on the calling thread). A start reads the CPU clock
    # first and an end last, so the wall intervals leave those reads out.
    samples = {s["shape"]: [] for s in shapes}
    cpu_samples = {s["shape"]: [] for s in shapes}
    blocks_of = {}
    for s in shapes:
        if s["kind"] == "weight_grad_block":
            blocks_of.setdefault(s["group"], []).append(s["shape"])
    cpu = wall = 0.0
    for rep in range(warmup + reps):
        timed = rep >= warmup
        # As gemm_bench: the teacher's forward, the student's, then backward, a layer's whole dW
        # and its blocks alternating which goes first.
        steps = [(s, 0) for s in forwards] + [(s, 1) for s in forwards if
                                             s["calls_per_iteration"] > 1]
        sequence = list(backward)
        if rep % 2 == 1:
            for i in range(len(sequence) - 1):
                if (sequence[i]["kind"] == "weight_grad"
                        and sequence[i + 1]["kind"] == "weight_grad_blocks"):
                    sequence[i], sequence[i + 1] = sequence[i + 1], sequence[i]
        steps += [(s, None) for s in sequence]
        cpu_start, wall_start = time.process_time(), time.perf_counter()
        for shape, copy in steps:
            ops = job.ops[shape["shape"]]
            ends = []
            thread_start = time.thread_time_ns()
            start = (time.perf_counter_ns(), thread_start)
            for op in ([ops[copy]] if copy is not None else ops):
                op()
                wall_end = time.perf_counter_ns()
                ends.append((wall_end, time.thread_time_ns()))
            if not timed:
                continue
            samples[shape["shape"]].append((ends[-1][0] - start[0]) / 1e3)
            cpu_samples[shape["shape"]].append((ends[-1][1] - start[1]) / 1e3)
            if shape["kind"] == "weight_grad_blocks":
                for i, name in enumerate(blocks_of[shape["shape"]]):
                    begin = start if i == 0 else ends[i - 1]
                    samples[name].append((ends[i][0] - begin[0]) / 1e3)
                    cpu_samples[name].append((ends[i][1] - begin[1]) / 1e3)
        if timed:
            cpu += time.process_time() - cpu_start
            wall += time.perf_counter() - wall_start

    # Per iteration: forwards and input gradients, plus the weight gradients whole (what
    # autograd runs) or as gemm_bench's blocks; wall and CPU.
    blocked_us, whole_us, flops = [0.0, 0.0], [0.0, 0.0], 0.0
    for shape in shapes:
        name = shape["shape"]
        median = (statistics.median(samples[name]), statistics.median(cpu_samples[name]))
        work = 2.0 * shape["m"] * shape["n"] * shape["k"]
        calls = shape["calls_per_iteration"]
        for clock in (0, 1):
            if shape["kind"] in ("forward", "input_grad"):
                blocked_us[clock] += calls * median[clock]
                whole_us[clock] += calls * median[clock]
            elif shape["kind"] == "weight_grad":
                whole_us[clock] += median[clock]
            elif shape["kind"] == "weight_grad_blocks":
                blocked_us[clock] += median[clock]
        if shape["kind"] in ("forward", "input_grad", "weight_grad"):
            flops += calls * work
        line = {"bench": "gemm", "library": blas["library"], **{
            key: value for key, value in shape.items() if key != "bench"}}
        line.update({
            "threads": torch.get_num_threads(),
            "blas_threads": blas["blas_threads"],
            "gflops": round(work / median[0] / 1e3, 2),
            "median_us": round(median[0], 3),
            "min_us": round(min(samples[name]), 3),
            "gflops_cpu": round(work / median[1] / 1e3, 2) if median[1] > 0 else None,
            "median_cpu_us": round(median[1], 3),
            "reps": len(samples[name]),
            "max_rel_error": (None if shape["kind"] == "weight_grad_block"
                              else float(f"{max_rel_error(shape, job):.2e}")),
            "torch_version": torch.__version__,
        })
        print(json.dumps(line, separators=(",", ":")), flush=True)
    print(json.dumps({
        "bench": "gemm_iteration", "library": blas["library"], "job": shapes[0]["job"],
        "world_size": shapes[0]["world_size"], "threads": torch.get_num_threads(),
        "blas_threads": blas["blas_threads"], "gflop": round(flops / 1e9, 6),
        "ms_blocked_dw": round(blocked_us[0] / 1e3, 4), "ms_whole_dw": round(whole_us[0] / 1e3, 4),
        "ms_blocked_dw_cpu": round(blocked_us[1] / 1e3, 4),
        "ms_whole_dw_cpu": round(whole_us[1] / 1e3, 4),
        "cpu_per_wall": round(cpu / wall, 3) if wall else None,
        "torch_version": torch.__version__, "blas_info": blas["blas_info"],
    }, separators=(",", ":")), flush=True)


def show_autograd_ops(shapes: list) -> None:
    """The ops and input shapes autograd runs for one forward and backward of an MLP with the
    first job's layer sizes (from its forward lines) and batch."""
    forwards = sorted({s["layer"]: s for s in shapes if s["kind"] == "forward"}.values(),
                      key=lambda s: s["layer"])
    sizes = [forwards[0]["k"]] + [s["n"] for s in forwards]
    batch = forwards[0]["m"]
    modules = []
    for i in range(len(sizes) - 1):
        modules += [torch.nn.Linear(sizes[i], sizes[i + 1]), torch.nn.ReLU()]
    model = torch.nn.Sequential(*modules[:-1])
    x, target = torch.rand(batch, sizes[0]), torch.rand(batch, sizes[-1])
    with torch.autograd.profiler.profile(record_shapes=True) as prof:
        torch.nn.functional.mse_loss(model(x), target).backward()
    ops = [{"op": e.name, "input_shapes": [list(s) for s in e.input_shapes if s]}
           for e in prof.function_events if e.name in ("aten::addmm", "aten::mm")]
    print(json.dumps({"bench": "torch_autograd_ops", "job": forwards[0]["job"],
                      "torch_version": torch.__version__, "ops": ops},
                     separators=(",", ":")), flush=True)


def main() -> int:
    args = parse_args()
    torch.set_num_threads(1)
    blas = describe_blas()
    shapes = read_shapes(args.shapes)
    if not shapes:
        raise SystemExit("torch_gemm: no gemm_shape lines in --shapes")
    jobs = {}
    for shape in shapes:
        jobs.setdefault(shape["job"], []).append(shape)
    if args.show_autograd_ops:
        show_autograd_ops(next(iter(jobs.values())))
        return 0
    with torch.no_grad():
        for job_shapes in jobs.values():
            run_job(job_shapes, args.reps, args.warmup, blas)
    return 0


if __name__ == "__main__":
    sys.exit(main())
