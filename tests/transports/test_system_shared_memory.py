"""System shared-memory extension: tensors passed through client POSIX shared-memory regions.

Every test drives a real `kernel serve` through tritonclient (HTTP and gRPC)
and tritonclient's own shared-memory utilities, and checks what a client
sees: the data in its regions, the response, the status listing, and
Triton's error messages and status codes.
"""

from __future__ import annotations

import base64
import http.client
import json
import os
import threading
import time
import uuid

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm
from tritonclient.utils import InferenceServerException, serialize_byte_tensor

from conftest import children, EXAMPLES, TEST_MODELS, serving

PROTOCOLS = ["http", "grpc"]


@pytest.fixture(scope="module")
def server():
    yield from serving([EXAMPLES, TEST_MODELS / "good"])


@pytest.fixture(params=PROTOCOLS)
def client(request, server):
    """A tritonclient for each protocol; every region is unregistered afterwards."""
    if request.param == "http":
        c = httpclient.InferenceServerClient(server.url)
    else:
        c = grpcclient.InferenceServerClient(server.grpc_url)
    c.protocol = request.param
    yield c
    c.unregister_system_shared_memory()
    c.close()


@pytest.fixture
def regions():
    """Creates client regions with unique keys; destroys them afterwards."""
    made = []

    def make(byte_size: int, name: str = ""):
        key = f"/kernel-shm-test-{uuid.uuid4().hex[:12]}"
        handle = shm.create_shared_memory_region(name or key, key, byte_size)
        made.append(handle)
        return key, handle

    yield make
    for handle in made:
        shm.destroy_shared_memory_region(handle)


def lib(client):
    return httpclient if client.protocol == "http" else grpcclient


def post(server, path: str, body: bytes = b""):
    conn = http.client.HTTPConnection("localhost", server.http_port, timeout=30)
    try:
        conn.request("POST", path, body=body)
        resp = conn.getresponse()
        data = resp.read()
        return resp.status, (json.loads(data) if data else None)
    finally:
        conn.close()


def get(server, path: str):
    conn = http.client.HTTPConnection("localhost", server.http_port, timeout=30)
    try:
        conn.request("GET", path)
        resp = conn.getresponse()
        return resp.status, json.loads(resp.read())
    finally:
        conn.close()


def status_list(client, name: str = "") -> list[dict]:
    """The system status as the HTTP list, whichever protocol asked."""
    if client.protocol == "http":
        return client.get_system_shared_memory_status(name)
    reply = client.get_system_shared_memory_status(name)
    return [
        {"name": r.name, "key": r.key, "offset": r.offset, "byte_size": r.byte_size}
        for _, r in sorted(reply.regions.items())
    ]


def shm_input(client, name: str, region: str, byte_size: int, offset: int = 0, shape=(4,), datatype="FP32"):
    t = lib(client).InferInput(name, list(shape), datatype)
    t.set_shared_memory(region, byte_size, offset)
    return t


def shm_output(client, name: str, region: str, byte_size: int, offset: int = 0):
    o = lib(client).InferRequestedOutput(name)
    o.set_shared_memory(region, byte_size, offset)
    return o


def data_input(client, name: str, array: np.ndarray):
    t = lib(client).InferInput(name, list(array.shape), "FP32")
    t.set_data_from_numpy(array)
    return t


def shm_output_carries_no_data(client, result, name: str) -> bool:
    if client.protocol == "http":
        out = result.get_output(name)
        return "data" not in out and "binary_data_size" not in (out.get("parameters") or {})
    response = result.get_response()
    index = [o.name for o in response.outputs].index(name)
    return response.raw_output_contents[index] == b""


def assert_error(info, http_status: int, grpc_code: str, text: str, client) -> None:
    """The client saw Triton's message and status (HTTP status code, or gRPC status)."""
    exc = info.value
    assert text in exc.message(), exc.message()
    assert exc.status() == (str(http_status) if client.protocol == "http" else grpc_code)


