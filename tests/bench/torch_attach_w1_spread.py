#!/usr/bin/env python3
"""torch's own spread for torch_attach.py --model=gpt (issue 39's agreement target): trains the
same GPT in one process at W = 1 on both ranks' batches (the mean of the two ranks' losses, as
the W = 2 runs average their gradients; torch's fastest AdamW), and compares rank 0's loss at
every iteration with the `losses_rank0` of each variant in a saved torch_attach.py output.

    /opt/zs-torch/bin/python tests/bench/torch_attach_w1_spread.py OUTPUT.jsonl

Prints one JSON line: {"bench":"torch_attach_w1_spread", "<variant>_vs_w1": largest relative
difference, ..., "zero3_vs_fsdp2": ...}. Not a test; the figures are in
docs/performance/torch_attach.md.
"""

import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_attach  # noqa: E402  (the same model, data and hyperparameters)


def largest_relative(a, b):
    return max(abs(x - y) / abs(y) for x, y in zip(a, b))


def main(argv):
    if len(argv) != 1:
        sys.exit(__doc__)
    runs = {}
    with open(argv[0]) as f:
        for line in f:
            if line.startswith("{") and "losses_rank0" in line:
                record = json.loads(line)
                runs[record["variant"]] = record["losses_rank0"]
    torch.set_num_threads(1)
    args = torch_attach.parse_args(["--model=gpt"])
    model = torch_attach.build_model(torch, args)
    optimizer = torch.optim.AdamW(model.parameters(), lr=torch_attach.LEARNING_RATE,
                                  weight_decay=torch_attach.WEIGHT_DECAY, fused=True)
    batches = [torch_attach.make_batches(torch, args, rank) for rank in (0, 1)]
    iterations = max(len(losses) for losses in runs.values())
    w1 = []
    for step in range(iterations):
        losses = [torch_attach.loss_of(torch, args, model, *ranks[step % len(ranks)])
                  for ranks in batches]
        (sum(losses) / len(losses)).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        w1.append(losses[0].item())
    line = {"bench": "torch_attach_w1_spread", "iterations": iterations}
    for variant, losses in runs.items():
        line[f"{variant}_vs_w1"] = largest_relative(losses, w1)
    if "torch_fsdp2" in runs and "zeroshard_zero3" in runs:
        line["zero3_vs_fsdp2"] = largest_relative(runs["zeroshard_zero3"], runs["torch_fsdp2"])
    print(json.dumps(line))


if __name__ == "__main__":
    main(sys.argv[1:])
