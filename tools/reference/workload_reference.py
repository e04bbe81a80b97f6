#!/usr/bin/env python3
"""NumPy reference of the teacher-student MLP workload's generator (docs/workloads.md): writes
the first samples' inputs and the student's and teacher's initial tensors as raw float32 files."""

import argparse
import os
import sys

import numpy as np

PRESETS = {
    "seed": [10, 64, 10],
    "small": [512, 1024, 512],
    "medium": [1024, 4096, 4096, 1024],
    "large": [8192, 12288, 12288, 8192],
    "deep": [1024] + [2048] * 17 + [1024],
}

GOLDEN_GAMMA = np.uint64(0x9E3779B97F4A7C15)
MIX_MULTIPLIER_1 = np.uint64(0xBF58476D1CE4E5B9)
MIX_MULTIPLIER_2 = np.uint64(0x94D049BB133111EB)

ROLE_INPUTS = 0
ROLE_STUDENT = 1
ROLE_TEACHER = 2


def mix(z):
    """SplitMix64's output function on a uint64 array (arithmetic wraps modulo 2**64)."""
    z = np.asarray(z, dtype=np.uint64)
    with np.errstate(over="ignore"):
        z = (z ^ (z >> np.uint64(30))) * MIX_MULTIPLIER_1
        z = (z ^ (z >> np.uint64(27))) * MIX_MULTIPLIER_2
    return z ^ (z >> np.uint64(31))


def splitmix64_output(state, n):
    """Output number n (0-based) of SplitMix64 started at `state`: mix(state + (n + 1) * gamma)."""
    n = np.asarray(n, dtype=np.uint64)
    with np.errstate(over="ignore"):
        return mix(np.uint64(state) + (n + np.uint64(1)) * GOLDEN_GAMMA)


def stream_key(seed, stream):
    first = splitmix64_output(np.uint64(seed), np.uint64(0))
    return splitmix64_output(first, np.uint64(stream))


def stream_id(role, tensor_number):
    return (role << 32) | tensor_number


def uniform_symmetric(seed, stream, first_index, count):
    """Uniform float32 in [-1, 1): the top 24 bits u of each value give (u - 2**23) * 2**-23."""
    indices = np.arange(count, dtype=np.uint64) + np.uint64(first_index)
    bits = splitmix64_output(stream_key(seed, stream), indices)
    top = (bits >> np.uint64(40)).astype(np.int64) - (1 << 23)
    return top.astype(np.float32) * np.float32(2.0**-23)


def init_bound(fan_in):
    """1 / sqrt(fan_in), every step rounded to float32 (IEEE sqrt and division)."""
    return np.float32(1.0) / np.sqrt(np.float32(fan_in))


def layer_tensor(role, sizes, seed, layer, bias):
    fan_in, fan_out = sizes[layer], sizes[layer + 1]
    count = fan_out if bias else fan_out * fan_in
    values = uniform_symmetric(seed, stream_id(role, 2 * layer + (1 if bias else 0)), 0, count)
    values = values * init_bound(fan_in)
    return values if bias else values.reshape(fan_out, fan_in)


def inputs(sizes, seed, first_sample, count):
    values = uniform_symmetric(seed, stream_id(ROLE_INPUTS, 0), first_sample * sizes[0],
                               count * sizes[0])
    return values.reshape(count, sizes[0])


def main(argv):
    parser = argparse.ArgumentParser(description=__doc__)
    group = parser.add_mutually_exclusive_group(required=True)
    group.add_argument("--preset", choices=sorted(PRESETS))
    group.add_argument("--layer_sizes", help="comma-separated sizes, e.g. 10,64,10")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--samples", type=int, default=4, help="how many inputs from sample 0")
    parser.add_argument("--out", required=True, help="directory for the .f32 files")
    args = parser.parse_args(argv)
    sizes = PRESETS[args.preset] if args.preset else [int(s) for s in args.layer_sizes.split(",")]

    os.makedirs(args.out, exist_ok=True)

    def write(name, array):
        array.astype("<f4").tofile(os.path.join(args.out, name + ".f32"))

    write("inputs", inputs(sizes, args.seed, 0, args.samples))
    for layer in range(len(sizes) - 1):
        for net, role in (("student", ROLE_STUDENT), ("teacher", ROLE_TEACHER)):
            for kind in ("weight", "bias"):
                tensor = layer_tensor(role, sizes, args.seed, layer, kind == "bias")
                write(f"{net}.layers.{layer}.{kind}", tensor)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