A = np.array([1.0, 2.0, 3.0, 4.0], np.float32)
B = np.array([0.5, 0.5, 0.5, 0.5], np.float32)


def add_sub_regions(client, regions, out_size: int = 32):
    """Registers 'in' (A then B) and 'out' regions; returns the output handle."""
    key_in, h_in = regions(32)
    shm.set_shared_memory_region(h_in, [A, B])
    key_out, h_out = regions(out_size)
    client.register_system_shared_memory("in", key_in, 32)
    client.register_system_shared_memory("out", key_out, out_size)
    return h_out


def assert_still_serving(client):
    result = client.infer("add_sub", [data_input(client, "INPUT0", A), data_input(client, "INPUT1", B)])
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), A + B)


# ---- data paths -------------------------------------------------------------------


def test_inputs_and_outputs_in_shared_memory(client, regions):
    h_out = add_sub_regions(client, regions)
    result = client.infer(
        "add_sub",
        [shm_input(client, "INPUT0", "in", 16), shm_input(client, "INPUT1", "in", 16, offset=16)],
        outputs=[shm_output(client, "OUTPUT0", "out", 16), shm_output(client, "OUTPUT1", "out", 16, offset=16)],
    )
    np.testing.assert_array_equal(shm.get_contents_as_numpy(h_out, np.float32, [4]), A + B)
    np.testing.assert_array_equal(shm.get_contents_as_numpy(h_out, np.float32, [4], offset=16), A - B)
    for name in ("OUTPUT0", "OUTPUT1"):
        out = result.get_output(name)
        assert out is not None
        assert shm_output_carries_no_data(client, result, name)


def test_inputs_from_shared_memory_outputs_in_the_response(client, regions):
    add_sub_regions(client, regions)
    result = client.infer(
        "add_sub", [shm_input(client, "INPUT0", "in", 16), shm_input(client, "INPUT1", "in", 16, offset=16)]
    )
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), A + B)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), A - B)


def test_mixed_shared_memory_and_inline_tensors(client, regions):
    h_out = add_sub_regions(client, regions)
    other = np.array([10, 20, 30, 40], np.float32)
    result = client.infer(
        "add_sub",
        [shm_input(client, "INPUT0", "in", 16), data_input(client, "INPUT1", other)],
        outputs=[shm_output(client, "OUTPUT0", "out", 16, offset=16), lib(client).InferRequestedOutput("OUTPUT1")],
    )
    np.testing.assert_array_equal(shm.get_contents_as_numpy(h_out, np.float32, [4], offset=16), A + other)
    assert shm_output_carries_no_data(client, result, "OUTPUT0")
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), A - other)


def test_json_request_with_shared_memory_input_and_output(server, regions):
    """A hand-written JSON request (no binary data) using the parameters directly."""
    key_in, h_in = regions(32)
    shm.set_shared_memory_region(h_in, [A, B])
    key_out, h_out = regions(16)
    assert post(server, "/v2/systemsharedmemory/region/jin/register",
                json.dumps({"key": key_in, "offset": 0, "byte_size": 32}).encode())[0] == 200
    assert post(server, "/v2/systemsharedmemory/region/jout/register",
                json.dumps({"key": key_out, "byte_size": 16}).encode())[0] == 200
    try:
        body = {
            "inputs": [
                {"name": "INPUT0", "shape": [4], "datatype": "FP32",
                 "parameters": {"shared_memory_region": "jin", "shared_memory_byte_size": 16}},
                {"name": "INPUT1", "shape": [4], "datatype": "FP32",
                 "parameters": {"shared_memory_region": "jin", "shared_memory_offset": 16,
                                "shared_memory_byte_size": 16}},
            ],
            "outputs": [
                {"name": "OUTPUT0", "parameters": {"shared_memory_region": "jout", "shared_memory_byte_size": 16}},
                {"name": "OUTPUT1"},
            ],
        }
        status, doc = post(server, "/v2/models/add_sub/infer", json.dumps(body).encode())
        assert status == 200, doc
        assert doc["outputs"][0] == {"name": "OUTPUT0", "datatype": "FP32", "shape": [4]}
        assert doc["outputs"][1]["data"] == (A - B).tolist()
        np.testing.assert_array_equal(shm.get_contents_as_numpy(h_out, np.float32, [4]), A + B)
    finally:
        post(server, "/v2/systemsharedmemory/unregister")


