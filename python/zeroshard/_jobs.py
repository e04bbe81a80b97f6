"""Finding a job by its run key (JobSpec.run_key: zeroshard.launch gives every run a random one),
for zeroshard.torch and zeroshard.launch. An exact lookup, scoped by the coordinator to the
caller's own jobs: a job someone else submitted with the same name or key is never found."""

import grpc

from zeroshard._proto.zeroshard.v1 import coordinator_pb2


def find_job(stub, run_key):
    """The caller's job submitted with `run_key` (a CoordinatorStub asks), or None."""
    try:
        return stub.GetJob(coordinator_pb2.GetJobRequest(run_key=run_key), timeout=30)
    except grpc.RpcError as e:
        if e.code() == grpc.StatusCode.NOT_FOUND:
            return None
        raise
