"""Large shared-memory tensors are read and written beside the loop, and nothing reorders.

kernel.core.admission reads a request's large inputs on a thread and hands requests to the
model in the order they were submitted; kernel.core.output_writes writes a response's large
outputs on a thread and hands a request's responses on in the order the model sent them. These
tests use real /dev/shm objects and the real SharedMemoryManager, with the model and the client
replaced by lists of what reached them.
"""

from __future__ import annotations

import asyncio
import os
from dataclasses import dataclass

import numpy as np
import pytest

from kernel.core import shared_memory
from kernel.core.backend import BackendInstance
from kernel.core.errors import ErrorCode
from kernel.core.admission import READ_BESIDE_BYTES, Admission
from kernel.core.output_writes import WRITE_BESIDE_BYTES, OutputWrites
from kernel.core.request import InferRequest, InferResponse, InferTensor
from kernel.core.shared_memory import InputWindow, RequestWindows
from shm_objects import input_request, registered_object

MIB = 1 << 20
LARGE = 3 * MIB
assert READ_BESIDE_BYTES < LARGE and WRITE_BESIDE_BYTES < LARGE


@dataclass(eq=False)
class Model:
    """As much of kernel.core.model.Model as Admission reads: an instance that does not take
    unread inputs (BackendInstance.takes_input_windows), so the core reads them itself."""

    name: str
    version: int = 1
    instances: tuple = (BackendInstance,)
    response_cache: object = None
    bytes_inputs: bool = False


@pytest.fixture
def region():
    """A registered 4 MiB region 'r' over a fresh /dev/shm object holding 0, 1, 2, ... (uint8)."""
    with registered_object(4 * MIB) as made:
        yield made


async def settle(reads_or_writes, timeout: float = 10.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while reads_or_writes.count:
        assert asyncio.get_running_loop().time() < deadline, "still waiting"
        await asyncio.sleep(0.005)


async def test_requests_behind_a_large_read_reach_the_model_in_order(region):
    manager, _, content = region
    admitted = []
    reads = Admission(lambda model, request, validated: admitted.append((model.name, request.id)))
    m, other = Model("m"), Model("other")
    large = input_request(manager, "large", MIB, LARGE)
    assert type(large.inputs[0]._raw) is InputWindow  # not read while parsed
    small = InferRequest("m", id="after")  # nothing to read, but it came after `large`
    assert reads.take(m, large) is True
    assert reads.take(m, small) is True
    assert reads.take(other, InferRequest("other", id="elsewhere")) is False  # another model: not held
    assert admitted == [] and reads.count == 2  # the read goes on beside the loop
    await settle(reads)
    assert admitted == [("m", "large"), ("m", "after")]
    assert bytes(large.inputs[0].raw) == content[MIB : MIB + LARGE].tobytes()
    assert reads.take(m, InferRequest("m", id="later")) is False  # nothing waits any more


async def test_small_reads_are_done_at_once(region):
    manager, _, content = region
    reads = Admission(lambda model, request, validated: pytest.fail("admitted by Admission"))
    request = input_request(manager, "small", 100, READ_BESIDE_BYTES)
    assert reads.take(Model("m"), request) is False
    assert bytes(request.inputs[0].raw) == content[100 : 100 + READ_BESIDE_BYTES].tobytes()


async def test_a_shrunk_object_fails_its_request_and_the_next_goes_on(region):
    manager, fd, _ = region
    admitted, answers = [], []
    reads = Admission(lambda model, request, validated: admitted.append(request.id))
    m = Model("m")
    large = input_request(manager, "large", 0, LARGE)
    large.on_response = answers.append
    os.ftruncate(fd, MIB)  # the client shrinks its object after the request was parsed
    assert reads.take(m, large) is True
    assert reads.take(m, InferRequest("m", id="after")) is True
    await settle(reads)
    assert admitted == ["after"]
    [answer] = answers
    assert answer.error is not None and answer.error.code is ErrorCode.INVALID_ARG
    assert "shared memory region 'r'" in answer.error.message and "made smaller" in answer.error.message
    assert answer.model_name == "m" and answer.id == "large"


def test_an_input_larger_than_one_pread_is_read_in_pieces(region, monkeypatch):
    manager, fd, content = region
    monkeypatch.setattr(shared_memory, "_ONE_READ_BYTES", 4096)
    window = manager.input("r", 10, 200_000)
    assert type(window) is InputWindow
    assert bytes(window.read()) == content[10:200_010].tobytes()
    os.ftruncate(fd, 100_000)
    with pytest.raises(Exception) as caught:
        manager.input("r", 10, 200_000).read()
    assert "made smaller" in str(caught.value)


async def test_responses_behind_a_large_write_reach_the_client_in_order(region):
    manager, fd, _ = region
    writes = OutputWrites()
    windows = RequestWindows()
    window = windows.hold(manager.output_window("r", 0, 4 * MIB))
    windows.outputs["OUT"] = window
    request = InferRequest("m", id="q")
    request.shm = windows
    delivered = []
    request.on_response = delivered.append
    writes.route(request)
    first = np.full(LARGE, 7, np.uint8)
    second = np.full(1000, 9, np.uint8)
    request.on_response(InferResponse("m", "1", "q", [InferTensor.from_numpy("OUT", first)], final=False))
    request.on_response(InferResponse("m", "1", "q", [InferTensor.from_numpy("OUT", second)], final=False))
    request.on_response(InferResponse("m", "1", "q", [], final=True))
    assert delivered == [] and writes.count == 1  # the first is being written; the others wait behind it
    await settle(writes)
    assert [r.final for r in delivered] == [False, False, True]
    assert all(r.error is None for r in delivered)
    assert [bytes(t.raw) for t in delivered[0].outputs] == [b""]  # the bytes are in the region, not the response
    region_now = np.frombuffer(os.pread(fd, LARGE, 0), np.uint8)
    assert (region_now[:1000] == 9).all() and (region_now[1000:] == 7).all(), "written out of order"
    assert window.file is None  # the last response let go of the window


async def test_a_large_write_into_a_shrunk_object_fails_only_its_response(region):
    manager, fd, _ = region
    writes = OutputWrites()
    windows = RequestWindows()
    windows.outputs["OUT"] = windows.hold(manager.output_window("r", 0, 4 * MIB))
    request = InferRequest("m", id="q")
    request.shm = windows
    delivered = []
    request.on_response = delivered.append
    writes.route(request)
    os.ftruncate(fd, MIB)
    request.on_response(InferResponse("m", "1", "q", [InferTensor.from_numpy("OUT", np.ones(LARGE, np.uint8))]))
    await settle(writes)
    [answer] = delivered
    assert answer.error is not None and answer.error.code is ErrorCode.INVALID_ARG and answer.final
    assert "made smaller" in answer.error.message