def test_string_tensors_in_shared_memory(client, regions):
    strings = np.array([[b"hello", b"", b"shared memory \xe2\x9c\x93"]], dtype=np.object_)
    serialized = serialize_byte_tensor(strings)
    size = len(serialized.item())
    key_in, h_in = regions(size)
    shm.set_shared_memory_region(h_in, [serialized])
    key_out, h_out = regions(256)
    client.register_system_shared_memory("sin", key_in, size)
    client.register_system_shared_memory("sout", key_out, 256)
    result = client.infer(
        "string_identity",
        [shm_input(client, "INPUT0", "sin", size, shape=(1, 3), datatype="BYTES")],
        outputs=[shm_output(client, "OUTPUT0", "sout", 256)],
    )
    assert result.get_output("OUTPUT0") is not None
    assert shm_output_carries_no_data(client, result, "OUTPUT0")
    got = shm.get_contents_as_numpy(h_out, np.object_, [1, 3])
    assert got.tolist() == strings.tolist()


def test_grpc_stream_with_a_decoupled_model(server, regions):
    """Each streamed response is written into the output window; its message carries no data."""
    values = np.array([7, 8, 9], np.int32)
    key_in, h_in = regions(12)
    shm.set_shared_memory_region(h_in, [values])
    key_out, h_out = regions(4)
    client = grpcclient.InferenceServerClient(server.grpc_url)
    client.register_system_shared_memory("stream_in", key_in, 12)
    client.register_system_shared_memory("stream_out", key_out, 4)
    seen = []
    finished = threading.Event()

    def callback(result, error):
        if error is not None:
            seen.append(error)
            finished.set()
            return
        response = result.get_response()
        if not response.outputs:
            return
        index = [o.name for o in response.outputs].index("OUT")
        # The window holds this response's value until the model writes the next one.
        seen.append((response.raw_output_contents[index], int(result.as_numpy("IDX")[0])))
        if len(seen) == len(values):
            finished.set()

    try:
        client.start_stream(callback)
        t = grpcclient.InferInput("IN", [3], "INT32")
        t.set_shared_memory("stream_in", 12)
        out = grpcclient.InferRequestedOutput("OUT")
        out.set_shared_memory("stream_out", 4)
        client.async_stream_infer("repeat_int32", [t], outputs=[out, grpcclient.InferRequestedOutput("IDX")])
        assert finished.wait(30)
        client.stop_stream()
        assert seen == [(b"", 0), (b"", 1), (b"", 2)], seen
        assert shm.get_contents_as_numpy(h_out, np.int32, [1]).tolist() == [9]
    finally:
        client.unregister_system_shared_memory()
        client.close()


# ---- region management -------------------------------------------------------------


def test_status_lists_registered_regions(client, regions):
    key_a, _ = regions(64)
    key_b, _ = regions(8192)
    assert status_list(client) == []
    client.register_system_shared_memory("b_region", key_b, 4096, offset=4096)
    client.register_system_shared_memory("a_region", key_a, 64)
    assert status_list(client) == [
        {"name": "a_region", "key": key_a, "offset": 0, "byte_size": 64},
        {"name": "b_region", "key": key_b, "offset": 4096, "byte_size": 4096},
    ]
    assert status_list(client, "b_region") == [{"name": "b_region", "key": key_b, "offset": 4096, "byte_size": 4096}]
    with pytest.raises(InferenceServerException) as info:
        status_list(client, "nope")
    assert_error(info, 404, "StatusCode.NOT_FOUND", "Unable to find system shared memory region: 'nope'", client)


