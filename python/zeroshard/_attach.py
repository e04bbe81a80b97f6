"""The trainer's end of the attach protocol (proto/zeroshard/v1/attach.proto): frames on the
worker's unix socket, and the worker's shared memory blocks mapped into this process (memfd
blocks from CPU workers, CUDA IPC handles from CUDA workers, opened with ctypes).

Internal to zeroshard.torch. Python standard library and the generated attach_pb2 only.
"""

import ctypes
import ctypes.util
import glob
import mmap
import os
import pwd
import select
import socket
import stat
import struct

from zeroshard._proto.zeroshard.v1 import attach_pb2


class WorkerLost(RuntimeError):
    """The worker this trainer is attached to is gone (its process ended, or it ended the run);
    the training step cannot complete. The job follows its fault policy."""


class AttachError(WorkerLost):
    """The worker answered a request with an error (its message says why: a lost peer, a failed
    collective, a refused request); its run is over, so this is a WorkerLost too."""


class WrongWorker(WorkerLost):
    """The attach socket is not served by the worker this trainer was given: a process of a
    user that is not the workers' (anyone holding a worker token can register any socket path
    for any host name), or another worker. Nothing was mapped or written; the message names the
    expected worker and what answered."""


# The workers' user, when it is not the trainer's own (workers run as a service user and admit
# the trainers' users through --attach_group): a user name or a uid.
WORKER_USER_ENV = "ZEROSHARD_WORKER_USER"


def _uid_of(user):
    """The uid of `user`, a user name or a number; ValueError naming the variable otherwise."""
    if user.isdigit():
        return int(user)
    try:
        return pwd.getpwnam(user).pw_uid
    except KeyError:
        raise ValueError(f"{WORKER_USER_ENV}={user}: no such user") from None


def trusted_worker_uids(environ=None):
    """The users whose processes may serve a worker's attach socket: this process's own
    (effective) user, root, and $ZEROSHARD_WORKER_USER's when set. Another local user's process
    may not: the trainer would hand it its model and run what it answers."""
    environ = os.environ if environ is None else environ
    uids = {os.geteuid(), 0}
    if environ.get(WORKER_USER_ENV):
        uids.add(_uid_of(environ[WORKER_USER_ENV]))
    return uids


def describe_uid(uid):
    try:
        return f"uid {uid} ({pwd.getpwuid(uid).pw_name})"
    except KeyError:
        return f"uid {uid}"


def _describe_process(pid):
    try:
        with open(f"/proc/{pid}/comm") as comm:
            return f"process {pid} ({comm.read().strip()})"
    except OSError:
        return f"process {pid}"


def _expected_users(trusted):
    return ", ".join(describe_uid(uid) for uid in sorted(trusted))


def check_socket_server(sock, path, worker, environ=None):
    """WrongWorker unless the process that listens on connected unix socket `sock` (SO_PEERCRED:
    the kernel's record of who called listen(), which no process can forge) runs as a trusted
    user (trusted_worker_uids). `worker` names the worker expected there, for the message."""
    trusted = trusted_worker_uids(environ)
    creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    pid, uid, _ = struct.unpack("3i", creds)
    if uid not in trusted:
        raise WrongWorker(
            f"the attach socket {path} registered for {worker} is served by "
            f"{_describe_process(pid)} of {describe_uid(uid)}, not by the workers' user "
            f"({_expected_users(trusted)}): refusing to attach (a worker token holder may "
            f"register any socket path; set {WORKER_USER_ENV} when the workers run as another "
            "user)")


