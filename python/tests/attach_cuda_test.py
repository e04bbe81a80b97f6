"""CPU-only tests of the trainer's CUDA attach path (zeroshard._attach, zeroshard.torch): the
__cuda_array_interface__ of a block view built on a fake pointer, the IPC handle a fake worker
sends reaching cudaIpcOpenMemHandle's caller, and the errors when libcudart is missing or the
parameters are on an unsupported device. No CUDA call is made. Runs under
$ZEROSHARD_TRAINER_PYTHON when set (CI: the torch 2.x venv)."""

import gc
import os
import socket
import struct
import tempfile
import threading
import unittest

import torch

from cluster_support import run_under_trainer_python
from zeroshard import _attach
from zeroshard._proto.zeroshard.v1 import attach_pb2

BUS_ID = "0000:3B:00.0"


class FakeRuntime:
    """CudaRuntime's calls, recorded; pointers are made up and never dereferenced."""

    def __init__(self, base=0x7F0000000000):
        self.base = base
        self.opened = []
        self.closed = []

    def device_by_pci_bus_id(self, pci_bus_id):
        return {BUS_ID: 3}[pci_bus_id]

    def open_ipc_handle(self, handle, device):
        self.opened.append((bytes(handle), device))
        return self.base + 0x100000 * len(self.opened)

    def close_ipc_handle(self, pointer):
        self.closed.append(pointer)


class CudaArrayInterfaceTest(unittest.TestCase):

    def test_interface_of_a_view_points_at_the_offset(self):
        runtime = FakeRuntime()
        block = _attach.CudaBlock(runtime, pointer=0x7F0000001000, size=4096, device=0)
        view = block.view(byte_offset=256, count=100)
        self.assertEqual(view.__cuda_array_interface__, {
            "shape": (100,), "typestr": "<f4", "data": (0x7F0000001000 + 256, False),
            "strides": None, "version": 3})

    def test_views_outside_the_block_are_refused(self):
        block = _attach.CudaBlock(FakeRuntime(), pointer=0x1000, size=400, device=0)
        block.view(byte_offset=0, count=100)  # exactly the block
        with self.assertRaisesRegex(ValueError, "outside the 400-byte block"):
            block.view(byte_offset=4, count=100)
        with self.assertRaisesRegex(ValueError, "outside"):
            block.view(byte_offset=-4, count=1)

    def test_block_is_closed_when_its_last_view_goes(self):
        runtime = FakeRuntime()
        block = _attach.CudaBlock(runtime, pointer=0x2000, size=64, device=0)
        view = block.view(0, 16)
        del block
        gc.collect()
        self.assertEqual(runtime.closed, [])  # the view keeps it open (as torch keeps the view)
        del view
        gc.collect()
        self.assertEqual(runtime.closed, [0x2000])


class CudaRuntimeTest(unittest.TestCase):

    def test_missing_libcudart_names_what_was_tried(self):
        missing = os.path.join(tempfile.gettempdir(), "no-such-dir", "libcudart.so.13")
        with self.assertRaises(_attach.CudaUnavailable) as raised:
            _attach.CudaRuntime(candidates=[missing])
        self.assertIn("cannot load the CUDA runtime", str(raised.exception))
        self.assertIn(missing, str(raised.exception))

    def test_a_library_that_is_not_cudart_is_refused(self):
        with self.assertRaisesRegex(_attach.CudaUnavailable, "is not the CUDA runtime"):
            _attach.CudaRuntime(candidates=["libc.so.6"])

    def test_candidates_end_with_the_system_names(self):
        self.assertEqual(_attach.cudart_candidates()[-3:],
                         ["libcudart.so", "libcudart.so.13", "libcudart.so.12"])