def test_region_at_unaligned_offset(client, regions):
    """An offset that is not page-aligned still maps the right bytes."""
    key, handle = regions(100)
    shm.set_shared_memory_region(handle, [A, B], offset=36)
    client.register_system_shared_memory("odd", key, 64, offset=36)
    result = client.infer(
        "add_sub", [shm_input(client, "INPUT0", "odd", 16), shm_input(client, "INPUT1", "odd", 16, offset=16)]
    )
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), A + B)


def test_unregister_one_then_all(client, regions):
    keys = [regions(16)[0] for _ in range(3)]
    for i, key in enumerate(keys):
        client.register_system_shared_memory(f"r{i}", key, 16)
    client.unregister_system_shared_memory("r1")
    assert [r["name"] for r in status_list(client)] == ["r0", "r2"]
    client.unregister_system_shared_memory("not-registered")  # not an error, as in Triton
    client.unregister_system_shared_memory()
    assert status_list(client) == []


def mapped(server, key: str) -> bool:
    """Whether the server holds the shared-memory object `key` open (it reads and writes it with
    pread/pwrite, never through a mapping a client could shrink: see kernel/core/shared_memory.py).
    The server is its process, and its front processes when it runs several."""
    target = "/dev/shm/" + key.lstrip("/")
    held = False
    for pid in [server.proc.pid, *children(server.proc.pid)]:
        fds = f"/proc/{pid}/fd"
        try:
            names = os.listdir(fds)
        except OSError:
            continue
        for fd in names:
            try:
                held = held or os.readlink(f"{fds}/{fd}") == target
            except OSError:
                pass
        try:
            with open(f"/proc/{pid}/maps") as f:
                assert not any(line.rstrip().endswith(target) for line in f), "the object is mapped"
        except OSError:
            pass
    return held


def test_unregister_unmaps_the_object(server, client, regions):
    key, _ = regions(64)
    client.register_system_shared_memory("m", key, 64)
    assert mapped(server, key)
    client.unregister_system_shared_memory("m")
    assert not mapped(server, key)


def test_register_twice(client, regions):
    key, _ = regions(16)
    client.register_system_shared_memory("twice", key, 16)
    with pytest.raises(InferenceServerException) as info:
        client.register_system_shared_memory("twice", key, 16)
    assert_error(info, 400, "StatusCode.ALREADY_EXISTS", "shared memory region 'twice' already in manager", client)
    assert status_list(client, "twice")[0]["byte_size"] == 16


def test_register_errors(client, regions, tmp_path):
    key, _ = regions(64)
    with pytest.raises(InferenceServerException) as info:
        client.register_system_shared_memory("big", key, 65)
    # Client mistakes: 400 / INVALID_ARGUMENT (tritonserver answers 500 / INTERNAL; issue 14 item 12).
    assert_error(info, 400, "StatusCode.INVALID_ARGUMENT", f"Invalid shared memory region: '{key}'", client)
    with pytest.raises(InferenceServerException) as info:
        client.register_system_shared_memory("past", key, 8, offset=60)
    assert_error(info, 400, "StatusCode.INVALID_ARGUMENT", f"Invalid shared memory region: '{key}'", client)
    missing = f"/kernel-shm-test-missing-{uuid.uuid4().hex[:8]}"
    with pytest.raises(InferenceServerException) as info:
        client.register_system_shared_memory("missing", missing, 8)
    assert_error(info, 400, "StatusCode.INVALID_ARGUMENT", f"Unable to open shared memory region: '{missing}'", client)
    # Keys name objects in /dev/shm only: no paths out of it, no symbolic links.
    secret = tmp_path / "secret"
    secret.write_bytes(b"x" * 64)
    link = f"kernel-shm-test-link-{uuid.uuid4().hex[:8]}"
    os.symlink(secret, f"/dev/shm/{link}")
    try:
        for bad in ("../../" + str(secret).lstrip("/"), "/" + link, "///", "a/b"):
            with pytest.raises(InferenceServerException) as info:
                client.register_system_shared_memory("bad", bad, 8)
            assert_error(info, 400, "StatusCode.INVALID_ARGUMENT", f"Unable to open shared memory region: '{bad}'",
                         client)
    finally:
        os.unlink(f"/dev/shm/{link}")
    assert status_list(client) == []
    assert_still_serving(client)


