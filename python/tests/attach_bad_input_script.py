"""Bad input to zt.ShardedOptimizer, run by `python3 -m zeroshard.launch --workers 1`: each case
must raise an exception whose text names the parameter (issue 13). Prints one JSON line per case;
exits 1 when a case does not raise as expected.
"""

import errno
import json
import os
import sys

import torch

import zeroshard.torch as zt
from zeroshard._proto.zeroshard.v1 import attach_pb2, job_pb2
from zeroshard.client import Client


def linear_model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.ReLU(), torch.nn.Linear(3, 2))


def non_contiguous():
    model = linear_model()
    model[0].weight = torch.nn.Parameter(torch.randn(4, 3).t())
    zt.ShardedOptimizer(model, "sgd", lr=0.1)


def sparse():
    model = linear_model()
    model[2].bias = torch.nn.Parameter(torch.zeros(2).to_sparse())
    zt.ShardedOptimizer(model, "sgd", lr=0.1)


def half_precision():
    model = linear_model()
    model[2].weight = torch.nn.Parameter(torch.zeros(2, 3, dtype=torch.float16))
    zt.ShardedOptimizer(model, "sgd", lr=0.1)


def replaced_after_attaching():
    """The first forward attaches (the parameters become the worker's); replacing .data before
    it is allowed."""
    model = linear_model()
    optimizer = zt.ShardedOptimizer(model, "sgd", lr=0.1)
    try:
        model(torch.randn(5, 4)).sum().backward()
        optimizer.step()
        model[2].weight.data = torch.zeros(2, 3)
        model(torch.randn(5, 4)).sum().backward()
        optimizer.step()
    finally:
        zt.finish(optimizer)


def group_lr_negative():
    model = linear_model()
    biases = [model[0].bias, model[2].bias]
    optimizer = zt.ShardedOptimizer(model, "sgd", lr=0.1,
                                    param_groups=[{"params": biases, "lr": 0.05}])
    try:
        optimizer.param_groups[1]["lr"] = -0.07  # any value torch takes goes; this one not
        model(torch.randn(5, 4)).sum().backward()
        optimizer.step()
    finally:
        zt.finish(optimizer)


def unknown_group_key():
    model = linear_model()
    zt.ShardedOptimizer(model, "adam", lr=0.1,
                        param_groups=[{"params": [model[0].bias], "momentum": 0.9}])


def sparse_embedding():
    model = torch.nn.Sequential(torch.nn.Embedding(10, 4, sparse=True), torch.nn.Linear(4, 2))
    zt.ShardedOptimizer(model, "sgd", lr=0.1)


def param_group_added_after_a_step():
    """add_param_group works until the job is submitted (the model's first forward)."""
    model = linear_model()
    optimizer = zt.ShardedOptimizer(model, "sgd", lr=0.1)
    try:
        model(torch.randn(5, 4)).sum().backward()
        optimizer.step()
        optimizer.add_param_group({"params": [model[0].bias], "lr": 0.01})
    finally:
        zt.finish(optimizer)


# (case, the exception type, text it must contain)
CASES = [
    (non_contiguous, ValueError, "parameter 0.weight: it is not contiguous"),
    (sparse, ValueError, "parameter 2.bias: sparse"),
    (half_precision, ValueError, "parameter 2.weight: dtype torch.float16"),
    (replaced_after_attaching, ValueError, "parameter 2.weight: its data was replaced"),
    (group_lr_negative, ValueError, "param_groups[1]: lr -0.07 must be >= 0"),
    (unknown_group_key, ValueError, "param_groups[0]: keys ['momentum']"),
    # Issue 26: before, backward's hook raised "reshape is not implemented for sparse tensors".
    (sparse_embedding, ValueError, "module 0: Embedding(sparse=True) makes sparse gradients"),
    # Issue 26: before, accepted, then step() raised IndexError. Item 3: before the job is
    # submitted add_param_group works (attach_torch_contract_script.py), after it raises.
    (param_group_added_after_a_step, NotImplementedError,
     "add_param_group: the job was submitted at the model's first forward"),
]