def served_worker_name(pid):
    """The worker name the daemon with `pid` was started with (its --name, else its default
    worker-<pid>), read from /proc/<pid>/cmdline; None where that cannot be told (no access, a
    --flagfile, not a worker daemon's command line)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = [a.decode("utf-8", "replace") for a in f.read().split(b"\0") if a]
    except OSError:
        return None
    if not argv or os.path.basename(argv[0]) != "zeroshard-worker":
        return None
    name = None
    for i, arg in enumerate(argv[1:], start=1):
        flag, has_value, value = arg.lstrip("-").partition("=")
        if not arg.startswith("-"):
            continue
        if flag in ("flagfile", "fromenv", "tryfromenv"):
            return None
        if flag == "name":
            name = value if has_value else (argv[i + 1] if i + 1 < len(argv) else "")
    return name if name else f"worker-{pid}"


def check_socket_name(sock, path, worker, name):
    """WrongWorker when the worker daemon serving connected unix socket `sock` was started under
    a name other than `name`, the registration's: a worker token holder may register a real
    worker's socket under a name of its own (which sorts first, say), and the trainer sent there
    would only learn it from the welcome. Nothing is said where the name cannot be told."""
    creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    pid = struct.unpack("3i", creds)[0]
    served = served_worker_name(pid)
    if served is not None and served != name:
        raise WrongWorker(
            f"the attach socket {path} registered for {worker} is served by the worker daemon "
            f"{served} (process {pid}), not by {name}: refusing it (a worker token holder may "
            "register another worker's socket)")


def check_socket_file(path, worker, environ=None):
    """WrongWorker unless `path` is a unix socket (not a link) owned by a trusted user
    (trusted_worker_uids): what the launcher checks before it names the socket to a trainer."""
    trusted = trusted_worker_uids(environ)
    try:
        st = os.lstat(path)
    except OSError as e:
        raise WrongWorker(f"the attach socket {path} registered for {worker}: {e.strerror}") \
            from None
    if not stat.S_ISSOCK(st.st_mode):
        raise WrongWorker(f"the attach socket {path} registered for {worker} is not a socket "
                          "(a link or another file)")
    if st.st_uid not in trusted:
        raise WrongWorker(
            f"the attach socket {path} registered for {worker} belongs to "
            f"{describe_uid(st.st_uid)}, not to the workers' user ({_expected_users(trusted)}) "
            f"(set {WORKER_USER_ENV} when the workers run as another user)")


def probe_worker_socket(path, worker, timeout=5.0, environ=None, name=None):
    """Checks, without sending anything, that `path` is a socket of the workers' user and that
    a process of that user serves it (check_socket_file, then check_socket_server on a
    connection that is closed at once: the worker drops it unread), and with `name` that the
    daemon serving it runs under that name where its command line tells (check_socket_name).
    WrongWorker otherwise."""
    check_socket_file(path, worker, environ)
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    probe.settimeout(timeout)
    try:
        try:
            probe.connect(path)
        except OSError as e:
            raise WrongWorker(f"the attach socket {path} registered for {worker}: cannot "
                              f"connect: {e}") from None
        check_socket_server(probe, path, worker, environ)
        if name is not None:
            check_socket_name(probe, path, worker, name)
    finally:
        probe.close()


class CudaUnavailable(RuntimeError):
    """The CUDA runtime library cannot be loaded, or refused a call: CUDA blocks cannot be
    opened in this process."""


# cudaIpcMemLazyEnablePeerAccess (cuda_runtime_api.h).
_CUDA_IPC_MEM_LAZY_ENABLE_PEER_ACCESS = 1
_CUDA_IPC_HANDLE_BYTES = 64


def cudart_candidates():
    """Where libcudart may be, most specific first: torch's own lib dir and the nvidia wheels'
    (the runtime torch itself uses), then the system's."""
    candidates = []
    try:
        import torch
        torch_lib = os.path.join(os.path.dirname(torch.__file__), "lib")
        candidates += sorted(glob.glob(os.path.join(torch_lib, "libcudart.so*")))
        site = os.path.dirname(os.path.dirname(torch.__file__))
        candidates += sorted(glob.glob(os.path.join(site, "nvidia", "cuda_runtime", "lib",
                                                    "libcudart.so*")))
    except ImportError:
        pass
    found = ctypes.util.find_library("cudart")
    if found:
        candidates.append(found)
    candidates += ["libcudart.so", "libcudart.so.13", "libcudart.so.12"]
    return candidates


