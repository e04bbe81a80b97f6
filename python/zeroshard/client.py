"""zeroshard.Client: a typed Python client of the coordinator's gRPC API (zeroshard.v1.Coordinator).

Methods return the API's protobuf messages (Job, JobEvent, WorkerInfo, ShardPlan); every failure
is a zeroshard.Error.
"""

import collections.abc
import os
import re

import grpc
from google.protobuf import json_format

from zeroshard import _channel
from zeroshard._proto.zeroshard.v1 import coordinator_pb2
from zeroshard._proto.zeroshard.v1 import coordinator_pb2_grpc
from zeroshard._proto.zeroshard.v1 import job_pb2
from zeroshard._proto.zeroshard.v1 import worker_pb2
from zeroshard.errors import Error

COORDINATOR_ENV = "ZEROSHARD_COORDINATOR"

# The coordinator's largest ListJobs/ListWorkers page_size: fewest round trips. Replies stay
# under gRPC's 4 MiB limit because the coordinator also ends a page at 2 MiB.
_MAX_PAGE_SIZE = 1000

# json_format's errors name the failing place as "at JobSpec.optimizer.lr" (wrong values) or as a
# chain of "Failed to parse optimizer field: ..." (values it cannot convert).
_PARSE_ERROR_AT = re.compile(r'\bat "?JobSpec((?:\.[A-Za-z0-9_]+|\[\d+\])*)"?')
_PARSE_ERROR_FIELD = re.compile(r"Failed to parse ([A-Za-z0-9_]+) field: ")


def _invalid(field, detail):
    return Error(grpc.StatusCode.INVALID_ARGUMENT, f"{field}: {detail}", field=field)


def _is_repeated(field):
    """Whether a FieldDescriptor is repeated: protobuf 7 has only is_repeated, 4.21 only label."""
    is_repeated = getattr(field, "is_repeated", None)
    if is_repeated is not None:
        return is_repeated
    return field.label == field.LABEL_REPEATED


def _check_keys(value, descriptor, path):
    """Raises Error naming the first key of `value` (a dict in the JSON form of `descriptor`'s
    message) that is no field of it. ParseDict names only the message, not where it sits."""
    if not isinstance(value, collections.abc.Mapping):
        return  # ParseDict reports the wrong type
    for key, item in value.items():
        field = descriptor.fields_by_name.get(key) or descriptor.fields_by_camelcase_name.get(key)
        if field is None:
            known = ", ".join(f.name for f in descriptor.fields)
            raise _invalid(f"{path}.{key}", f"unknown field of {descriptor.name} (fields: {known})")
        message = field.message_type
        # Well-known types (Timestamp, ...) have a JSON form of their own.
        if message is None or message.full_name.startswith("google.protobuf."):
            continue
        if message.GetOptions().map_entry:
            value_type = message.fields_by_name["value"].message_type
            if value_type is not None and isinstance(item, collections.abc.Mapping):
                for map_key, map_value in item.items():
                    _check_keys(map_value, value_type, f"{path}.{field.name}[{map_key}]")
        elif _is_repeated(field):
            if isinstance(item, list):
                for index, element in enumerate(item):
                    _check_keys(element, message, f"{path}.{field.name}[{index}]")
        else:
            _check_keys(item, message, f"{path}.{field.name}")


def _parse_error_field(text):
    at = _PARSE_ERROR_AT.search(text)
    if at:
        return "spec" + at.group(1)
    return ".".join(["spec"] + _PARSE_ERROR_FIELD.findall(text))


def job_spec(spec):
    """A JobSpec from a JobSpec message (returned as is) or a dict in the proto's JSON form
    (field names as in the .proto or in lowerCamelCase, enums by name), e.g.
    {"name": "seed", "workload": {"preset": "seed"}, "optimizer": {"kind": "ADAMW", "lr": 0.01}}.

    Raises Error(INVALID_ARGUMENT) naming the first unknown key or unparsable value, e.g. field
    "spec.optimizer.lrr"; TypeError when `spec` is neither.
    """
    if isinstance(spec, job_pb2.JobSpec):
        return spec
    if not isinstance(spec, collections.abc.Mapping):
        raise TypeError(f"spec must be a zeroshard.v1.JobSpec or a dict, not {type(spec).__name__}")
    _check_keys(spec, job_pb2.JobSpec.DESCRIPTOR, "spec")
    try:
        return json_format.ParseDict(spec, job_pb2.JobSpec())
    except json_format.ParseError as e:
        text = str(e).replace("\n", " ")
        detail = _PARSE_ERROR_AT.sub("", _PARSE_ERROR_FIELD.sub("", text)).rstrip(". ")
        raise _invalid(_parse_error_field(text), detail) from None


