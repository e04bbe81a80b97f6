"""Weights out as torch expects them, and the job's step as the model's (issue 27 items 3 and 4),
run by `python3 -m zeroshard.launch --workers 2` (attach_export_rewind_test.py). Rank 0 prints
one JSON line per check ({"check", "ok", ...}); the script exits 1 when a check fails.

The model is pytorch/examples' word_language_model RNNModel (LSTM) with tied weights: its
decoder.weight is its encoder.weight, one Parameter that named_parameters() lists once and
state_dict() lists twice. Trained with zt.ShardedOptimizer (zero2, AdamW, a checkpoint every 10
steps): a state_dict() at step 30, steps to 50, then

- `zeroshard export JOB` without --step (the job running) exports the latest committed checkpoint,
  says its step (50), and a plain torch model loads the file with strict=True;
- load_state_dict() of the step-30 state: the job's step goes back to 30 (its reported progress
  and latest checkpoint too), the steps 30..49 run again bitwise as before, and the final
  checkpoint names step 50; every manifest committed before the load is intact or marked
  superseded beside its step's new checkpoint, none overwritten; the old step-50 state dict is
  refused (its checkpoint was superseded);
- zt.save(model, path) writes every name of model.state_dict(), and after zt.finish() the job's
  final export does too: plain torch loads both with strict=True, equal to the trained
  parameters; the job's step ended at 50 (50 + 20 steps run, not 70);
- a torch-format state moves the job to its `step` (AdamW's), or leaves it (SGD's: none).
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

import torch
from torch import nn

import zeroshard
import zeroshard.torch as zt
from zeroshard import _safetensors
from zeroshard._proto.zeroshard.v1 import job_pb2

VOCAB = 40
EMBED = 16  # = the hidden size: tied weights need it (pytorch/examples' check)
SEQUENCE = 8
BATCH = 4
SAVE_STEP = 30
LAST_STEP = 50
EVERY = 10

results = []


def report(check, ok, **details):
    results.append(bool(ok))
    if zt.rank() == 0:
        print(json.dumps({"check": check, "ok": bool(ok), **details}), flush=True)


class RNNModel(nn.Module):
    """pytorch/examples word_language_model's RNNModel('LSTM', ..., tie_weights=True), small."""

    def __init__(self):
        super().__init__()
        self.drop = nn.Dropout(0.0)
        self.encoder = nn.Embedding(VOCAB, EMBED)
        self.rnn = nn.LSTM(EMBED, EMBED, 1)
        self.decoder = nn.Linear(EMBED, VOCAB)
        self.decoder.weight = self.encoder.weight

    def forward(self, tokens):
        output, _ = self.rnn(self.drop(self.encoder(tokens)))
        return self.decoder(self.drop(output))


def build_model():
    torch.manual_seed(0)
    return RNNModel()


def batch(step, rank):
    generator = torch.Generator().manual_seed(1000 * step + rank)
    tokens = torch.randint(0, VOCAB, (SEQUENCE + 1, BATCH), generator=generator)
    return tokens[:-1], tokens[1:]


def run_steps(model, optimizer, first, last):
    for step in range(first, last):
        inputs, targets = batch(step, zt.rank())
        loss = nn.functional.cross_entropy(model(inputs).view(-1, VOCAB), targets.reshape(-1))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()


def parameters(model):
    return {name: p.detach().clone() for name, p in model.named_parameters()}


def same(a, b):
    return sorted(a) == sorted(b) and all(torch.equal(a[name], b[name]) for name in a)


def read_safetensors(path):
    """{name: tensor} of a safetensors file (no safetensors package)."""
    tensors, _ = _safetensors.read_safetensors(path)
    return _safetensors.to_torch(tensors)


def strict_load(path, expected):
    """Loads `path` into a fresh plain-torch model with strict=True: (ok, details)."""
    tensors = read_safetensors(path)
    plain = RNNModel()
    try:
        plain.load_state_dict(tensors, strict=True)
    except RuntimeError as e:
        return False, {"error": str(e)[:300], "names": sorted(tensors)}
    # The tied weight is one Parameter again; every value is the trained one.
    equal = same(parameters(plain), expected) and \
        plain.decoder.weight.data_ptr() == plain.encoder.weight.data_ptr()
    return equal, {"names": sorted(tensors), "values_equal": equal}


def export(cli, job_id, path, step=None):
    """`zeroshard export JOB --output PATH [--step N]` ($ZEROSHARD_COORDINATOR): (exit code,
    stderr)."""
    command = [cli, "export", job_id, f"--output={path}"]
    if step is not None:
        command.append(f"--step={step}")
    run = subprocess.run(command, capture_output=True, text=True, timeout=120)
    return run.returncode, run.stderr.strip()


def manifests(job_dir):
    """{path: bytes} of every manifest.json under the job's checkpoint directory."""
    found = {}
    for entry in sorted(os.listdir(job_dir)):
        path = os.path.join(job_dir, entry, "manifest.json")
        if os.path.isfile(path):
            with open(path, "rb") as f:
                found[path] = f.read()
    return found


