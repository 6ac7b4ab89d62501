"""CUDA shared-memory extension, on a machine without a GPU: everything but the IPC open itself.

The server runs in this process (kernel.serve.inprocess) with a host-backed IPC opener injected
into its region registry (kernel.core.cuda_shared_memory's seam). The opener maps a 64-byte
"handle" to a bytearray that plays the client's device allocation, so the requests below are
exactly tritonclient's (`register_cuda_shared_memory`, tensors with `set_shared_memory`), and
the assertions read the "device memory" the way a client would. What is not covered here, the
real cudaIpcOpenMemHandle and device copies, is in test_on_gpu.py.
"""

from __future__ import annotations

import base64
import http.client
import json
import os
import threading
import time

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from conftest import EXAMPLES, TEST_MODELS, free_ports
from kernel.serve.inprocess import InProcessServer, parse_args

A = np.array([1.0, 2.0, 3.0, 4.0], np.float32)
B = np.array([0.5, 0.5, 0.5, 0.5], np.float32)


class HostDevice:
    """One fake device allocation: what a client's cudaMalloc + cudaIpcGetMemHandle would give."""

    def __init__(self, byte_size: int, device_id: int = 0):
        self.data = bytearray(byte_size)
        self.device_id = device_id
        self.handle = os.urandom(64)
        self.open_count = 0  # mappings the server holds open

    def b64(self) -> str:
        return base64.b64encode(self.handle).decode()

    def set(self, *arrays: np.ndarray) -> None:
        raw = b"".join(a.tobytes() for a in arrays)
        self.data[: len(raw)] = raw

    def get(self, dtype, count: int, offset: int = 0) -> np.ndarray:
        return np.frombuffer(bytes(self.data), dtype, count, offset)


class HostMemory:
    """The server side of one opened handle; reads and writes go to the HostDevice's bytes."""

    def __init__(self, device: HostDevice, byte_size: int):
        self.device = device
        self.byte_size = byte_size
        device.open_count += 1
        self.closed = False

    def read(self, offset: int, nbytes: int) -> bytes:
        assert offset + nbytes <= self.byte_size, "read past the registered size reached the opener"
        return bytes(self.device.data[offset:offset + nbytes])

    def write(self, offset: int, data) -> None:
        assert offset + len(data) <= self.byte_size, "write past the registered size reached the opener"
        self.device.data[offset:offset + len(data)] = bytes(data)

    def close(self) -> None:
        assert not self.closed, "closed twice"
        self.closed = True
        self.device.open_count -= 1


class HostIpcOpener:
    """The injected IpcOpener: knows the handles the test's "client" exported."""

    def __init__(self):
        self.devices: dict[bytes, HostDevice] = {}

    def allocate(self, byte_size: int, device_id: int = 0) -> HostDevice:
        device = HostDevice(byte_size, device_id)
        self.devices[device.handle] = device
        return device

    def open(self, name, raw_handle, device_id, byte_size):
        from kernel.core.errors import ErrorCode, KernelError

        device = self.devices.get(raw_handle)
        if device is None or device.device_id != device_id or byte_size > len(device.data):
            raise KernelError(ErrorCode.INVALID_ARG, "failed to open CUDA IPC handle: invalid argument")
        return HostMemory(device, byte_size)


@pytest.fixture(scope="module")
def server():
    http_port, grpc_port, metrics_port = free_ports(3)
    args = parse_args(["serve",
        f"--model-repository={EXAMPLES}", f"--model-repository={TEST_MODELS / 'good'}",
        "--model-control-mode=explicit", "--load-model=add_sub", "--load-model=slow_add_sub",
        f"--http-port={http_port}", f"--grpc-port={grpc_port}", f"--metrics-port={metrics_port}",
    ])
    opener = HostIpcOpener()
    runtime = InProcessServer(args, prepare=lambda s: setattr(s.shared_memory.cuda, "opener", opener))
    runtime.start()
    runtime.opener = opener
    runtime.http_url = f"localhost:{http_port}"
    runtime.grpc_url = f"localhost:{grpc_port}"
    runtime.http_port = http_port
    yield runtime
    runtime.stop(30)


@pytest.fixture(params=["http", "grpc"])
def client(request, server):
    if request.param == "http":
        c = httpclient.InferenceServerClient(server.http_url)
    else:
        c = grpcclient.InferenceServerClient(server.grpc_url)
    c.protocol = request.param
    yield c
    c.unregister_cuda_shared_memory()
    c.close()


def lib(client):
    return httpclient if client.protocol == "http" else grpcclient


def register(client, name: str, device: HostDevice, byte_size: int | None = None, device_id: int | None = None):
    """tritonclient's call, with the handle as tritonclient.utils.cuda_shared_memory.get_raw_handle gives it."""
    raw = device.b64().encode()
    client.register_cuda_shared_memory(
        name, raw, device.device_id if device_id is None else device_id,
        len(device.data) if byte_size is None else byte_size,
    )


def status(client, name: str = "") -> list[dict]:
    if client.protocol == "http":
        return client.get_cuda_shared_memory_status(name)
    reply = client.get_cuda_shared_memory_status(name)
    return [{"name": r.name, "device_id": r.device_id, "byte_size": r.byte_size}
            for _, r in sorted(reply.regions.items())]


