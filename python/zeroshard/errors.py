"""zeroshard.Error: the one exception type of the ZeroShard Python client.

Carries the gRPC status code, the message, and, for INVALID_ARGUMENT, the request field it names.
"""

import re

import grpc

# ZeroShard's servers start every INVALID_ARGUMENT message with the offending field's path, as
# "spec.optimizer.lr: -1 is out of range (0, 1000]" or "spec.param_groups[1].patterns: ...".
_FIELD_PATH = re.compile(
    r"^([A-Za-z_][A-Za-z0-9_]*(?:\[\d+\])*(?:\.[A-Za-z_][A-Za-z0-9_]*(?:\[\d+\])*)*): "
)


def field_of(code, message):
    """The field path leading an INVALID_ARGUMENT message ("spec.optimizer.lr"), else None."""
    if code != grpc.StatusCode.INVALID_ARGUMENT:
        return None
    match = _FIELD_PATH.match(message)
    return match.group(1) if match else None


class Error(Exception):
    """A failed ZeroShard call.

    Attributes:
      code: the grpc.StatusCode (INVALID_ARGUMENT, NOT_FOUND, FAILED_PRECONDITION, UNAVAILABLE,
        DEADLINE_EXCEEDED, ...).
      message: the server's (or the client's) explanation.
      field: for INVALID_ARGUMENT, the path of the request field at fault as the server names it
        ("spec.optimizer.lr", "spec.workload.preset"); None when the message names none and for
        every other code.

    Immutable once raised; safe to share between threads.
    """

    def __init__(self, code, message, field=None):
        super().__init__(code, message)
        self.code = code
        self.message = message
        self.field = field if field is not None else field_of(code, message)

    @classmethod
    def from_rpc_error(cls, rpc_error):
        """The Error for a grpc.RpcError raised by a stub (a grpc.Call carries code and details)."""
        code = rpc_error.code() if hasattr(rpc_error, "code") else grpc.StatusCode.UNKNOWN
        details = rpc_error.details() if hasattr(rpc_error, "details") else None
        return cls(code or grpc.StatusCode.UNKNOWN, details or str(rpc_error))

    def __str__(self):
        return f"{self.code.name}: {self.message}"

    def __repr__(self):
        return f"zeroshard.Error({self.code.name}, {self.message!r}, field={self.field!r})"