def without_mark(raw):
    manifest = json.loads(raw)
    manifest.pop("superseded", None)
    return manifest


def check_manifests(before, job_dir):
    """Every manifest committed before the load: the same bytes where it was, or moved aside
    (superseded-step-*) with everything as committed plus the mark. None overwritten."""
    now = manifests(job_dir)
    intact, superseded, lost = [], [], []
    for path, raw in before.items():
        step = json.loads(raw)["step"]
        if now.get(path) == raw:
            intact.append(int(step))
            continue
        marked = [p for p, r in now.items()
                  if os.path.basename(os.path.dirname(p)).startswith("superseded-step-") and
                  "superseded" in json.loads(r) and without_mark(r) == json.loads(raw)]
        if len(marked) == 1:
            superseded.append(int(step))
        else:
            lost.append(int(step))
    return sorted(intact), sorted(superseded), sorted(lost)


def job_state(job_id):
    with zeroshard.Client() as client:  # $ZEROSHARD_COORDINATOR
        return client.get(job_id)


def wait_until_ended(job_id, timeout_s=120):
    """The job once it ended (or as it is after `timeout_s`; the caller checks its state)."""
    deadline = time.monotonic() + timeout_s
    job = job_state(job_id)
    while job.state not in (job_pb2.SUCCEEDED, job_pb2.FAILED, job_pb2.CANCELLED) and \
            time.monotonic() < deadline:
        time.sleep(0.1)
        job = job_state(job_id)
    return job


def committed_steps(job_dir):
    """The steps of the job's committed checkpoints that are not superseded."""
    return sorted(int(json.loads(raw)["step"]) for path, raw in manifests(job_dir).items()
                  if not os.path.basename(os.path.dirname(path)).startswith("superseded-"))


def check_torch_format_load(checkpoint_root):
    """A torch-format state (no data position) moves the job to its `step`: AdamW's consolidated
    dict of step 5, loaded at step 8, takes the job to step 5 and retires the checkpoints after it
    and the job's own of step 5 (it holds another state than the one loaded); SGD's, which has no
    step, leaves the job's step where it is. The job's latest checkpoint is then the newest one
    left: which steps those are depends on timing (every 2 steps, a due checkpoint whose writer is
    still busy with the previous one is deferred to the next step), so they are read from the
    job's directory."""
    for kind, hyper, expected_step in (("adamw", {"lr": 1e-2}, 5),
                                       ("sgd", {"lr": 0.05, "momentum": 0.9}, 8)):
        model = build_model()
        optimizer = zt.ShardedOptimizer(model, kind, mode="zero2", checkpoint_every=2,
                                        checkpoint_keep=20, **hyper)
        run_steps(model, optimizer, 0, 5)
        state = optimizer.state_dict(consolidated=True)
        run_steps(model, optimizer, 5, 8)
        job_id = optimizer._job_id
        optimizer.load_state_dict(state)
        if zt.rank() == 0:
            job = job_state(job_id)
            latest = job.latest_checkpoint.step
            left = committed_steps(os.path.join(checkpoint_root, job.spec.checkpoint.dir))
            # AdamW: only checkpoints before step 5 are left; SGD: the ones after 5 stay.
            expected_left = bool(left) and (max(left) < 5 if kind == "adamw" else max(left) >= 6)
            report("torch_format_load_step", job.progress.step == expected_step and
                   expected_left and latest == max(left), optimizer=kind,
                   progress=job.progress.step, latest_checkpoint=latest, committed_left=left)
        zt.finish(optimizer)