def test_http_register_request_errors(server, regions):
    key, _ = regions(16)
    path = "/v2/systemsharedmemory/region/x/register"
    cases = [
        ({"byte_size": 16}, "Shared memory register request has no 'key' field"),
        ({"key": key}, "Shared memory register request has no 'byte_size' field"),
        ({"key": key, "byte_size": -1}, "Unable to parse 'byte_size'"),
        ({"key": key, "byte_size": "16"}, "Unable to parse 'byte_size'"),
        ({"key": 7, "byte_size": 16}, "Unable to parse 'key'"),
        ({"key": key, "offset": 1.5, "byte_size": 8}, "Unable to parse 'offset'"),
    ]
    for body, text in cases:
        status, doc = post(server, path, json.dumps(body).encode())
        assert status == 400 and text in doc["error"], (body, doc)
    status, doc = post(server, path, b"{nope")
    assert status == 400 and "failed to parse the request JSON buffer" in doc["error"]
    status, doc = post(server, "/v2/systemsharedmemory/register", json.dumps({"key": key, "byte_size": 16}).encode())
    assert status == 400 and doc["error"] == "'region name' is necessary to register system shared memory region"
    assert get(server, "/v2/systemsharedmemory/status") == (200, [])


def test_http_routes_and_methods(server):
    assert get(server, "/v2/systemsharedmemory/region/x/register") == (405, {"error": "Method Not Allowed"})
    assert post(server, "/v2/systemsharedmemory/status") == (405, {"error": "Method Not Allowed"})
    assert get(server, "/v2/systemsharedmemory/region/x/frobnicate") == (404, {"error": "Not Found"})
    assert get(server, "/v2/systemsharedmemory/region//status") == (404, {"error": "Not Found"})
    assert post(server, "/v2/systemsharedmemory/unregister") == (200, None)


# ---- bad tensor references ---------------------------------------------------------


def test_unknown_region(client, regions):
    add_sub_regions(client, regions)
    with pytest.raises(InferenceServerException) as info:
        client.infer("add_sub", [shm_input(client, "INPUT0", "nope", 16), shm_input(client, "INPUT1", "in", 16)])
    assert_error(info, 404, "StatusCode.NOT_FOUND", "Unable to find shared memory region: 'nope'", client)
    with pytest.raises(InferenceServerException) as info:
        client.infer(
            "add_sub", [shm_input(client, "INPUT0", "in", 16), shm_input(client, "INPUT1", "in", 16)],
            outputs=[shm_output(client, "OUTPUT0", "nope", 16)],
        )
    assert_error(info, 404, "StatusCode.NOT_FOUND", "Unable to find shared memory region: 'nope'", client)
    assert_still_serving(client)


def test_offset_or_byte_size_past_the_region(client, regions):
    add_sub_regions(client, regions)
    cases = [
        (32, 16, "Invalid offset for shared memory region: 'in'"),
        (24, 16, "Invalid offset + byte size for shared memory region: 'in'"),
        (0, 33, "Invalid offset + byte size for shared memory region: 'in'"),
    ]
    for offset, size, text in cases:
        with pytest.raises(InferenceServerException) as info:
            client.infer(
                "add_sub", [shm_input(client, "INPUT0", "in", size, offset), shm_input(client, "INPUT1", "in", 16)]
            )
        assert_error(info, 400, "StatusCode.INVALID_ARGUMENT", text, client)
    with pytest.raises(InferenceServerException) as info:
        client.infer(
            "add_sub", [shm_input(client, "INPUT0", "in", 16), shm_input(client, "INPUT1", "in", 16)],
            outputs=[shm_output(client, "OUTPUT0", "out", 16, offset=24)],
        )
    assert_error(
        info, 400, "StatusCode.INVALID_ARGUMENT", "Invalid offset + byte size for shared memory region: 'out'", client
    )
    assert_still_serving(client)