def shm_input(client, name, region, byte_size, offset=0):
    t = lib(client).InferInput(name, [4], "FP32")
    t.set_shared_memory(region, byte_size, offset)
    return t


def shm_output(client, name, region, byte_size, offset=0):
    o = lib(client).InferRequestedOutput(name)
    o.set_shared_memory(region, byte_size, offset)
    return o


def assert_error(info, http_status: int, grpc_code: str, text: str, client) -> None:
    exc = info.value
    assert text in exc.message(), exc.message()
    assert exc.status() == (str(http_status) if client.protocol == "http" else grpc_code)


def post(server, path: str, body: bytes):
    conn = http.client.HTTPConnection("localhost", server.http_port, timeout=30)
    try:
        conn.request("POST", path, body=body)
        resp = conn.getresponse()
        data = resp.read()
        return resp.status, (json.loads(data) if data else None)
    finally:
        conn.close()


# ---- register / status / unregister ---------------------------------------------------------------


def test_register_status_unregister(server, client):
    d0, d1 = server.opener.allocate(64), server.opener.allocate(32, device_id=1)
    register(client, "r0", d0)
    register(client, "r1", d1, byte_size=16)
    assert status(client) == [{"name": "r0", "device_id": 0, "byte_size": 64},
                              {"name": "r1", "device_id": 1, "byte_size": 16}]
    assert status(client, "r1") == [{"name": "r1", "device_id": 1, "byte_size": 16}]
    assert d0.open_count == d1.open_count == 1
    client.unregister_cuda_shared_memory("r0")
    assert d0.open_count == 0, "unregister did not close the IPC mapping"
    assert [r["name"] for r in status(client)] == ["r1"]
    client.unregister_cuda_shared_memory("never-registered")  # not an error, as in Triton
    client.unregister_cuda_shared_memory()
    assert status(client) == [] and d1.open_count == 0


def test_status_of_an_unknown_region(client):
    with pytest.raises(InferenceServerException) as info:
        status(client, "nope")
    assert_error(info, 404, "StatusCode.NOT_FOUND", "Unable to find cuda shared memory region: 'nope'", client)


def test_register_twice_and_across_kinds(server, client):
    d = server.opener.allocate(16)
    register(client, "dup", d)
    with pytest.raises(InferenceServerException) as info:
        register(client, "dup", d)
    assert_error(info, 400, "StatusCode.ALREADY_EXISTS", "shared memory region 'dup' already in manager", client)
    assert d.open_count == 1
    # system and CUDA regions share one namespace
    with pytest.raises(InferenceServerException) as info:
        client.register_system_shared_memory("dup", "/no-such-key", 16)
    assert_error(info, 400, "StatusCode.ALREADY_EXISTS", "shared memory region 'dup' already in manager", client)


def test_open_failure_is_a_client_error(server, client):
    stranger = HostDevice(16)  # a handle the "driver" does not know
    with pytest.raises(InferenceServerException) as info:
        register(client, "bad", stranger)
    assert_error(info, 400, "StatusCode.INVALID_ARGUMENT", "failed to open CUDA IPC handle", client)
    assert status(client) == []


def test_handle_of_the_wrong_size(client):
    raw = base64.b64encode(b"\0" * 3)
    with pytest.raises(InferenceServerException) as info:
        client.register_cuda_shared_memory("short", raw, 0, 16)
    assert_error(info, 400, "StatusCode.INVALID_ARGUMENT",
                 "'raw_handle' must be a valid base64 encoded cudaIpcMemHandle_t", client)


@pytest.mark.parametrize("body,message", [
    (b"", "failed to parse the request JSON buffer: The document is empty."),
    (b"{}", "Shared memory register request has no 'raw_handle' field"),
    (b'{"raw_handle": "x", "device_id": 0, "byte_size": 16}', "attempt to access non-existing object member 'b64'"),
    (b'{"raw_handle": {"b64": 5}, "device_id": 0, "byte_size": 16}', "attempt to access JSON non-string as string"),
    (b'{"raw_handle": {"b64": "AAAA"}, "byte_size": 16}', "attempt to access non-existing object member 'device_id'"),
    (b'{"raw_handle": {"b64": "AAAA"}, "device_id": 0}', "attempt to access non-existing object member 'byte_size'"),
    (b'{"raw_handle": {"b64": "AAAA"}, "device_id": -1, "byte_size": 16}',
     "attempt to access JSON non-unsigned-integer as unsigned-integer"),
    (b'{"raw_handle": {"b64": "AAAA"}, "device_id": "0", "byte_size": 16}',
     "attempt to access JSON non-unsigned-integer as unsigned-integer"),
    (b'{"raw_handle": {"b64": "!!"}, "device_id": 0, "byte_size": 16}',
     "'raw_handle' must be a valid base64 encoded cudaIpcMemHandle_t"),
])
def test_http_register_body_errors(server, body, message):
    """tritonserver 2.51's messages, in its order of checks (it answers 500 for some; Kernel 400)."""
    code, reply = post(server, "/v2/cudasharedmemory/region/r/register", body)
    assert (code, reply) == (400, {"error": message})


