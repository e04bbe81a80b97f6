"""A zeroshard.torch.ShardedOptimizer's attachment to its worker and its lifecycle: submitting
or joining the job (rank 0 submits, the others and a restarted script join), the hello and the
welcome, the model's parameters onto the worker's shared blocks, and the end (finish). Its state
is explicit (Attachment.State), as torch's ZeroRedundancyOptimizer keeps its _OverlapStatus.
"""

import enum
import os
import time
import traceback
import weakref

import grpc
import torch

from zeroshard import _channel
from zeroshard._attach import AttachConnection, WrongWorker
from zeroshard._jobs import find_job
from zeroshard._proto.zeroshard.v1 import attach_pb2
from zeroshard._proto.zeroshard.v1 import coordinator_pb2
from zeroshard._proto.zeroshard.v1 import coordinator_pb2_grpc
from zeroshard._proto.zeroshard.v1 import job_pb2
from zeroshard._torch_gradients import GradientHandOver
from zeroshard._torch_state_dict import OptimizerState

# How long a rank waits for rank 0's job to appear, and for its worker to take it.
_JOB_TIMEOUT_S = 120.0
# While a trainer waits for its welcome, it asks the coordinator this often whether the job
# ended meanwhile (then no generation will ever welcome it).
_WELCOME_POLL_S = 1.0
_FINAL_STATES = (job_pb2.SUCCEEDED, job_pb2.FAILED, job_pb2.CANCELLED)

# The attachments built and not finished in this process (at most one: check_no_live_attachment).
_live_attachments = weakref.WeakSet()
_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))


def _caller_location():
    """Where the script called into zeroshard ("train.py:42"), for messages."""
    for frame in reversed(traceback.extract_stack()):
        if not os.path.abspath(frame.filename).startswith(_PACKAGE_DIR + os.sep):
            return f"{frame.filename}:{frame.lineno}"
    return "an unknown place"


def check_no_live_attachment():
    """RuntimeError naming the ShardedOptimizer that is alive (built and not finished) in this
    process, if one is: each needs a job of its own on this rank's worker, which runs one job at
    a time, so a second one would wait for a worker that never comes."""
    for live in list(_live_attachments):
        if not live.finished:
            raise RuntimeError(
                f"another ShardedOptimizer is alive in this process (built at {live.built_at}, "
                f"{live.state.value}{', job ' + live.job_id if live.job_id else ''}): one "
                "ShardedOptimizer per process at a time, since each has a job of its own and "
                "this rank's worker runs one job at a time. Put every parameter in one "
                "ShardedOptimizer (param_groups=[...] for different hyperparameters), or call "
                "zt.finish(first_optimizer) before building another")