class CudaRuntime:
    """The few CUDA runtime calls a trainer needs, through ctypes. Thread-safe as the runtime
    is."""

    def __init__(self, candidates=None):
        candidates = cudart_candidates() if candidates is None else list(candidates)
        errors = []
        self._lib = None
        for path in candidates:
            try:
                self._lib = ctypes.CDLL(path)
                self.path = path
                break
            except OSError as e:
                errors.append(f"{path}: {e}")
        if self._lib is None:
            raise CudaUnavailable(
                "cannot load the CUDA runtime (libcudart) to open the worker's CUDA blocks; "
                "tried " + ("; ".join(errors) if errors else "nothing"))
        try:
            self._declare(self._lib)
        except AttributeError as e:
            raise CudaUnavailable(f"{self.path} is not the CUDA runtime: {e}") from None

    @staticmethod
    def _declare(lib):
        lib.cudaGetErrorString.restype = ctypes.c_char_p
        lib.cudaGetErrorString.argtypes = [ctypes.c_int]
        lib.cudaGetDevice.argtypes = [ctypes.POINTER(ctypes.c_int)]
        lib.cudaSetDevice.argtypes = [ctypes.c_int]
        lib.cudaDeviceGetByPCIBusId.argtypes = [ctypes.POINTER(ctypes.c_int), ctypes.c_char_p]
        lib.cudaIpcOpenMemHandle.argtypes = [ctypes.POINTER(ctypes.c_void_p),
                                             ctypes.c_char * _CUDA_IPC_HANDLE_BYTES,
                                             ctypes.c_uint]
        lib.cudaIpcCloseMemHandle.argtypes = [ctypes.c_void_p]

    def _check(self, code, what):
        if code != 0:
            message = self._lib.cudaGetErrorString(code)
            raise CudaUnavailable(f"{what}: CUDA error {code}: "
                                  f"{message.decode() if message else 'unknown'}")

    def device_by_pci_bus_id(self, pci_bus_id):
        """This process's ordinal of the GPU with that PCI bus id."""
        device = ctypes.c_int(-1)
        self._check(self._lib.cudaDeviceGetByPCIBusId(ctypes.byref(device),
                                                      pci_bus_id.encode()),
                    f"cudaDeviceGetByPCIBusId({pci_bus_id})")
        return device.value

    def open_ipc_handle(self, handle, device):
        """Opens a cudaIpcMemHandle_t (64 bytes) on `device` (this process's ordinal); returns
        the pointer. The calling thread's current device is left as it was."""
        if len(handle) != _CUDA_IPC_HANDLE_BYTES:
            raise CudaUnavailable(f"a CUDA IPC handle has {_CUDA_IPC_HANDLE_BYTES} bytes, not "
                                  f"{len(handle)}")
        previous = ctypes.c_int(-1)
        self._check(self._lib.cudaGetDevice(ctypes.byref(previous)), "cudaGetDevice")
        self._check(self._lib.cudaSetDevice(device), f"cudaSetDevice({device})")
        try:
            pointer = ctypes.c_void_p()
            raw = (ctypes.c_char * _CUDA_IPC_HANDLE_BYTES).from_buffer_copy(handle)
            self._check(self._lib.cudaIpcOpenMemHandle(ctypes.byref(pointer), raw,
                                                       _CUDA_IPC_MEM_LAZY_ENABLE_PEER_ACCESS),
                        "cudaIpcOpenMemHandle")
            return pointer.value
        finally:
            self._lib.cudaSetDevice(previous.value)

    def close_ipc_handle(self, pointer):
        self._check(self._lib.cudaIpcCloseMemHandle(ctypes.c_void_p(pointer)),
                    "cudaIpcCloseMemHandle")


def cuda_array_interface(pointer, count, typestr="<f4"):
    """The __cuda_array_interface__ (version 3) of `count` contiguous elements at `pointer`."""
    return {"shape": (int(count),), "typestr": typestr, "data": (int(pointer), False),
            "strides": None, "version": 3}


class CudaBlock:
    """A worker's CUDA block opened in this process; closed when the last view of it goes."""

    def __init__(self, runtime, pointer, size, device):
        self._runtime = runtime
        self.pointer = pointer
        self.size = size
        self.device = device

    def __del__(self):
        try:
            self._runtime.close_ipc_handle(self.pointer)
        except Exception:  # at interpreter exit the runtime may be gone first
            pass

    def view(self, byte_offset, count):
        """An object torch.as_tensor(..., device="cuda") views without a copy: `count` fp32
        values at `byte_offset`. It keeps this block open while it (or a tensor) lives."""
        if byte_offset < 0 or count < 0 or byte_offset + 4 * count > self.size:
            raise ValueError(f"elements [{byte_offset}, {byte_offset + 4 * count}) bytes are "
                             f"outside the {self.size}-byte block")
        return _CudaView(self, self.pointer + byte_offset, count)