def test_input_byte_size_mismatch(client, regions):
    add_sub_regions(client, regions)
    with pytest.raises(InferenceServerException) as info:
        client.infer("add_sub", [shm_input(client, "INPUT0", "in", 8), shm_input(client, "INPUT1", "in", 16)])
    assert_error(
        info, 400, "StatusCode.INVALID_ARGUMENT",
        "input byte size mismatch for input 'INPUT0' for model 'add_sub'. Expected 16, got 8", client,
    )


def test_output_region_too_small(client, regions):
    h_out = add_sub_regions(client, regions)
    shm.set_shared_memory_region(h_out, [np.zeros(8, np.float32)])
    with pytest.raises(InferenceServerException) as info:
        client.infer(
            "add_sub", [shm_input(client, "INPUT0", "in", 16), shm_input(client, "INPUT1", "in", 16, offset=16)],
            outputs=[shm_output(client, "OUTPUT0", "out", 8)],
        )
    assert_error(
        info, 400, "StatusCode.INVALID_ARGUMENT",
        "shared memory size specified with the request for output 'OUTPUT0' (8 bytes) should be at least 16 bytes "
        "to hold the results", client,
    )
    # Nothing was written past the window the client gave.
    np.testing.assert_array_equal(shm.get_contents_as_numpy(h_out, np.float32, [8]), np.zeros(8, np.float32))
    assert_still_serving(client)


def test_unregistered_region_cannot_be_used(client, regions):
    add_sub_regions(client, regions)
    client.unregister_system_shared_memory("in")
    with pytest.raises(InferenceServerException) as info:
        client.infer("add_sub", [shm_input(client, "INPUT0", "in", 16), shm_input(client, "INPUT1", "in", 16)])
    assert_error(info, 404, "StatusCode.NOT_FOUND", "Unable to find shared memory region: 'in'", client)
    assert_still_serving(client)


def test_unregister_while_a_request_is_in_flight(server, client, regions):
    """The in-flight request keeps its mapping and completes into its window; new ones cannot use it."""
    h_out = add_sub_regions(client, regions)
    key_out = status_list(client, "out")[0]["key"]
    done = {}

    def run():
        # its own client: tritonclient.http's connection pool belongs to the thread that made it
        other = lib(client).InferenceServerClient(server.url if client.protocol == "http" else server.grpc_url)
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
    client.unregister_system_shared_memory()
    assert status_list(client) == []
    assert mapped(server, key_out), "the in-flight request's window was unmapped under it"
    thread.join(30)
    assert "error" not in done, done.get("error")
    np.testing.assert_array_equal(shm.get_contents_as_numpy(h_out, np.float32, [4]), A + B)
    assert not mapped(server, key_out)
    with pytest.raises(InferenceServerException) as info:
        client.infer("add_sub", [shm_input(client, "INPUT0", "in", 16), shm_input(client, "INPUT1", "in", 16)])
    assert_error(info, 404, "StatusCode.NOT_FOUND", "Unable to find shared memory region: 'in'", client)
    assert_still_serving(client)


