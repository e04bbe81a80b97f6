"""ZeroShard's Python package: the coordinator client (zeroshard.Client) and its error type.

`import zeroshard` loads only grpc and protobuf; the PyTorch integration is a separate module,
imported on its own, so that clients need no torch.
"""

from zeroshard.client import Client
from zeroshard.errors import Error

__all__ = ["Client", "Error"]