class Attachment:
    """One optimizer's attachment, from its construction to its end.

        CONSTRUCTING --> BUILT --> ATTACHING --> ATTACHED --> FINISHED
                           |           |                         ^
                           |           +--> FAILED --------------+
                           +-------------------------------------+

    CONSTRUCTING: torch.optim.Optimizer.__init__ adds the constructor's groups. BUILT: the groups
    may still change (add_param_group), no job exists. ATTACHING: the job is submitted or joined
    and the worker is greeted, at the first need (ensure). ATTACHED: the parameters are views of
    the worker's blocks; `hand_over` and `state_dicts` serve the steps. FAILED: the job was joined
    but attaching failed; every later need raises the failure again. FINISHED: zt.finish; the
    connection is closed. A spec the job cannot take raises in BUILT and stays there.

    Set once ATTACHING began and kept afterwards (FINISHED included): job_id; once ATTACHED:
    start_step, layouts, plan, param_views, grad_views, hand_over, state_dicts. `connection`:
    open from ATTACHING to FINISHED (None before, after, and in FAILED). Thread contract: the
    training thread only."""

    class State(enum.Enum):
        CONSTRUCTING = "constructing"
        BUILT = "built"
        ATTACHING = "attaching"
        ATTACHED = "attached"
        FAILED = "failed"
        FINISHED = "finished"

    _TRANSITIONS = {
        State.CONSTRUCTING: {State.BUILT},
        State.BUILT: {State.ATTACHING, State.FINISHED},
        State.ATTACHING: {State.ATTACHED, State.FAILED},
        State.ATTACHED: {State.FINISHED},
        State.FAILED: {State.FINISHED},
        State.FINISHED: set(),
    }

    def __init__(self, env, settings):
        """`settings`: the optimizer's JobSettings. RuntimeError while another ShardedOptimizer
        of this process is alive (check_no_live_attachment)."""
        check_no_live_attachment()
        self._env = env
        self._settings = settings
        self.state = Attachment.State.CONSTRUCTING
        self.failure = None
        self.connection = None
        self.job_id = None
        self.start_step = None
        self.layouts = None
        self.plan = None
        self.param_views = None
        self.grad_views = None
        self.pool_block = None  # zero3: the gather pool's block
        self.hand_over = None
        self.state_dicts = None
        self.built_at = _caller_location()

    def _enter(self, state):
        if state not in Attachment._TRANSITIONS[self.state]:
            raise AssertionError(f"attachment: {self.state.value} -> {state.value}")
        self.state = state

    def built(self):
        """The constructor is done: the groups are the user's to change until the first need.
        From now until finish(), no other ShardedOptimizer may be built in this process."""
        self._enter(Attachment.State.BUILT)
        _live_attachments.add(self)

    @property
    def attached(self):
        return self.state is Attachment.State.ATTACHED

    @property
    def finished(self):
        return self.state is Attachment.State.FINISHED

    def ensure(self, plan_job, param_groups, lr, from_backward=False):
        """Submits or joins the job and attaches, unless done (or under way). `plan_job()`: the
        (JobPlan, JobSpec) of the groups as they are now; a ValueError from it leaves the state
        BUILT with nothing submitted. A failure after the job was joined is final: every later
        need raises it again. `param_groups`, `lr`: the optimizer's, for its state dicts."""
        if self.state in (Attachment.State.ATTACHED, Attachment.State.ATTACHING):
            return
        if self.state is Attachment.State.FINISHED:
            raise RuntimeError("this ShardedOptimizer has finished (zt.finish)")
        if self.state is Attachment.State.FAILED:
            raise RuntimeError(f"this ShardedOptimizer could not attach to its worker: "
                               f"{self.failure}")
        plan, spec = plan_job()
        self._enter(Attachment.State.ATTACHING)
        try:
            self.job_id = self._join_job(spec)
            self.connection = AttachConnection(self._env.attach_socket,
                                               worker=self._expected_worker())
            self._attach(plan, from_backward)
        except BaseException as e:
            self._enter(Attachment.State.FAILED)
            self.failure = f"{type(e).__name__}: {e}"
            if self.connection is not None:
                self.connection.close()
                self.connection = None
            raise
        self.state_dicts = OptimizerState(self._settings, param_groups, lr, plan,
                                          self.connection, self.job_id)
        self._enter(Attachment.State.ATTACHED)

    def finish(self, failure=None):
        """FINISHED: an attached rank tells its worker, which ends the run successfully once
        every rank finished, or, with `failure` (the script's uncaught exception), fails the run
        with that text (the job is then retried per max_attempts); the connection closes in any
        case."""
        previous = self.state
        self._enter(Attachment.State.FINISHED)
        connection, self.connection = self.connection, None
        if connection is None:
            return
        if previous is not Attachment.State.ATTACHED:
            connection.close()
            return
        request = attach_pb2.AttachRequest()
        request.finish.SetInParent()
        if failure:
            request.finish.failure = failure
        try:
            connection.call(request)
        finally:
            connection.close()

    # ---- Submitting or joining the job ----

    def _join_job(self, spec):
        """The id of this run's job (spec.run_key, an exact lookup among the caller's jobs):
        rank 0 submits it unless a restarted script finds it still running (then every rank
        joins it); the other ranks wait for it."""
        channel = _channel.coordinator_channel(self._env.coordinator)
        stub = coordinator_pb2_grpc.CoordinatorStub(channel)
        try:
            if self._env.rank == 0:
                existing = find_job(stub, spec.run_key)
                if existing is None:
                    job = stub.SubmitJob(coordinator_pb2.SubmitJobRequest(spec=spec), timeout=30)
                    return job.id
                if existing.state in _FINAL_STATES:
                    raise RuntimeError(
                        f"job {existing.id} ({spec.name}) already ended "
                        f"({job_pb2.JobState.Name(existing.state)}: {existing.message}); a "
                        "restarted script cannot resume it")
                return existing.id
            deadline = time.monotonic() + _JOB_TIMEOUT_S
            while time.monotonic() < deadline:
                job = find_job(stub, spec.run_key)
                if job is not None and job.state not in _FINAL_STATES:
                    return job.id
                time.sleep(0.05)
            raise RuntimeError(f"rank 0 did not submit job {spec.name} (or it ended) within "
                               f"{_JOB_TIMEOUT_S:.0f} s")
        except grpc.RpcError as e:
            raise RuntimeError(f"the coordinator at {self._env.coordinator} refused the job: "
                               f"{e.code().name}: {e.details()}") from None
        finally:
            channel.close()

    def _expected_worker(self):
        return f"worker {self._env.workers[self._env.rank]}"

    def _check_worker_identity(self, welcome):
        """WrongWorker unless the worker that welcomed this rank is the one the launcher chose
        for it (ZEROSHARD_WORKERS, where the job pins the rank): checked before anything is
        mapped or written."""
        expected = self._env.workers[self._env.rank]
        if welcome.worker_name != expected:
            answered = (f"worker {welcome.worker_name} ({welcome.worker_id})"
                        if welcome.worker_name else "a worker that does not say its name")
            raise WrongWorker(
                f"the attach socket {self._env.attach_socket} is served by {answered}, not by "
                f"worker {expected}, which runs rank {self._env.rank} of job {self.job_id} "
                "(ZEROSHARD_WORKERS): refusing to attach")

    def _await_welcome(self):
        """Waits for the worker's answer to the hello: it comes once the worker runs this
        rank of the job's next generation, which never happens if the job ends first."""
        channel = _channel.coordinator_channel(self._env.coordinator)
        stub = coordinator_pb2_grpc.CoordinatorStub(channel)
        try:
            while not self.connection.wait_readable(_WELCOME_POLL_S):
                try:
                    job = stub.GetJob(coordinator_pb2.GetJobRequest(job_id=self.job_id),
                                      timeout=30)
                except grpc.RpcError:
                    continue  # the coordinator may be restarting: keep waiting for the worker
                if job.state in _FINAL_STATES:
                    raise RuntimeError(
                        f"job {self.job_id} ended ({job_pb2.JobState.Name(job.state)}: "
                        f"{job.message}) before the worker welcomed rank {self._env.rank}")
        finally:
            channel.close()
        response, _ = self.connection.receive()
        return response.welcome

    # ---- The parameters onto the worker's blocks ----

    def _attach(self, plan, from_backward):
        """Hello, welcome, the parameters onto the worker's shared blocks. `from_backward`: the
        first need is a backward whose forward did not go through the model's forward pre-hook
        (it called model.forward or a submodule): it ran on the model's own parameters, which
        must then be the job's."""
        hello = attach_pb2.AttachRequest()
        hello.hello.job_id = self.job_id
        hello.hello.rank = self._env.rank
        hello.hello.world_size = self._env.world_size
        hello.hello.device_kind = plan.device.type
        self.connection.send(hello)
        welcome = self._await_welcome()
        self._check_worker_identity(welcome)
        self._check_worker_device(plan, welcome)
        self.start_step = welcome.start_step
        if len(welcome.tensors) != len(plan.params):
            raise ValueError(f"the job has {len(welcome.tensors)} parameters, this model "
                             f"{len(plan.params)}: the ranks' models differ")
        self.layouts = list(welcome.tensors)
        self.plan = plan
        if welcome.mode == "zero3":
            self._attach_sharded(plan, welcome, from_backward)
            return
        self._map_views(plan, welcome, from_backward)
        if welcome.needs_initial_parameters:
            self.synchronize()
            request = attach_pb2.AttachRequest()
            request.initial_parameters.SetInParent()
            self.connection.call(request)
            # The worker answers once rank 0's values are every rank's (DDP's broadcast at
            # construction): a rank seeded otherwise now holds rank 0's model.
            if from_backward:
                self._check_backward_parameters(plan, "the job starts from rank 0's initial "
                                                "parameters (as DDP broadcasts them)")
        with torch.no_grad():
            for p, view in zip(plan.params, self.param_views):
                p.data = view
            self.hand_over = GradientHandOver(self._settings.mode, plan, self.connection,
                                              self.layouts, self.grad_views, self.view,
                                              self.synchronize)

    def _attach_sharded(self, plan, welcome, from_backward):
        """zero3: no parameter block; the initial values go to the worker one tensor at a time
        (each rank keeps only its owned pieces of rank 0's), and the gather pool's block is
        where each module's full values are read from (_torch_zero3.ShardedParameters)."""
        self._check_layouts(plan)
        if from_backward:
            raise RuntimeError(
                "zero3: this backward ran on the model's own parameters, but its forward did not "
                "go through the model (the ShardedOptimizer attaches at the model's first eager "
                "forward, where zero3 installs the hooks that gather each module); call the "
                "model itself, or read opt.start_step before the first forward")
        if welcome.needs_initial_parameters:
            for t, p in enumerate(plan.params):
                request = attach_pb2.AttachRequest()
                request.initial_tensor.tensor = t
                response, _ = self.connection.call(request)
                place = self.view(response.place.block, response.place.offset, p.numel(),
                                  p.shape)
                place.copy_(p.detach())
                self.synchronize()
                written = attach_pb2.AttachRequest()
                written.initial_parameters.SetInParent()
                self.connection.call(written)
        self.pool_block = welcome.gather_pool_block
        self.param_views = None
        self.grad_views = [None] * len(plan.params)
        self.hand_over = GradientHandOver("zero3", plan, self.connection, self.layouts,
                                          self.grad_views, self.view, self.synchronize)

    def pool_view(self, offset, elements, shape):
        """zero3: a tensor over the gather pool's block (valid until its release)."""
        return self.view(self.pool_block, offset, elements, shape)

    def _check_layouts(self, plan):
        for name, p, layout in zip(plan.names, plan.params, self.layouts):
            if layout.name != name or list(layout.shape) != list(p.shape):
                raise ValueError(f"parameter {name}: shape {list(p.shape)}, but the job's tensor "
                                 f"is {layout.name} of shape {list(layout.shape)} (the ranks' "
                                 "models differ)")

    def _map_views(self, plan, welcome, from_backward):
        """param_views and grad_views (None for a tensor without a shared gradient) of the
        worker's blocks; the initial parameters written when the job needs them."""
        self._check_layouts(plan)
        self.param_views = []
        self.grad_views = []
        for name, p, layout in zip(plan.names, plan.params, self.layouts):
            view = self.view(layout.param_block, layout.param_offset, layout.elements, p.shape)
            if welcome.needs_initial_parameters:
                view.copy_(p.detach())
            elif from_backward and not torch.equal(view, p.detach()):
                raise RuntimeError(
                    f"parameter {name}: the job resumed at step {welcome.start_step} with the "
                    "checkpoint's parameters, but this backward ran on the model's own: its "
                    "forward did not go through the model (the ShardedOptimizer attaches at the "
                    "model's first forward); read opt.start_step before the first forward")
            self.param_views.append(view)
            if layout.grad_block >= 0:
                self.grad_views.append(
                    self.view(layout.grad_block, layout.grad_offset, layout.elements, p.shape))
            else:
                self.grad_views.append(None)

    def _check_backward_parameters(self, plan, why):
        """RuntimeError naming the first parameter whose own values (which the backward that
        attached ran on) differ from the job's (its view): that backward's gradients would be
        those of another model."""
        for name, p, view in zip(plan.names, plan.params, self.param_views):
            if not torch.equal(view, p.detach()):
                raise RuntimeError(
                    f"parameter {name}: {why}, but this backward ran on this rank's own values: "
                    "its forward did not attach (the ShardedOptimizer attaches at the model's "
                    "first eager forward; a model compiled after the optimizer, model.forward or "
                    "a submodule called directly do not); read opt.start_step before the first "
                    "forward, which attaches")

    def _check_worker_device(self, plan, welcome):
        device, first_name = plan.device, plan.names[0]
        worker_kind = welcome.device_kind or "cpu"
        if worker_kind != device.type:
            raise ValueError(f"parameter {first_name}: on {device}, but the worker "
                             f"holds its buffers on {worker_kind}: move the model there")
        if worker_kind == "cuda":
            bus_id = welcome.cuda_device.pci_bus_id
            ordinal = self.connection.cuda_device_ordinal(bus_id)
            if ordinal != device.index:
                raise ValueError(
                    f"parameter {first_name}: on {device}, but this rank's worker runs "
                    f"on the GPU with PCI bus id {bus_id} (cuda:{ordinal} in this process): "
                    f"move the model to cuda:{ordinal}")

    def synchronize(self):
        """CUDA: this process's writes to the worker's blocks are complete before the worker is
        told (the protocol's contract); a no-op on the CPU."""
        if self.plan.device.type == "cuda":
            torch.cuda.synchronize(self.plan.device)

    def view(self, block, offset, elements, shape):
        """A tensor of `shape` over `elements` float32 of the worker's `block` at `offset`."""
        device = self.plan.device
        if device.type == "cuda":
            flat = torch.as_tensor(self.connection.cuda_block(block).view(offset, elements),
                                   device=device)
        else:
            flat = torch.frombuffer(self.connection.block(block), dtype=torch.float32,
                                    count=elements, offset=offset)
        return flat.view(tuple(shape))

    def check_parameters(self):
        """ValueError naming a parameter whose data the script replaced since the attach."""
        if self.param_views is None:
            return  # zero3: the parameters are the model's own storage, refilled at each gather
        for name, p, view in zip(self.plan.names, self.plan.params, self.param_views):
            if p.data_ptr() != view.data_ptr():
                raise ValueError(f"parameter {name}: its data was replaced after the "
                                 "ShardedOptimizer attached (at the model's first forward; the "
                                 "model changed)")