def test_http_tensor_parameter_errors(server, regions):
    key, h = regions(32)
    shm.set_shared_memory_region(h, [A, B])
    assert post(server, "/v2/systemsharedmemory/region/p/register",
                json.dumps({"key": key, "byte_size": 32}).encode())[0] == 200
    good = {"shared_memory_region": "p", "shared_memory_byte_size": 16}

    def request(params0, data=None, out_params=None):
        i0 = {"name": "INPUT0", "shape": [4], "datatype": "FP32", "parameters": params0}
        if data is not None:
            i0["data"] = data
        body = {"inputs": [i0, {"name": "INPUT1", "shape": [4], "datatype": "FP32", "parameters": good}]}
        if out_params is not None:
            body["outputs"] = [{"name": "OUTPUT0", "parameters": out_params}]
        return post(server, "/v2/models/add_sub/infer", json.dumps(body).encode())

    try:
        cases = [
            (request(good, data=[1, 2, 3, 4]),
             "Input must set only one of the following fields: 'data', 'binary_data_size' in 'parameters', "
             "'shared_memory_region' in 'parameters'. But set 'data' 'shared_memory_region'"),
            (request({"shared_memory_region": 3, "shared_memory_byte_size": 16}),
             "Unable to parse 'shared_memory_region'"),
            (request({"shared_memory_region": "p", "shared_memory_offset": -4, "shared_memory_byte_size": 16}),
             "Unable to parse 'shared_memory_offset'"),
            (request({"shared_memory_region": "p"}),
             "'shared_memory_byte_size' must be specified along with 'shared_memory_region' parameter "
             "for tensor 'INPUT0'"),
            (request(good, out_params={**good, "binary_data": True}),
             "Output can't set both 'shared_memory_region' and 'binary_data'"),
        ]
        for (status, doc), text in cases:
            assert status == 400 and text in doc["error"], doc
    finally:
        post(server, "/v2/systemsharedmemory/unregister")


def test_grpc_tensor_parameter_errors(server, regions):
    key, h = regions(32)
    shm.set_shared_memory_region(h, [A, B])
    client = grpcclient.InferenceServerClient(server.grpc_url)
    client.register_system_shared_memory("g", key, 32)
    try:
        def infer_with(mutate):
            i0 = grpcclient.InferInput("INPUT0", [4], "FP32")
            i0.set_shared_memory("g", 16)
            i1 = grpcclient.InferInput("INPUT1", [4], "FP32")
            i1.set_shared_memory("g", 16, 16)
            mutate(i0._get_tensor())
            with pytest.raises(InferenceServerException) as info:
                client.infer("add_sub", [i0, i1])
            assert info.value.status() == "StatusCode.INVALID_ARGUMENT"
            return info.value.message()

        def region_as_int(t):
            t.parameters["shared_memory_region"].int64_param = 1

        def no_byte_size(t):
            del t.parameters["shared_memory_byte_size"]

        def no_region(t):
            del t.parameters["shared_memory_region"]

        def contents_too(t):
            t.contents.fp32_contents.extend([1, 2, 3, 4])

        expected = [
            (region_as_int,
             "invalid value type for 'shared_memory_region' parameter for tensor 'INPUT0', expected string_param."),
            (no_byte_size,
             "'shared_memory_byte_size' must be specified along with 'shared_memory_region' parameter "
             "for tensor 'INPUT0'"),
            (no_region,
             "'shared_memory_byte_size' can not be specified without 'shared_memory_region' parameter "
             "for tensor 'INPUT0'"),
            (contents_too,
             "unexpected 'content' provided when using shared memory for input tensor 'INPUT0' for model 'add_sub'"),
        ]
        for mutate, text in expected:
            assert text in infer_with(mutate)
    finally:
        client.unregister_system_shared_memory()
        client.close()


# ---- CUDA shared memory and metadata -----------------------------------------------


def test_cuda_shared_memory_gives_a_clear_error(client):
    handle = b"\0" * 64
    raw = base64.b64encode(handle) if client.protocol == "http" else handle
    with pytest.raises(InferenceServerException) as info:
        client.register_cuda_shared_memory("gpu_region", raw, 0, 64)
    message = info.value.message()
    assert "failed to register CUDA shared memory region: 'gpu_region'" in message
    assert "not supported" in message
    if client.protocol == "http":
        assert client.get_cuda_shared_memory_status() == []
    else:
        assert len(client.get_cuda_shared_memory_status().regions) == 0
    client.unregister_cuda_shared_memory("gpu_region")
    assert_still_serving(client)


def test_server_metadata_lists_the_extensions(client):
    meta = client.get_server_metadata()
    extensions = meta["extensions"] if client.protocol == "http" else list(meta.extensions)
    assert "system_shared_memory" in extensions
    assert "cuda_shared_memory" in extensions
