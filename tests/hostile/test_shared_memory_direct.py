"""An input in a client's system shared-memory region goes straight into the Python backend's arena,
and a client that shrinks its object under it gets a 400 without taking its batch-mates along.

The core leaves large unread inputs (kernel.core.shared_memory.InputWindow) to backends that take
them (BackendInstance.takes_input_windows); the Python backend reads them with pread into the
region it reserved for them (backends/python/input_copy.py): one copy instead of a read into a new
buffer and a copy from it. These tests drive WorkerInstance.submit with a channel that encodes for
real, without a worker process, and play the worker's responses back through _on_responses.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from types import SimpleNamespace

import msgspec
import pytest

from kernel.backends.python import messages
from kernel.backends.python.instance import WorkerInstance, WorkerSettings
from kernel.core.backend import ModelSource
from kernel.core.errors import ErrorCode
from kernel.core.request import InferRequest
from kernel.core.shared_memory import InputWindow
from kernel.core.stats import ModelStats
from shm_objects import input_request, registered_object

SIZE = 1 << 20
N = 256 * 1024  # each request's window: over the 64 KiB read at once, so left to the backend


class EncodingChannel:
    closed = False

    def __init__(self):
        self.encoder = msgspec.msgpack.Encoder()
        self.sent = []

    def send(self, message) -> None:
        self.sent.append(msgspec.msgpack.decode(self.encoder.encode(message)))


@pytest.fixture
def inst():
    source = ModelSource("m", 1, Path("/nonexistent/m"), Path("/nonexistent/m/1"), Path("/nonexistent"),
                         SimpleNamespace(default_model_filename="", parameters={}), "{}")
    inst = WorkerInstance(source, "m_0_0", "KIND_CPU", 0, WorkerSettings(shm_default_byte_size=4 << 20))
    inst.healthy = True
    inst.channel = EncodingChannel()
    inst._fd_sock = SimpleNamespace(close=lambda: None)
    inst._announce_segment = lambda index, segment: None
    inst._arena.on_new_segment = None
    yield inst
    inst._arena.close()


@pytest.fixture
def region():
    """Region 'r' over a fresh 1 MiB object holding 0, 1, 2, ... (mod 251); yields (manager, fd, content)."""
    with registered_object(SIZE) as made:
        yield made


def shm_request(manager, rid: str, offset: int) -> tuple[InferRequest, list]:
    r = input_request(manager, rid, offset, N)
    assert type(r.inputs[0]._raw) is InputWindow
    got = []
    r.on_response = got.append
    r.arrival_ns = time.monotonic_ns()  # as a transport stamps it (statistics count from it)
    return r, got


def sent_requests(inst) -> list:
    [execute] = inst.channel.sent
    return execute[1]  # Execute: ["exec", requests, ...]; each request: [key, request_id, inputs, ...]


def answer(inst, key: int) -> None:
    """The worker's final response: one small inline output."""
    inst._on_responses([messages.Response(key, [messages.Tensor("OUT", "UINT8", [1], b"\x01")])])


def test_the_bytes_are_read_into_the_arena_region(inst, region):
    manager, _, content = region
    r, _ = shm_request(manager, "a", 4096)
    inst.submit([r])
    [sent] = sent_requests(inst)
    [tensor] = sent[2]
    segment, offset, nbytes = tensor[4], tensor[5], tensor[6]
    assert nbytes == N
    assert bytes(inst._arena.view(segment, offset, N)) == content[4096 : 4096 + N].tobytes()


def test_a_shrunk_object_fails_only_its_own_request_before_the_batch_leaves(inst, region):
    manager, fd, content = region
    a, got_a = shm_request(manager, "a", 0)
    b, got_b = shm_request(manager, "b", SIZE - N)
    os.ftruncate(fd, SIZE // 2)  # b's window is gone, a's is whole
    inst.submit([a, b])
    assert len(got_b) == 1 and got_b[0].error.code is ErrorCode.INVALID_ARG
    assert "shared memory region 'r'" in got_b[0].error.message and "made smaller" in got_b[0].error.message
    [sent] = sent_requests(inst)
    assert sent[1] == "a", "the batch did not go on without the request that could not be read"
    assert inst.in_flight == 1 and inst._arena.allocated == N
    answer(inst, sent[0])
    assert len(got_a) == 1 and got_a[0].error is None and bytes(got_a[0].outputs[0].raw) == b"\x01"
    assert inst.in_flight == 0


def test_an_object_shrunk_during_the_read_fails_its_request_and_never_reaches_the_model(inst, region, monkeypatch):
    """The client shrinks its object between the check and the read (the check is made to pass):
    its request is answered with the error, counted as failed, and left out of the batch (its
    region given back); its batch-mate goes alone and gets its own answer."""
    manager, fd, _ = region
    inst.stats = ModelStats("m", "1")
    a, got_a = shm_request(manager, "a", 0)
    b, got_b = shm_request(manager, "b", SIZE - N)
    os.ftruncate(fd, SIZE - N // 2)  # half of b's window is gone
    monkeypatch.setattr(InputWindow, "fits", lambda self: True)
    inst.submit([a, b])
    assert len(got_b) == 1 and got_b[0].error is not None and got_b[0].error.code is ErrorCode.INVALID_ARG
    assert "made smaller" in got_b[0].error.message and got_b[0].final
    sent = sent_requests(inst)
    assert [s[1] for s in sent] == ["a"], "the request whose input was cut short reached the model"
    assert inst.in_flight == 1 and inst._arena.allocated == N, "b's region was not given back"
    answer(inst, sent[0][0])
    assert len(got_a) == 1 and got_a[0].error is None
    assert inst.in_flight == 0 and not inst._pending
    stats = inst.stats.to_json()["inference_stats"]
    assert stats["fail"]["count"] == 1 and inst.stats.failures["BACKEND"] == 1


def test_a_batch_whose_every_input_was_cut_short_is_not_sent(inst, region, monkeypatch):
    manager, fd, _ = region
    inst.stats = ModelStats("m", "1")
    b, got_b = shm_request(manager, "b", SIZE - N)
    os.ftruncate(fd, SIZE - N // 2)
    monkeypatch.setattr(InputWindow, "fits", lambda self: True)
    inst.submit([b])
    assert len(got_b) == 1 and got_b[0].error.code is ErrorCode.INVALID_ARG
    assert inst.channel.sent == [], "an Execute with no request left was sent"
    assert inst.in_flight == 0 and inst._arena.allocated == 0 and inst._executing == 0
    assert inst.stats.fail_count == 1