class _CudaView:
    def __init__(self, block, pointer, count):
        self._block = block  # torch keeps this object, which keeps the block open
        self.__cuda_array_interface__ = cuda_array_interface(pointer, count)


class AttachConnection:
    """A connected trainer. Not thread-safe: one thread (the training loop and the autograd
    hooks it runs) uses it."""

    def __init__(self, path, timeout=None, worker="its worker"):
        """Connects to `path` and checks who serves it (check_socket_server) before anything is
        sent: WrongWorker naming `worker` (the worker expected there) and what answered."""
        self.path = path
        self._socket = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._socket.settimeout(timeout)
        try:
            self._socket.connect(path)
        except OSError as e:
            self._socket.close()
            raise WorkerLost(f"cannot connect to the worker's attach socket {path}: {e}") from e
        try:
            check_socket_server(self._socket, path, worker)
        except BaseException:
            self._socket.close()
            raise
        self._socket.settimeout(None)
        self._blocks = {}  # block id -> (mmap, bytes)
        self._cuda_blocks = {}  # block id -> CudaBlock
        self._cuda_runtime = None

    def close(self):
        # The mappings are not closed: the model's parameters still view them (torch.frombuffer
        # keeps a reference, not a buffer export, so mmap.close() would unmap under them). They
        # go when the last tensor viewing them does.
        self._blocks.clear()
        self._cuda_blocks.clear()
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

    def _send_frame(self, request, pass_fd=None):
        body = request.SerializeToString()
        frame = struct.pack("<I", len(body)) + body
        try:
            if pass_fd is not None:
                # The descriptor travels with the frame's first bytes (SCM_RIGHTS).
                sent = socket.send_fds(self._socket, [frame], [pass_fd])
                frame = frame[sent:]
            self._socket.sendall(frame)
        except OSError as e:
            # The worker may have ended the run with an error answered to an earlier request
            # that gets none (ready, written, micro_batch_done: e.g. a collective call the other
            # ranks did not make) and closed the connection: that error says why.
            self._raise_pending_error()
            raise WorkerLost(f"the worker's connection broke: {e}") from e

    def _raise_pending_error(self):
        """AttachError with the worker's error if one waits unread on the connection."""
        try:
            if not self.wait_readable(0):
                return
            self.receive()
        except AttachError:
            raise
        except (WorkerLost, OSError, ValueError):
            return

    def send(self, request):
        """A request without an answer (ready, written)."""
        self._send_frame(request)

    def call(self, request, with_fd=False, pass_fd=None):
        """Sends `request` (with `pass_fd`, a descriptor this process opened, when given: the
        worker gets its own copy) and returns (its AttachResponse, the descriptor it carried or
        None). Raises AttachError when the worker answers with an error."""
        self._send_frame(request, pass_fd)
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

    def cuda_device_ordinal(self, pci_bus_id):
        """This process's ordinal of the worker's GPU (named by its PCI bus id)."""
        if self._cuda_runtime is None:
            self._cuda_runtime = CudaRuntime()
        return self._cuda_runtime.device_by_pci_bus_id(pci_bus_id)

    def cuda_block(self, block_id):
        """The worker's CUDA block `block_id`, opened (once) through its IPC handle on the
        device with the PCI bus id the worker names: a CudaBlock."""
        if block_id not in self._cuda_blocks:
            request = attach_pb2.AttachRequest()
            request.map_block.block = block_id
            response, fd = self.call(request, with_fd=True)
            if fd is not None:
                os.close(fd)
                raise AttachError(f"block {block_id} is a CPU block (the worker sent a "
                                  "descriptor), but the welcome said CUDA")
            mapped = response.mapped
            if not mapped.cuda_ipc_handle:
                raise AttachError(f"the worker sent no CUDA IPC handle for block {block_id}")
            device = self.cuda_device_ordinal(mapped.cuda_pci_bus_id)
            pointer = self._cuda_runtime.open_ipc_handle(mapped.cuda_ipc_handle, device)
            self._cuda_blocks[block_id] = CudaBlock(self._cuda_runtime, pointer, mapped.bytes,
                                                    device)
        return self._cuda_blocks[block_id]
