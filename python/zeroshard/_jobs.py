"""Finding a job by its spec name (zeroshard.launch's run id makes the names unique), for
zeroshard.torch and zeroshard.launch."""

from zeroshard._proto.zeroshard.v1 import coordinator_pb2


def find_job(stub, name):
    """The job named `name` among the coordinator's (a CoordinatorStub), or None."""
    response = stub.ListJobs(coordinator_pb2.ListJobsRequest(limit=1000), timeout=30)
    for job in response.jobs:
        if job.spec.name == name:
            return job
    return None