def _enum_value(enum_type, value, field):
    """An enum's number from its number or its name ("RUNNING"); None stays None (no filter)."""
    if value is None or isinstance(value, int):
        return value
    try:
        return enum_type.Value(value)
    except ValueError:
        raise _invalid(
            field,
            f"unknown {enum_type.DESCRIPTOR.name} {value!r} (known: "
            f"{', '.join(enum_type.keys())})",
        ) from None


class Client:
    """A connection to a ZeroShard coordinator.

    Thread-safe: methods may be called from several threads at once (one gRPC channel serves
    them all). Each method takes `timeout`, the call's deadline in seconds (None: no deadline),
    and raises zeroshard.Error for every failure, carrying the gRPC code (INVALID_ARGUMENT with
    the field for bad input, NOT_FOUND for unknown ids, FAILED_PRECONDITION for calls that do not
    fit the job's state, UNAVAILABLE when the coordinator cannot be reached, DEADLINE_EXCEEDED).

    Usable as a context manager; close() releases the channel.
    """

    def __init__(self, address=None, credentials=None, token=None, ca=None, cert=None,
                 key=None, token_file=None, insecure=None):
        """Connects to `address` ("host:port"), by default $ZEROSHARD_COORDINATOR.

        Credentials, for a coordinator with TLS and a token file (docs/operations.md):
        - `token`: sent as "authorization: Bearer <token>" on every call; default
          $ZEROSHARD_TOKEN. `token_file`: a file whose first line is the token. Without TLS the
          token goes only to a loopback address (an IP literal in 127.0.0.0/8 or ::1,
          "localhost" without a trailing dot or a dns://SERVER/ authority, unix:), unless
          `insecure` is true (default: $ZEROSHARD_INSECURE is "1"); otherwise
          Error(INVALID_ARGUMENT) on field "token".
        - `ca`: PEM file of the CA that signed the coordinator's certificate: TLS (default
          $ZEROSHARD_CA); `cert` and `key`: PEM client certificate and key for mTLS (default
          $ZEROSHARD_CERT, $ZEROSHARD_KEY).
        - `credentials`: grpc.ChannelCredentials used instead of `ca`/`cert`/`key`.
        Without any, the channel is plaintext and sends no token.
        Connecting is lazy: an unreachable coordinator (or a failed TLS handshake) fails the
        first call (UNAVAILABLE). A bad option raises Error(INVALID_ARGUMENT) naming it.
        """
        if address is None:
            address = os.environ.get(COORDINATOR_ENV)
        if not address:
            raise _invalid("address", f"none given and ${COORDINATOR_ENV} is unset")
        self.address = address
        try:
            if token_file is not None:
                if token is not None:
                    raise ValueError("token_file: give token or token_file, not both")
                token = _channel.read_token_file(token_file)
            self._channel = _channel.coordinator_channel(address, token=token, ca=ca, cert=cert,
                                                         key=key, credentials=credentials,
                                                         insecure=insecure)
        except ValueError as e:
            field = str(e).split(":", 1)[0].split(" ", 1)[0]
            raise _invalid(field, str(e).split(": ", 1)[-1]) from None
        self._stub = coordinator_pb2_grpc.CoordinatorStub(self._channel)

    def close(self):
        """Closes the channel; calls in flight are cancelled."""
        self._channel.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        self.close()

    def _call(self, method, request, timeout):
        try:
            return method(request, timeout=timeout)
        except grpc.RpcError as e:
            raise Error.from_rpc_error(e) from None

    def submit(self, spec, timeout=None):
        """Submits a job (SubmitJob). `spec`: a JobSpec, or a dict in its JSON form (see job_spec).

        Returns the new zeroshard.v1.Job (PENDING, its spec with every default applied). Raises
        Error(INVALID_ARGUMENT) naming the field of a bad spec, e.g. "spec.optimizer.lr".
        """
        request = coordinator_pb2.SubmitJobRequest(spec=job_spec(spec))
        return self._call(self._stub.SubmitJob, request, timeout)

    def get(self, job_id, timeout=None):
        """The zeroshard.v1.Job `job_id` (GetJob); Error(NOT_FOUND) for an unknown id."""
        request = coordinator_pb2.GetJobRequest(job_id=job_id)
        return self._call(self._stub.GetJob, request, timeout)

    def list(self, state=None, limit=None, timeout=None):
        """Jobs, newest first, as a list of zeroshard.v1.Job (ListJobs, page by page).

        `state`: only jobs in this zeroshard.v1.JobState (a number or a name such as "RUNNING");
        None lists all. `limit`: at most this many; None lists every job. `timeout` bounds each
        page's call.
        """
        if limit is not None and limit < 1:
            raise ValueError(f"limit must be None or >= 1, got {limit}")
        request = coordinator_pb2.ListJobsRequest(
            state=_enum_value(job_pb2.JobState, state, "state")
        )
        jobs = []
        while limit is None or len(jobs) < limit:
            wanted = _MAX_PAGE_SIZE if limit is None else limit - len(jobs)
            request.page_size = min(wanted, _MAX_PAGE_SIZE)
            response = self._call(self._stub.ListJobs, request, timeout)
            jobs.extend(response.jobs)
            if not response.next_page_token:
                break
            request.page_token = response.next_page_token
        return jobs

    def watch(self, job_id, after_sequence=0, timeout=None):
        """An iterator of the job's zeroshard.v1.JobEvent (WatchJob): its history after
        `after_sequence` (0: all of it), then live events; it ends when the job has ended.

        `timeout` bounds the whole stream. A watcher that falls behind loses the stream
        (Error RESOURCE_EXHAUSTED); pass the last event's `sequence` as `after_sequence` to
        resume. Closing the iterator early (break, close()) cancels the stream.
        """
        request = coordinator_pb2.WatchJobRequest(job_id=job_id, after_sequence=after_sequence)
        try:
            stream = self._stub.WatchJob(request, timeout=timeout)
        except grpc.RpcError as e:
            raise Error.from_rpc_error(e) from None
        return self._events(stream)

    @staticmethod
    def _events(stream):
        try:
            for event in stream:
                yield event
        except grpc.RpcError as e:
            raise Error.from_rpc_error(e) from None
        finally:
            stream.cancel()  # no-op once the stream has ended

    def cancel(self, job_id, reason="", timeout=None):
        """Cancels the job (CancelJob) and returns it as a zeroshard.v1.Job (CANCELLED).

        `reason` goes into the job's message. Error(FAILED_PRECONDITION) when it has ended.
        """
        request = coordinator_pb2.CancelJobRequest(job_id=job_id, reason=reason)
        return self._call(self._stub.CancelJob, request, timeout)

    def workers(self, state=None, timeout=None):
        """Registered workers as a list of zeroshard.v1.WorkerInfo (ListWorkers, page by page),
        in registration order.

        `state`: only workers in this zeroshard.v1.WorkerState (a number or a name such as
        "IDLE"); None lists all. `timeout` bounds each page's call.
        """
        request = coordinator_pb2.ListWorkersRequest(
            state=_enum_value(worker_pb2.WorkerState, state, "state"), page_size=_MAX_PAGE_SIZE
        )
        workers = []
        while True:
            response = self._call(self._stub.ListWorkers, request, timeout)
            workers.extend(response.workers)
            if not response.next_page_token:
                return workers
            request.page_token = response.next_page_token

    def plan(self, job_id, rank=0, generation=0, include_layout=False, timeout=None):
        """The shard plan of a job as seen by `rank` (GetShardPlan): a zeroshard.v1.ShardPlan
        with the rank's pieces, plus the global tensors and buckets when `include_layout`.
        `generation` 0 is the current one; an ended job answers with its last generation's plan.

        Error(FAILED_PRECONDITION) when the job has not run yet (or is between generations).
        """
        request = coordinator_pb2.GetShardPlanRequest(
            job_id=job_id, generation=generation, rank=rank, include_layout=include_layout
        )
        return self._call(self._stub.GetShardPlan, request, timeout)
