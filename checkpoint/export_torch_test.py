#!/usr/bin/env python3
"""torch loads what export writes: the files of export_torch_fixture (a bf16 checkpoint with fp32
masters at W=3, and an fp16 one without masters at W=2), read with tools/safetensors_file.py, go
into torch.nn.Sequential(Linear(10, 64), ReLU(), Linear(64, 10)).load_state_dict(strict=True)
and hold exactly the values the fixture wrote: the masters, and the fp16 params widened.

Run by export_torch_test.sh (Debian's python3 with python3-torch).
"""

import argparse
import os
import subprocess
import sys

import torch

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO_ROOT, "tools"))
import safetensors_file  # noqa: E402  (no PyPI package in CI)


def fixture_values(name, shape):
    """export_torch_fixture's element values: k / 1024 with k = (i * 7919 + len(name) * 131) %
    2001 - 1000, exact in float32."""
    index = torch.arange(int(torch.tensor(shape).prod()), dtype=torch.int64)
    k = (index * 7919 + len(name) * 131) % 2001 - 1000
    return (k.to(torch.float64) / 1024).to(torch.float32).reshape(shape)


def model():
    return torch.nn.Sequential(torch.nn.Linear(10, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10))


def check_file(path, expected_metadata):
    tensors, metadata = safetensors_file.read_safetensors(path)
    if metadata != expected_metadata:
        raise AssertionError(f"{path}: metadata {metadata}, expected {expected_metadata}")
    dtypes = {name: tensor.dtype for name, tensor in tensors.items()}
    if set(dtypes.values()) != {"F32"}:
        raise AssertionError(f"{path}: dtypes {dtypes}, expected F32 only")
    net = model()
    # strict=True: every name and shape must be torch's, with nothing missing or extra.
    net.load_state_dict(safetensors_file.to_torch(tensors), strict=True)
    for name, param in net.state_dict().items():
        expected = fixture_values(name, tuple(param.shape))
        if not torch.equal(param, expected):
            diff = (param - expected).abs().max().item()
            raise AssertionError(f"{path}: {name} differs from the fixture (max |diff| {diff})")
    out = net(torch.ones(3, 10))
    if out.shape != (3, 10) or not torch.isfinite(out).all():
        raise AssertionError(f"{path}: forward gave {out}")
    print(f"ok: {path}: {sorted(tensors)} load into nn.Sequential and hold the fixture's values")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--fixture", required=True)
    parser.add_argument("--work_dir", required=True)
    args = parser.parse_args()
    subprocess.run([args.fixture, args.work_dir], check=True)

    # The fixture's values differ from their bf16 roundings, so exporting the bf16 params instead
    # of the masters would fail the masters' check.
    weight = fixture_values("0.weight", (64, 10))
    assert not torch.equal(weight, weight.to(torch.bfloat16).to(torch.float32))

    job = {"format": "pt", "zeroshard.job_id": "job-000007"}
    check_file(os.path.join(args.work_dir, "masters.safetensors"),
               {**job, "zeroshard.step": "20", "zeroshard.source": "final"})
    check_file(os.path.join(args.work_dir, "fp16.safetensors"),
               {**job, "zeroshard.step": "12", "zeroshard.source": "step 12"})


if __name__ == "__main__":
    main()