def frozen_parameters_are_left_alone():
    """requires_grad=False is allowed: not sharded, not updated; the rest trains."""
    model = linear_model()
    model[0].weight.requires_grad_(False)
    frozen = model[0].weight.detach().clone()
    trained = model[2].weight.detach().clone()
    optimizer = zt.ShardedOptimizer(model, "sgd", lr=0.1)
    for _ in range(3):
        model(torch.randn(5, 4)).pow(2).sum().backward()
        optimizer.step()
        optimizer.zero_grad()
    zt.finish(optimizer)
    return torch.equal(model[0].weight, frozen) and not torch.equal(model[2].weight, trained)


def a_trainer_cannot_shrink_its_workers_blocks():
    """Issue 25, item 1: a trainer that truncates a shared block it was given (ftruncate to 0)
    used to make the worker's next access raise SIGBUS, killing the daemon with every run on it.
    The blocks' sizes are sealed now: EPERM, and the job trains on."""
    model = linear_model()
    optimizer = zt.ShardedOptimizer(model, "sgd", lr=0.1)
    try:
        request = attach_pb2.AttachRequest()
        request.map_block.block = optimizer._layouts[0].param_block
        _, fd = optimizer._connection.call(request, with_fd=True)
        try:
            os.ftruncate(fd, 0)
            refused = None
        except OSError as e:
            refused = e.errno
        finally:
            os.close(fd)
        for _ in range(3):
            model(torch.randn(5, 4)).pow(2).sum().backward()
            optimizer.step()
            optimizer.zero_grad()
        trained = optimizer.last_step is not None and optimizer.last_step.optimizer_step == 3
    finally:
        zt.finish(optimizer)
    return refused == errno.EPERM and trained


def a_same_named_job_is_never_joined():
    """Issue 25, item 8: rank 0 looked for a running job by its name before submitting (a
    restarted script joins its job), and joined any job so named: here a decoy submitted just
    before, with the name the next ShardedOptimizer's job gets. Ranks now find their job by the
    launcher's random run key, so the decoy is left alone and the run trains in its own job."""
    env = zt.init()
    name = f"{env.run_id}-{zt._jobs_submitted + 1}"
    with Client(env.coordinator) as client:
        decoy = client.submit({"name": name, "workload": {"preset": "seed"},
                               "optimizer": {"kind": "SGD", "lr": 0.1}, "mode": "ZERO2",
                               "steps": 10, "minWorkers": 64})
        try:
            model = linear_model()
            optimizer = zt.ShardedOptimizer(model, "sgd", lr=0.1)
            try:
                own_job = optimizer._job_id != decoy.id
                for _ in range(2):
                    model(torch.randn(5, 4)).pow(2).sum().backward()
                    optimizer.step()
                    optimizer.zero_grad()
                trained = optimizer.last_step.optimizer_step == 2
            finally:
                zt.finish(optimizer)
            decoy_untouched = client.get(decoy.id).state == job_pb2.PENDING
        finally:
            client.cancel(decoy.id, reason="test decoy")
    return own_job and trained and decoy_untouched


def main():
    zt.init()
    failures = 0
    for case, expected_type, expected_text in CASES:
        try:
            case()
            raised = None
        except Exception as e:  # the case's exception is the result
            raised = e
        ok = isinstance(raised, expected_type) and expected_text in str(raised)
        failures += 0 if ok else 1
        print(json.dumps({"case": case.__name__, "ok": ok, "raised": repr(raised),
                          "expected": expected_text}), flush=True)
    ok = frozen_parameters_are_left_alone()
    failures += 0 if ok else 1
    print(json.dumps({"case": "frozen_parameters_are_left_alone", "ok": ok}), flush=True)
    ok = a_same_named_job_is_never_joined()
    failures += 0 if ok else 1
    print(json.dumps({"case": "a_same_named_job_is_never_joined", "ok": ok}), flush=True)
    ok = a_trainer_cannot_shrink_its_workers_blocks()
    failures += 0 if ok else 1
    print(json.dumps({"case": "a_trainer_cannot_shrink_its_workers_blocks", "ok": ok}),
          flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
