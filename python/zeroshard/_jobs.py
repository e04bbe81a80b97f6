"""Finding a job by its spec name (zeroshard.launch's run id makes the names unique), for
zeroshard.torch and zeroshard.launch."""

from zeroshard._proto.zeroshard.v1 import coordinator_pb2


def find_job(stub, name):
    """The job named `name` among the coordinator's (a CoordinatorStub), or None. Reads the
    jobs newest first, page by page, until it finds it."""
    request = coordinator_pb2.ListJobsRequest(page_size=1000)
    while True:
        response = stub.ListJobs(request, timeout=30)
        for job in response.jobs:
            if job.spec.name == name:
                return job
        if not response.next_page_token:
            return None
        request.page_token = response.next_page_token