def test_http_register_without_a_name(server):
    code, reply = post(server, "/v2/cudasharedmemory/region//register", b"{}")
    assert code == 404


def test_grpc_register_without_a_name(server):
    c = grpcclient.InferenceServerClient(server.grpc_url)
    with pytest.raises(InferenceServerException) as info:
        c.register_cuda_shared_memory("", base64.b64encode(os.urandom(64)), 0, 16)
    assert "'region name' is necessary to register cuda shared memory region" in info.value.message()
    c.close()


# ---- tensors in CUDA regions ----------------------------------------------------------------------


def test_inputs_and_outputs_in_cuda_shared_memory(server, client):
    d_in, d_out = server.opener.allocate(32), server.opener.allocate(32)
    d_in.set(A, B)
    register(client, "in", d_in)
    register(client, "out", d_out)
    result = client.infer(
        "add_sub",
        [shm_input(client, "INPUT0", "in", 16), shm_input(client, "INPUT1", "in", 16, offset=16)],
        outputs=[shm_output(client, "OUTPUT0", "out", 16), shm_output(client, "OUTPUT1", "out", 16, offset=16)],
    )
    np.testing.assert_array_equal(d_out.get(np.float32, 4), A + B)
    np.testing.assert_array_equal(d_out.get(np.float32, 4, 16), A - B)
    # the data went to the region, not the response
    if client.protocol == "http":
        out = result.get_output("OUTPUT0")
        assert "data" not in out and "binary_data_size" not in (out.get("parameters") or {})
    else:
        response = result.get_response()
        assert all(raw == b"" for raw in response.raw_output_contents)


def test_cuda_input_with_output_in_the_response(server, client):
    d_in = server.opener.allocate(32)
    d_in.set(A, B)
    register(client, "in", d_in)
    result = client.infer("add_sub", [shm_input(client, "INPUT0", "in", 16),
                                      shm_input(client, "INPUT1", "in", 16, offset=16)])
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), A + B)


@pytest.mark.parametrize("offset,size,text", [
    (32, 16, "Invalid offset for shared memory region: 'in'"),
    (24, 16, "Invalid offset + byte size for shared memory region: 'in'"),
])
def test_bounds_checks(server, client, offset, size, text):
    d_in = server.opener.allocate(32)
    register(client, "in", d_in)
    with pytest.raises(InferenceServerException) as info:
        client.infer("add_sub", [shm_input(client, "INPUT0", "in", size, offset),
                                 shm_input(client, "INPUT1", "in", 16)])
    assert_error(info, 400, "StatusCode.INVALID_ARGUMENT", text, client)


def test_output_region_too_small(server, client):
    d_in, d_out = server.opener.allocate(32), server.opener.allocate(8)
    d_in.set(A, B)
    register(client, "in", d_in)
    register(client, "out", d_out)
    with pytest.raises(InferenceServerException) as info:
        client.infer("add_sub", [shm_input(client, "INPUT0", "in", 16), shm_input(client, "INPUT1", "in", 16, 16)],
                     outputs=[shm_output(client, "OUTPUT0", "out", 8)])
    assert "should be at least 16 bytes to hold the results" in info.value.message()
    assert bytes(d_out.data) == bytes(8), "a too-small output window was written"


def test_unregister_while_a_request_is_in_flight(server, client):
    """The in-flight request keeps the mapping and completes into it; it is closed when the request ends."""
    d_in, d_out = server.opener.allocate(32), server.opener.allocate(16)
    d_in.set(A, B)
    register(client, "in", d_in)
    register(client, "out", d_out)
    done = {}

    def run():
        other = lib(client).InferenceServerClient(server.http_url if client.protocol == "http" else server.grpc_url)
        other.protocol = client.protocol
        try:
            done["result"] = other.infer(
                "slow_add_sub",
                [shm_input(other, "INPUT0", "in", 16), shm_input(other, "INPUT1", "in", 16, offset=16)],
                outputs=[shm_output(other, "OUTPUT0", "out", 16)],
            )
        except Exception as exc:  # noqa: BLE001 - reported below
            done["error"] = exc
        finally:
            other.close()

    thread = threading.Thread(target=run)
    thread.start()
    time.sleep(0.7)  # the request is in the 2 s model by now
    client.unregister_cuda_shared_memory()
    assert status(client) == []
    assert d_in.open_count == 0, "the input region's mapping should close at once (its bytes were copied)"
    assert d_out.open_count == 1, "the in-flight request's output mapping was closed under it"
    thread.join(30)
    assert "error" not in done, done.get("error")
    np.testing.assert_array_equal(d_out.get(np.float32, 4), A + B)
    assert d_out.open_count == 0
    with pytest.raises(InferenceServerException) as info:
        client.infer("add_sub", [shm_input(client, "INPUT0", "in", 16), shm_input(client, "INPUT1", "in", 16)])
    assert_error(info, 404, "StatusCode.NOT_FOUND", "Unable to find shared memory region: 'in'", client)
