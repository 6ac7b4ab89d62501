"""A large tensor in a client's system shared-memory region costs its own client time, not every
client's (a front's event loop).

Inputs in a system region are copied out of the client's object with pread, and outputs written
into it with pwrite (kernel/core/shared_memory.py says why not a mapping). Both ran on the loop:
one 1 GiB input held the front for ~0.6 s on this kind of box, and its 1 GiB answer for another
~0.3 s, every other client waiting. Now a request's inputs over 2 MiB are read on a thread when
it is submitted (kernel/core/admission.py) and a response's outputs over 2 MiB written on a
thread (kernel/core/output_writes.py). These tests drive a real `kernel serve` through
tritonclient's own shared-memory utilities, as a user would, and check what the client sees: the
bytes in its output region, and 400s naming the region when it shrinks the object under a large
tensor.
"""

from __future__ import annotations

import os
import shutil
import uuid

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm
from tritonclient.utils import InferenceServerException

from conftest import ROOT, KernelProcess, running
from liveness import LivenessProbe

MIB = 1 << 20
MAX_FREEZE_MS = 300  # generous for a loaded 2-core box; the loop-bound read alone took ~600 ms


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    repo = tmp_path_factory.mktemp("large-shm")
    shutil.copytree(ROOT / "benchmarks" / "model_repo_suite" / "identity_fp32", repo / "identity_fp32")
    yield from running(KernelProcess([repo]))


@pytest.fixture
def regions():
    """make(byte_size) -> (name, key, handle): a fresh client region; all destroyed afterwards."""
    made = []

    def make(byte_size: int):
        key = f"/kernel-large-shm-{uuid.uuid4().hex[:12]}"
        handle = shm.create_shared_memory_region(key, key, byte_size)
        made.append(handle)
        return key.lstrip("/"), key, handle

    yield make
    for handle in made:
        shm.destroy_shared_memory_region(handle)


@pytest.fixture(params=["http", "grpc"])
def client(request, server):
    lib = httpclient if request.param == "http" else grpcclient
    c = (httpclient.InferenceServerClient(server.url, network_timeout=300) if lib is httpclient
         else grpcclient.InferenceServerClient(server.grpc_url))
    c.lib = lib
    yield c
    c.unregister_system_shared_memory()
    c.close()


def infer(client, n: int, in_region: str, out_region: str, in_offset: int = 0, out_offset: int = 0):
    lib = client.lib
    inp = lib.InferInput("INPUT0", [n], "FP32")
    inp.set_shared_memory(in_region, n * 4, in_offset)
    out = lib.InferRequestedOutput("OUTPUT0")
    out.set_shared_memory(out_region, n * 4, out_offset)
    if lib is grpcclient:
        return client.infer("identity_fp32", [inp], outputs=[out], client_timeout=300)
    return client.infer("identity_fp32", [inp], outputs=[out])  # (network_timeout: the client's own)


def test_a_1_gib_tensor_in_and_out_of_shared_memory_does_not_freeze_the_front(server, regions):
    n = 1 << 28  # floats: 1 GiB each way
    client = httpclient.InferenceServerClient(server.url, network_timeout=300)
    client.lib = httpclient
    try:
        in_name, in_key, in_handle = regions(n * 4)
        out_name, out_key, out_handle = regions(n * 4)
        data = np.arange(n, dtype=np.uint32).view(np.float32)
        shm.set_shared_memory_region(in_handle, [data])
        client.register_system_shared_memory(in_name, in_key, n * 4)
        client.register_system_shared_memory(out_name, out_key, n * 4)
        with LivenessProbe(server.url) as probe:
            result = infer(client, n, in_name, out_name)
        print(probe.summary())
        assert "data" not in result.get_output("OUTPUT0")  # the answer is in the region, not the body
        got = shm.get_contents_as_numpy(out_handle, np.float32, [n])
        assert np.array_equal(got.view(np.uint32), data.view(np.uint32)), "the output region does not hold the input"
        assert len(probe.latencies_ms) >= 10, probe.summary()
        assert probe.max_ms() < MAX_FREEZE_MS, (
            f"/v2/health/live froze while 1 GiB was read from and written to shared memory: {probe.summary()}")
    finally:
        client.unregister_system_shared_memory()
        client.close()


