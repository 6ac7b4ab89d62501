"""The Python backend's submit path undoes everything when a batch cannot reach its worker (issue 14 item 1).

A request used to be counted pending and executing (and its inputs written to the
arena) before its frame was encoded; when encoding failed (a sequence id of 2**64
raised OverflowError) nothing was undone and the model was wedged. These tests drive
WorkerInstance.submit with a channel that encodes for real, without a worker process. The same
holds for a batch whose inputs are copied into the arena beside the loop (the last tests).
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace

import msgspec
import numpy as np
import pytest

from kernel.backends.python.input_copy import COPY_BESIDE_BYTES
from kernel.backends.python.instance import WorkerInstance, WorkerSettings
from kernel.core.backend import ModelSource
from kernel.core.errors import ErrorCode
from kernel.core.request import InferRequest, InferTensor


class EncodingChannel:
    """Encodes like MessageChannel.send; `fail` makes the write itself fail."""

    closed = False

    def __init__(self, fail: Exception | None = None):
        self.encoder = msgspec.msgpack.Encoder()
        self.fail = fail
        self.sent = []

    def send(self, message) -> None:
        payload = self.encoder.encode(message)
        if self.fail is not None:
            raise self.fail
        self.sent.append(payload)


def instance(channel) -> WorkerInstance:
    source = ModelSource("m", 1, Path("/nonexistent/m"), Path("/nonexistent/m/1"), Path("/nonexistent"),
                         SimpleNamespace(default_model_filename="", parameters={}), "{}")
    inst = WorkerInstance(source, "m_0_0", "KIND_CPU", 0, WorkerSettings(shm_default_byte_size=1 << 20))
    inst.healthy = True
    inst.channel = channel
    inst._fd_sock = SimpleNamespace(close=lambda: None)
    inst._announce_segment = lambda index, segment: None
    inst._arena.on_new_segment = None
    return inst


def request(correlation_id=0, nbytes=256 * 1024) -> tuple[InferRequest, list]:
    """A request with one input large enough to be written to the arena; its responses go to the list."""
    got = []
    r = InferRequest("m", "", "r1", [InferTensor("IN", "UINT8", [nbytes], raw=b"\1" * nbytes)],
                     correlation_id=correlation_id)
    r.on_response = got.append
    return r, got


@pytest.mark.parametrize("correlation_id", [2**64, -1, None, 1.5, [1]], ids=repr)
def test_an_unencodable_request_is_failed_and_nothing_is_left_counted(correlation_id):
    inst = instance(EncodingChannel())
    try:
        r, got = request(correlation_id)
        inst.submit([r])
        assert len(got) == 1 and got[0].error is not None
        assert got[0].error.code is ErrorCode.INVALID_ARG
        assert "correlation id" in got[0].error.message
        assert inst.in_flight == 0 and inst._executing == 0
        assert inst._arena.allocated == 0
        assert not inst._input_regions and not inst._traced
        # The next good request goes through and is counted once.
        ok, _ = request(7)
        inst.submit([ok])
        assert inst.in_flight == 1 and inst._executing == 1 and len(inst.channel.sent) == 1
    finally:
        inst._arena.close()


def test_a_write_that_fails_undoes_the_whole_batch():
    inst = instance(EncodingChannel(fail=ConnectionError("channel is closed")))
    try:
        (a, got_a), (b, got_b) = request(1), request(2)
        inst.submit([a, b])
        for got in (got_a, got_b):
            assert len(got) == 1 and got[0].error.code is ErrorCode.INTERNAL
            assert "ConnectionError" in got[0].error.message
        assert inst.in_flight == 0 and inst._executing == 0 and inst._arena.allocated == 0
        a.cancel()  # no cancel callback was left behind to write to the dead channel
    finally:
        inst._arena.close()


# ---- a batch copied into the arena beside the loop (request_path.py, input_copy.py) ------------

BIG = COPY_BESIDE_BYTES + 64 * 1024


def test_a_large_batch_leaves_after_its_copy_and_the_batches_behind_it_keep_their_order():
    """Over COPY_BESIDE_BYTES of inputs, submit returns before the batch is written: it is copied on
    a thread, counted in flight meanwhile, and a batch submitted after it waits behind it, so the
    worker reads them in the order they were given, the large one's bytes in its region."""
    inst = instance(EncodingChannel())

    async def main():
        big = InferRequest("m", "", "big", [InferTensor("IN", "UINT8", [BIG], raw=np.full(BIG, 7, np.uint8))])
        small, _ = request(2)
        big.on_response = lambda r: None
        inst.submit([big])
        inst.submit([small])
        assert inst.channel.sent == [], "the large batch was written before its copy, on the loop"
        assert inst.in_flight == 2 and inst._executing == 2
        for _ in range(500):
            await asyncio.sleep(0.01)
            if len(inst.channel.sent) == 2:
                break
        sent = [msgspec.msgpack.decode(p) for p in inst.channel.sent]
        assert len(sent) == 2, "the batches behind the copy were never written"
        assert inst.in_flight == 2 and inst._executing == 2
        first, second = sent
        assert "big" in str(first) and "big" not in str(second), "the batches left out of order"
        (segment, offset), = inst._input_regions[min(inst._input_regions)]
        assert bytes(inst._arena.view(segment, offset, BIG)[::65536]) == b"\7" * len(range(0, BIG, 65536))

    try:
        asyncio.run(main())
    finally:
        inst._arena.close()


def test_a_worker_lost_during_a_copy_answers_every_request_and_holds_nothing():
    inst = instance(EncodingChannel())

    async def main():
        got_big = []
        big = InferRequest("m", "", "big", [InferTensor("IN", "UINT8", [BIG], raw=np.full(BIG, 7, np.uint8))])
        big.on_response = got_big.append
        small, got_small = request(2)
        inst.submit([big])
        inst.submit([small])
        inst.healthy = False
        inst._fail_pending("Stub process 'm_0_0' is not healthy.", framed=False)
        assert len(got_small) == 1 and got_small[0].error.code is ErrorCode.INTERNAL
        for _ in range(500):
            await asyncio.sleep(0.01)
            if got_big:
                break
        assert len(got_big) == 1 and "not healthy" in got_big[0].error.message
        assert inst.channel.sent == [], "a batch was written after its worker was lost"
        assert inst.in_flight == 0 and inst._executing == 0 and inst._arena.allocated == 0

    try:
        asyncio.run(main())
    finally:
        inst._arena.close()


def test_a_write_that_fails_after_a_copy_undoes_the_batch_and_lets_the_next_through():
    channel = EncodingChannel(fail=ConnectionError("channel is closed"))
    inst = instance(channel)

    async def main():
        got_big = []
        big = InferRequest("m", "", "big", [InferTensor("IN", "UINT8", [BIG], raw=np.full(BIG, 7, np.uint8))])
        big.on_response = got_big.append
        inst.submit([big])
        for _ in range(500):
            await asyncio.sleep(0.01)
            if got_big:
                break
        assert len(got_big) == 1 and "ConnectionError" in got_big[0].error.message
        assert inst.in_flight == 0 and inst._executing == 0 and inst._arena.allocated == 0
        channel.fail = None
        ok, _ = request(3)
        inst.submit([ok])
        assert len(channel.sent) == 1 and inst._executing == 1

    try:
        asyncio.run(main())
    finally:
        inst._arena.close()