def check_zero3_export(cli, out_dir):
    """zero3 (issue 39): `zeroshard export` of a finished zero3 job and zt.save inside
    opt.full_parameters() load into plain torch with strict=True, holding the values read inside
    full_parameters() at the end."""
    model = build_model()
    optimizer = zt.ShardedOptimizer(model, "adamw", lr=1e-2, mode="zero3",
                                    checkpoint_every=EVERY, checkpoint_keep=20)
    run_steps(model, optimizer, 0, EVERY)
    with optimizer.full_parameters(writeback=False):
        trained = parameters(model)
        path = os.path.join(out_dir, "zero3_save.safetensors")
        zt.save(model, path)
    job_id = optimizer._job_id
    if zt.rank() == 0:
        loaded, details = strict_load(path, trained)
        report("zero3_save_strict_load", loaded, **details)
    zt.finish(optimizer)
    if zt.rank() == 0:
        job = wait_until_ended(job_id)
        path = os.path.join(out_dir, "zero3_final.safetensors")
        code, said = export(cli, job_id, path)
        loaded, details = strict_load(path, trained) if code == 0 else (False, {})
        report("zero3_export_strict_load", job.state == job_pb2.SUCCEEDED and code == 0 and
               loaded and f"step {EVERY} (final)" in said, said=said,
               state=job_pb2.JobState.Name(job.state), **details)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--cli", required=True, help="the zeroshard CLI binary")
    args = parser.parse_args()
    zt.init()
    out_dir = tempfile.mkdtemp(prefix=f"zs-export-{zt.rank()}-", dir="/tmp")

    model = build_model()
    tied_names = [name for name in model.state_dict() if name.endswith(".weight") and
                  name.split(".")[0] in ("encoder", "decoder")]
    optimizer = zt.ShardedOptimizer(model, "adamw", lr=1e-2, mode="zero2",
                                    checkpoint_every=EVERY, checkpoint_keep=20)
    run_steps(model, optimizer, 0, SAVE_STEP)
    saved30 = optimizer.state_dict()
    at30 = parameters(model)
    run_steps(model, optimizer, SAVE_STEP, LAST_STEP)
    saved50 = optimizer.state_dict()
    first_run = parameters(model)
    job_id = saved30["job_id"]
    job_dir = os.path.dirname(os.path.dirname(saved30["manifest"]))
    before = manifests(job_dir) if zt.rank() == 0 else {}

    if zt.rank() == 0:
        # The job is running: an export without --step is its latest committed checkpoint.
        path = os.path.join(out_dir, "latest.safetensors")
        code, said = export(args.cli, job_id, path)
        loaded, details = strict_load(path, first_run) if code == 0 else (False, {})
        report("export_latest_while_running", code == 0 and loaded and
               f"step {LAST_STEP} (latest checkpoint)" in said and
               set(tied_names) <= set(details.get("names", [])),
               said=said, **details)
        job = job_state(job_id)
        report("progress_before_load", job.progress.step == LAST_STEP and
               job.latest_checkpoint.step == LAST_STEP, progress=job.progress.step,
               latest_checkpoint=job.latest_checkpoint.step,
               committed=sorted(json.loads(raw)["step"] for raw in before.values()))

    optimizer.load_state_dict(saved30)
    restored = same(parameters(model), at30)
    if zt.rank() == 0:
        job = job_state(job_id)
        report("step_follows_the_load", restored and job.progress.step == SAVE_STEP and
               job.latest_checkpoint.step == SAVE_STEP, parameters_restored=restored,
               progress=job.progress.step, latest_checkpoint=job.latest_checkpoint.step)
    run_steps(model, optimizer, SAVE_STEP, LAST_STEP)
    replayed = same(parameters(model), first_run)
    final = optimizer.state_dict()
    report("replay_names_the_steps_again", replayed and final["step"] == LAST_STEP and
           final["manifest"] == saved50["manifest"] and
           final["commit_time"] != saved50["commit_time"] and
           optimizer.last_step.optimizer_step == LAST_STEP,
           replayed_bitwise=replayed, final_step=final["step"], manifest=final["manifest"],
           optimizer_step=optimizer.last_step.optimizer_step)
    if zt.rank() == 0:
        intact, superseded, lost = check_manifests(before, job_dir)
        # Which steps were committed depends on timing (a due checkpoint whose writer is busy is
        # deferred): every one up to the loaded step stays, every later one is superseded.
        committed = sorted(int(json.loads(raw)["step"]) for raw in before.values())
        report("committed_manifests_intact", not lost and SAVE_STEP in committed and
               intact == [step for step in committed if step <= SAVE_STEP] and
               superseded == [step for step in committed if step > SAVE_STEP],
               intact=intact, superseded=superseded, overwritten=lost, committed=committed)
    # The old step-50 state dict names a checkpoint the job retired: refused, nothing changes.
    try:
        optimizer.load_state_dict(saved50)
        message = None
    except ValueError as e:
        message = str(e)
    report("superseded_state_dict_refused",
           message is not None and "now holds another checkpoint of step 50" in message and
           same(parameters(model), first_run), message=message)

    path = os.path.join(out_dir, "zt_save.safetensors")
    zt.save(model, path)
    if zt.rank() == 0:
        loaded, details = strict_load(path, first_run)
        report("zt_save_strict_load", loaded and set(tied_names) <= set(details["names"]),
               **details)
    zt.finish(optimizer)

    if zt.rank() == 0:
        job = wait_until_ended(job_id)
        path = os.path.join(out_dir, "final.safetensors")
        code, said = export(args.cli, job_id, path)
        loaded, details = strict_load(path, first_run) if code == 0 else (False, {})
        report("export_final_strict_load", job.state == job_pb2.SUCCEEDED and code == 0 and
               loaded and f"step {LAST_STEP} (final)" in said, said=said,
               state=job_pb2.JobState.Name(job.state), **details)
        report("job_step_is_the_model_step", job.progress.step == LAST_STEP and
               job.latest_checkpoint.step == LAST_STEP, progress=job.progress.step,
               latest_checkpoint=job.latest_checkpoint.step)
    check_torch_format_load(os.path.dirname(job_dir))
    check_zero3_export(args.cli, out_dir)
    shutil.rmtree(out_dir, ignore_errors=True)
    return 0 if all(results) else 1


if __name__ == "__main__":
    sys.exit(main())