def test_large_tensors_of_many_requests_land_in_their_own_regions(client, regions):
    """Eight requests of 3 MiB each (over the 2 MiB line: read and written on threads), in flight
    together, each with its own input and output window in one pair of regions."""
    n = 3 * MIB // 4
    count = 8
    in_name, in_key, in_handle = regions(count * n * 4)
    out_name, out_key, out_handle = regions(count * n * 4)
    rng = np.random.default_rng(7)
    data = rng.standard_normal(count * n, dtype=np.float32)
    shm.set_shared_memory_region(in_handle, [data])
    client.register_system_shared_memory(in_name, in_key, count * n * 4)
    client.register_system_shared_memory(out_name, out_key, count * n * 4)
    lib = client.lib
    pending = []
    for i in range(count):
        inp = lib.InferInput("INPUT0", [n], "FP32")
        inp.set_shared_memory(in_name, n * 4, i * n * 4)
        out = lib.InferRequestedOutput("OUTPUT0")
        out.set_shared_memory(out_name, n * 4, i * n * 4)
        if lib is httpclient:
            pending.append(client.async_infer("identity_fp32", [inp], outputs=[out]))
        else:
            results = []
            pending.append(results)
            client.async_infer("identity_fp32", [inp], lambda result, error, into=results: into.append((result, error)), outputs=[out])
    for p in pending:
        if lib is httpclient:
            p.get_result()
        else:
            _wait(p)
    got = shm.get_contents_as_numpy(out_handle, np.float32, [count * n])
    assert np.array_equal(got, data), "an output window does not hold its own request's input"


def _wait(results: list, timeout: float = 60.0) -> None:
    import time

    deadline = time.monotonic() + timeout
    while not results and time.monotonic() < deadline:
        time.sleep(0.01)
    assert results, "no answer"
    result, error = results[0]
    assert error is None, error


def test_a_shrunk_object_under_a_large_input_is_a_400_naming_the_region(client, regions, server):
    n = 4 * MIB // 4
    in_name, in_key, in_handle = regions(2 * n * 4)
    out_name, out_key, out_handle = regions(n * 4)
    client.register_system_shared_memory(in_name, in_key, 2 * n * 4)
    client.register_system_shared_memory(out_name, out_key, n * 4)
    fd = os.open(f"/dev/shm{in_key}", os.O_RDWR)
    try:
        os.ftruncate(fd, n * 4)  # the second half of the registered window is gone
    finally:
        os.close(fd)
    with pytest.raises(InferenceServerException) as caught:
        infer(client, n, in_name, out_name, in_offset=n * 4)
    assert "400" in str(caught.value.status()) or "INVALID_ARGUMENT" in str(caught.value.status()), caught.value
    assert in_name in caught.value.message() and "made smaller" in caught.value.message(), caught.value.message()
    _still_serves(client, regions)


def test_a_shrunk_object_under_a_large_output_is_a_400_naming_the_region(client, regions, server):
    n = 4 * MIB // 4
    in_name, in_key, in_handle = regions(n * 4)
    out_name, out_key, out_handle = regions(n * 4)
    shm.set_shared_memory_region(in_handle, [np.ones(n, np.float32)])
    client.register_system_shared_memory(in_name, in_key, n * 4)
    client.register_system_shared_memory(out_name, out_key, n * 4)
    fd = os.open(f"/dev/shm{out_key}", os.O_RDWR)
    try:
        os.ftruncate(fd, MIB)
    finally:
        os.close(fd)
    with pytest.raises(InferenceServerException) as caught:
        infer(client, n, in_name, out_name)
    assert "400" in str(caught.value.status()) or "INVALID_ARGUMENT" in str(caught.value.status()), caught.value
    assert out_name in caught.value.message() and "made smaller" in caught.value.message(), caught.value.message()
    _still_serves(client, regions)


def _still_serves(client, regions) -> None:
    n = 3 * MIB // 4
    in_name, in_key, in_handle = regions(n * 4)
    out_name, out_key, out_handle = regions(n * 4)
    data = np.arange(n, dtype=np.float32)
    shm.set_shared_memory_region(in_handle, [data])
    client.register_system_shared_memory(in_name, in_key, n * 4)
    client.register_system_shared_memory(out_name, out_key, n * 4)
    infer(client, n, in_name, out_name)
    assert np.array_equal(shm.get_contents_as_numpy(out_handle, np.float32, [n]), data)
