"""A client shrinks its registered shared-memory object: the request is a 400, the server lives (issue 14 item 3).

Before the fix the front process read and wrote client regions through a mapping; touching
a page past the object's new end raised SIGBUS and the server died (exit 135, no log line).
"""

from __future__ import annotations

import os
import uuid
from pathlib import Path

import httpx
import numpy as np
import pytest

from conftest import KernelProcess, running

MODELS = Path(__file__).resolve().parent / "models"
SIZE = 1 << 20


@pytest.fixture(scope="module")
def server():
    yield from running(KernelProcess([MODELS]))


@pytest.fixture
def shm_object():
    """A fresh /dev/shm object of SIZE bytes; yields (key, fd); removed afterwards."""
    key = f"/kernel-hostile-{uuid.uuid4().hex[:10]}"
    fd = os.open(f"/dev/shm{key}", os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
    os.ftruncate(fd, SIZE)
    try:
        yield key, fd
    finally:
        os.close(fd)
        os.unlink(f"/dev/shm{key}")


def register(url: str, name: str, key: str) -> None:
    r = httpx.post(f"http://{url}/v2/systemsharedmemory/region/{name}/register",
                   json={"key": key, "offset": 0, "byte_size": SIZE}, timeout=10)
    assert r.status_code == 200, r.text


def unregister(url: str, name: str) -> None:
    httpx.post(f"http://{url}/v2/systemsharedmemory/region/{name}/unregister", timeout=10)


def shm_param(region: str, offset: int) -> dict:
    return {"shared_memory_region": region, "shared_memory_offset": offset, "shared_memory_byte_size": 16}


def infer(url: str, input_region: str | None = None, output_region: str | None = None) -> httpx.Response:
    inputs = []
    for i, name in enumerate(("INPUT0", "INPUT1")):
        t = {"name": name, "shape": [4], "datatype": "FP32"}
        if input_region is not None:
            t["parameters"] = shm_param(input_region, SIZE - 4096 + 16 * i)
        else:
            t["data"] = [1, 2, 3, 4]
        inputs.append(t)
    body = {"inputs": inputs}
    if output_region is not None:
        body["outputs"] = [{"name": "OUTPUT0", "parameters": shm_param(output_region, SIZE - 4096)}]
    return httpx.post(f"http://{url}/v2/models/add_sub_x2/infer", json=body, timeout=30)


def assert_alive(server) -> None:
    assert server.proc.poll() is None, f"server died with {server.proc.returncode}"
    r = infer(server.url)
    assert r.status_code == 200, r.text


def test_shrunk_input_region_is_400_not_sigbus(server, shm_object):
    key, fd = shm_object
    register(server.url, "in", key)
    try:
        assert infer(server.url, input_region="in").status_code == 200
        os.ftruncate(fd, 0)
        r = infer(server.url, input_region="in")
        assert r.status_code == 400, r.text
        assert "made smaller after it was registered" in r.json()["error"]
        assert_alive(server)
    finally:
        unregister(server.url, "in")


def test_shrunk_output_region_is_400_not_sigbus(server, shm_object):
    key, fd = shm_object
    register(server.url, "out", key)
    try:
        r = infer(server.url, output_region="out")
        assert r.status_code == 200, r.text
        assert os.pread(fd, 16, SIZE - 4096) == np.array([2, 4, 6, 8], np.float32).tobytes()
        os.ftruncate(fd, 4096)
        r = infer(server.url, output_region="out")
        assert r.status_code == 400, r.text
        assert "made smaller after it was registered" in r.json()["error"]
        assert os.fstat(fd).st_size == 4096  # nothing was written past the new end
        assert_alive(server)
    finally:
        unregister(server.url, "out")


def test_unregister_closes_the_object(server, shm_object):
    key, _ = shm_object
    register(server.url, "gone", key)
    unregister(server.url, "gone")
    fds = f"/proc/{server.proc.pid}/fd"
    held = []
    for fd in os.listdir(fds):
        try:
            held.append(os.readlink(f"{fds}/{fd}"))
        except OSError:
            pass
    assert f"/dev/shm{key}" not in held
