"""The trainer's end of the attach protocol (proto/zeroshard/v1/attach.proto): frames on the
worker's unix socket, and the worker's shared memory blocks mapped into this process.

Internal to zeroshard.torch. Python standard library and the generated attach_pb2 only.
"""

import mmap
import os
import select
import socket
import struct

from zeroshard._proto.zeroshard.v1 import attach_pb2


class WorkerLost(RuntimeError):
    """The worker this trainer is attached to is gone (its process ended, or it ended the run);
    the training step cannot complete. The job follows its fault policy."""


class AttachError(WorkerLost):
    """The worker answered a request with an error (its message says why: a lost peer, a failed
    collective, a refused request); its run is over, so this is a WorkerLost too."""


class AttachConnection:
    """A connected trainer. Not thread-safe: one thread (the training loop and the autograd
    hooks it runs) uses it."""

    def __init__(self, path, timeout=None):
        self.path = path
        self._socket = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._socket.settimeout(timeout)
        try:
            self._socket.connect(path)
        except OSError as e:
            raise WorkerLost(f"cannot connect to the worker's attach socket {path}: {e}") from e
        self._socket.settimeout(None)
        self._blocks = {}  # block id -> (mmap, bytes)

    def close(self):
        # The mappings are not closed: the model's parameters still view them (torch.frombuffer
        # keeps a reference, not a buffer export, so mmap.close() would unmap under them). They
        # go when the last tensor viewing them does.
        self._blocks.clear()
        self._socket.close()

    def _receive_exactly(self, size, with_fd=False):
        data = bytearray()
        fds = []
        while len(data) < size:
            try:
                if with_fd and not data:
                    chunk, received_fds, _, _ = socket.recv_fds(self._socket, size, 1)
                    fds.extend(received_fds)
                else:
                    chunk = self._socket.recv(size - len(data))
            except OSError as e:
                raise WorkerLost(f"the worker's connection broke: {e}") from e
            if not chunk:
                raise WorkerLost(
                    "the worker closed the connection (its process ended, or it ended the run: "
                    "see its log)")
            data.extend(chunk)
        return bytes(data), fds

    def _send_frame(self, request):
        body = request.SerializeToString()
        try:
            self._socket.sendall(struct.pack("<I", len(body)) + body)
        except OSError as e:
            raise WorkerLost(f"the worker's connection broke: {e}") from e

    def send(self, request):
        """A request without an answer (ready, written)."""
        self._send_frame(request)

    def call(self, request, with_fd=False):
        """Sends `request` and returns (its AttachResponse, the descriptor it carried or None).
        Raises AttachError when the worker answers with an error."""
        self._send_frame(request)
        return self.receive(with_fd=with_fd)

    def wait_readable(self, timeout):
        """Whether the worker's next frame (or its end of the connection) arrived within
        `timeout` seconds."""
        readable, _, _ = select.select([self._socket], [], [], timeout)
        return bool(readable)

    def receive(self, with_fd=False):
        """The answer to the request sent last: as call() returns it."""
        header, fds = self._receive_exactly(4, with_fd=with_fd)
        (length,) = struct.unpack("<I", header)
        body, _ = self._receive_exactly(length) if length else (b"", [])
        response = attach_pb2.AttachResponse()
        response.ParseFromString(body)
        if response.error:
            for fd in fds:
                os.close(fd)
            raise AttachError(f"the worker's run failed: {response.error}")
        return response, (fds[0] if fds else None)

    def block(self, block_id):
        """The worker's shared block `block_id`, mapped (once) into this process: a writable
        buffer that torch.frombuffer can view."""
        if block_id not in self._blocks:
            request = attach_pb2.AttachRequest()
            request.map_block.block = block_id
            response, fd = self.call(request, with_fd=True)
            if fd is None:
                raise AttachError(f"the worker sent no descriptor for block {block_id}")
            try:
                mapped = mmap.mmap(fd, response.mapped.bytes, mmap.MAP_SHARED,
                                   mmap.PROT_READ | mmap.PROT_WRITE)
            finally:
                os.close(fd)
            self._blocks[block_id] = (mapped, response.mapped.bytes)
        return self._blocks[block_id][0]
