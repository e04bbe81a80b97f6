"""A model that fits a worker's --memory_limit_bytes only in zero3 (issue 39), run by
`python3 -m zeroshard.launch --workers 2 [--worker_flag=--memory_limit_bytes=N]` with the mode
as its argument: a GPT-style stack (tied embedding and head, BLOCKS blocks) trains STEPS steps
of AdamW. Rank 0 prints one JSON line: {"mode", "trained", "losses", "worker_counted_bytes"
(what its worker's engine holds, the bytes --memory_limit_bytes bounds), "error" (the
exception's text when the optimizer was refused)}, and before it a {"memory": ...} line: its
worker's whole memory report.
"""

import json
import sys
import time

import torch

import zeroshard
import zeroshard.torch as zt

STEPS = 3
VOCAB = 512
WIDTH = 128
BLOCKS = 8
TOKENS = 16
REPORT_TIMEOUT_S = 30.0


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = torch.nn.LayerNorm(WIDTH)
        self.up = torch.nn.Linear(WIDTH, 4 * WIDTH)
        self.down = torch.nn.Linear(4 * WIDTH, WIDTH)

    def forward(self, x):
        return x + self.down(torch.nn.functional.gelu(self.up(self.norm(x))))


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(5)
        self.embedding = torch.nn.Embedding(VOCAB, WIDTH)
        self.blocks = torch.nn.ModuleList([Block() for _ in range(BLOCKS)])
        self.head = torch.nn.Linear(WIDTH, VOCAB, bias=False)
        self.head.weight = self.embedding.weight

    def forward(self, tokens):
        x = self.embedding(tokens)
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def counted_bytes(job_id):
    """Rank 0's worker's engine memory (the categories its allocator counts) from the job's
    progress."""
    with zeroshard.Client() as client:
        deadline = time.monotonic() + REPORT_TIMEOUT_S
        while True:
            memory = client.get(job_id, timeout=10).progress.memory
            if memory.total_bytes > 0:
                print(json.dumps({"memory": str(memory).replace("\n", "; ")}), flush=True)
                return (memory.params_bytes + memory.grads_bytes + memory.master_bytes +
                        memory.optimizer_state_bytes + memory.bucket_bytes +
                        memory.comm_scratch_bytes + memory.gather_pool_bytes)
            if time.monotonic() > deadline:
                raise RuntimeError(f"job {job_id}: no memory report within {REPORT_TIMEOUT_S} s")
            time.sleep(0.05)


def train_step(model, optimizer, step, rank):
    """One step on rank's batch of `step`: its loss."""
    generator = torch.Generator().manual_seed(17 * step + rank)
    tokens = torch.randint(0, VOCAB, (TOKENS,), generator=generator)
    targets = torch.randint(0, VOCAB, (TOKENS,), generator=generator)
    loss = torch.nn.functional.cross_entropy(model(tokens), targets)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    return loss.item()


def compare():
    """zero2 then zero3 from the same values, rank 1 slowed in every block's backward: the losses
    must be bitwise equal. Run with the worker flag --bucket_pool_size=1, so that a gradient
    hand-over waits for a bucket buffer often and at moments that differ between the ranks:
    before zero3 handed over with waiting, where a reduce-scatter entered the worker's ordered
    collectives among zero3's backward gathers depended on those moments, and the ranks paired
    one rank's reduce-scatter with the other's all-gather (the same sizes: wrong values)."""
    rank = zt.rank()
    losses = {}
    for mode in ("zero2", "zero3"):
        model = Model()
        if rank == 1:
            for block in model.blocks:
                block.register_full_backward_hook(lambda *_: time.sleep(0.002))
        optimizer = zt.ShardedOptimizer(model, "adamw", lr=1e-3, mode=mode)
        losses[mode] = []
        for step in range(STEPS + 3):
            losses[mode].append(train_step(model, optimizer, step, rank))
        zt.finish(optimizer)
    if rank == 0:
        print(json.dumps({"mode": "compare", "losses": losses,
                          "equal": losses["zero2"] == losses["zero3"]}), flush=True)
    return 0


def main():
    mode = sys.argv[1]
    zt.init()
    if mode == "compare":
        return compare()
    rank = zt.rank()
    model = Model()
    line = {"mode": mode, "rank": rank, "trained": False, "losses": []}
    optimizer = zt.ShardedOptimizer(model, "adamw", lr=1e-3, mode=mode)
    try:
        for step in range(STEPS):
            line["losses"].append(train_step(model, optimizer, step, rank))
        if rank == 0:
            line["worker_counted_bytes"] = counted_bytes(optimizer._job_id)
        zt.finish(optimizer)
        line["trained"] = True
    except Exception as e:  # the refusal: reported, the script exits 0 (the test judges it)
        line["error"] = f"{type(e).__name__}: {e}"
    if rank == 0:
        print(json.dumps(line), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