class FakeWorker:
    """Answers each map_block on a unix socket with `mapped` (a BlockMapped) and no descriptor."""

    def __init__(self, directory, mapped):
        self.path = os.path.join(directory, "w.sock")
        self.mapped = mapped
        self.requests = []
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._listener.bind(self.path)
        self._listener.listen(1)
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self):
        connection, _ = self._listener.accept()
        with connection:
            while True:
                header = connection.recv(4, socket.MSG_WAITALL)
                if len(header) < 4:
                    return
                (length,) = struct.unpack("<I", header)
                request = attach_pb2.AttachRequest()
                request.ParseFromString(connection.recv(length, socket.MSG_WAITALL))
                self.requests.append(request)
                response = attach_pb2.AttachResponse()
                response.mapped.CopyFrom(self.mapped)
                response.mapped.block = request.map_block.block
                body = response.SerializeToString()
                connection.sendall(struct.pack("<I", len(body)) + body)

    def close(self):
        self._listener.close()
        self._thread.join(timeout=10)


class CudaBlockOverTheProtocolTest(unittest.TestCase):

    def setUp(self):
        self._directory = tempfile.TemporaryDirectory()

    def tearDown(self):
        self._directory.cleanup()

    def connect(self, mapped):
        worker = FakeWorker(self._directory.name, mapped)
        self.addCleanup(worker.close)
        connection = _attach.AttachConnection(worker.path, timeout=10)
        self.addCleanup(connection.close)
        connection._cuda_runtime = FakeRuntime()
        return worker, connection

    def test_handle_opens_on_the_device_with_the_workers_bus_id(self):
        handle = bytes(range(1, 65))
        mapped = attach_pb2.BlockMapped(bytes=8192, cuda_ipc_handle=handle,
                                        cuda_pci_bus_id=BUS_ID)
        worker, connection = self.connect(mapped)
        block = connection.cuda_block(5)
        self.assertIs(connection.cuda_block(5), block)  # opened once
        self.assertEqual([r.map_block.block for r in worker.requests], [5])
        self.assertEqual(connection._cuda_runtime.opened, [(handle, 3)])
        self.assertEqual(block.size, 8192)
        self.assertEqual(block.device, 3)
        self.assertEqual(block.view(64, 2).__cuda_array_interface__["data"][0],
                         block.pointer + 64)

    def test_a_block_without_a_handle_is_an_attach_error(self):
        _, connection = self.connect(attach_pb2.BlockMapped(bytes=64))
        with self.assertRaisesRegex(_attach.AttachError, "no CUDA IPC handle for block 2"):
            connection.cuda_block(2)


class ParameterDeviceTest(unittest.TestCase):
    """ShardedOptimizer refuses parameters it cannot attach before it contacts anyone."""

    def setUp(self):
        os.environ.update({"ZEROSHARD_COORDINATOR": "127.0.0.1:1", "ZEROSHARD_RANK": "0",
                           "ZEROSHARD_WORLD_SIZE": "1", "ZEROSHARD_WORKERS": "w0",
                           "ZEROSHARD_RUN_ID": "attach-cuda-test",
                           "ZEROSHARD_RUN_KEY": "attach-cuda-test",
                           "ZEROSHARD_ATTACH_SOCKET": "/nonexistent"})
        import zeroshard.torch as zt
        self.zt = zt

    def test_meta_parameters_are_refused_by_name(self):
        model = torch.nn.Linear(3, 2, device="meta")
        with self.assertRaisesRegex(ValueError, r"parameter weight: on meta, only CPU and CUDA"):
            self.zt.ShardedOptimizer(model, "sgd", lr=0.1)

    def test_parameters_on_two_devices_are_refused_by_name(self):
        model = torch.nn.Linear(3, 2)
        model.bias = torch.nn.Parameter(torch.zeros(2, device="meta"))
        with self.assertRaisesRegex(ValueError,
                                    r"parameter bias: on meta, but weight is on cpu"):
            self.zt.ShardedOptimizer(model, "sgd", lr=0.1)


if __name__ == "__main__":
    run_under_trainer_python()
    unittest.main()
