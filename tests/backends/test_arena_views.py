"""Large tensors cross the worker boundary with at most one copy into an arena and none out.

A request's input is copied once into the front's arena; the worker reads it in place; an output
that is a view of that input goes back as a reference to it (no copy), any other output is copied
once into the worker's arena; the front hands the transport a view of the arena, not a copy, and
keeps the region reserved until the last view of it is gone (arena_views.py). These tests count
the copies by address and check that no region is reused while a response view is alive.
"""

from __future__ import annotations

import asyncio
import gc
import json
import os
import shutil
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

import triton_python_backend_utils as pb_utils
from kernel.backends.python import messages, wire
from kernel.backends.python.arena import Arena, PeerArena
from kernel.backends.python.arena_views import ArenaViews
from kernel.backends.python.responses import ResponseSink, response_message
from kernel.core.backend import ModelSource
from kernel.core.request import InferRequest, InferTensor

ROOT = Path(__file__).resolve().parents[2]
IDENTITY = ROOT / "benchmarks" / "model_repo_suite" / "identity_fp32"
N = 1 << 20  # 4 MiB of FP32: far above the inline limit


def address(buffer) -> int:
    return np.frombuffer(buffer, np.uint8).__array_interface__["data"][0]


def pair(size=64 << 20):
    """An arena and its peer mapping in this process, as the two sides of a worker see them."""
    arena, peer = Arena(size, size), PeerArena()
    arena.on_new_segment = lambda index, seg: peer.add(index, os.dup(seg.fd), seg.size)
    return arena, peer


def worker_input(t, peer) -> pb_utils.Tensor:
    """The input tensor a worker makes of an arena input: an array over the front's region."""
    root = np.frombuffer(wire.view(t, peer), np.float32)
    return pb_utils.Tensor._wrap(t.name, root.reshape(t.shape), t.datatype)


def run_on_loop(fn):
    async def main():
        return fn()
    return asyncio.run(main())


def test_a_worker_output_view_holds_its_region_until_the_last_reader_is_gone():
    worker_arena, front_peer = pair()
    released = []
    views = ArenaViews(Arena(1 << 20, 1 << 20), front_peer, released.append)
    data = np.arange(N, dtype=np.float32)

    async def main():
        t = wire.pack("Y", "FP32", [N], memoryview(data).cast("B"), worker_arena)  # the worker's one copy
        tensor = views.unpack(t, None)
        raw = tensor.raw
        # No copy out: the transport's bytes are the worker arena's bytes.
        assert address(raw) == front_peer.segments[t.segment].addr + t.offset
        np.testing.assert_array_equal(tensor.as_numpy(), data)
        derived = memoryview(raw)[16:]  # what a transport might keep while it writes
        del tensor, raw
        gc.collect()
        await asyncio.sleep(0)
        assert released == [] and views.live == 1  # a slice still reads the region
        del derived
        await asyncio.sleep(0)
        assert released == [[(t.segment, t.offset)]] and views.live == 0
        worker_arena.free(t.segment, t.offset)
        assert worker_arena.allocated == 0

    try:
        asyncio.run(main())
    finally:
        views.close()
        front_peer.close()
        worker_arena.close()


def test_an_input_region_an_output_refers_to_is_not_reused_while_the_output_is_alive():
    front_arena, worker_peer = pair()
    views = ArenaViews(front_arena, PeerArena(), lambda regions: None)
    data = np.arange(N, dtype=np.float32)

    async def main():
        t_in = wire.pack("X", "FP32", [N], memoryview(data).cast("B"), front_arena)  # the one copy in
        regions = [(t_in.segment, t_in.offset)]
        # The worker side: an identity model's output is its input array, in the front's arena.
        source = worker_input(t_in, worker_peer)
        sink = ResponseSink(None, 1, None, wire.arena_inputs([t_in], worker_peer, [source]))
        worker_arena = Arena(1 << 20, 1 << 20)
        response = pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("Y", source.as_numpy())])
        msg = response_message(sink, response, True, worker_arena)
        assert worker_arena.allocated == 0  # no copy into the worker's arena
        worker_arena.close()
        t_out = msg.outputs[0]
        assert t_out.owner == t_in.offset and t_out.data is None
        tensor = views.unpack(t_out, regions)
        assert address(tensor.raw) == front_arena.segments[0].addr + t_in.offset  # no copy out either
        views.free_inputs(regions)  # the request ended: its input must outlive the response view
        other = front_arena.alloc(N * 4)
        assert other != (t_in.segment, t_in.offset)
        front_arena.free(*other)
        np.testing.assert_array_equal(tensor.as_numpy(), data)
        del tensor
        await asyncio.sleep(0)
        assert front_arena.allocated == 0  # freed when the last view went

    try:
        asyncio.run(main())
    finally:
        views.close()
        worker_peer.close()
        front_arena.close()


def test_an_input_array_the_model_still_holds_goes_back_as_a_copy():
    # The model could still write into it after the hand-over (issue 23 B): the answer must not move.
    front_arena, worker_peer = pair()
    worker_arena = Arena(64 << 20, 64 << 20)
    try:
        t_in = wire.pack("X", "FP32", [N], memoryview(np.arange(N, dtype=np.float32)).cast("B"), front_arena)
        source = worker_input(t_in, worker_peer)
        kept = source.as_numpy()  # what `self.kept = arr` does
        sink = ResponseSink(None, 1, None, wire.arena_inputs([t_in], worker_peer, [source]))
        msg = response_message(sink, pb_utils.InferenceResponse([pb_utils.Tensor("Y", kept)]), True, worker_arena)
        assert msg.outputs[0].owner == -1 and worker_arena.allocated >= N * 4  # copied once
        assert kept.flags.writeable and source.as_numpy() is kept  # still the model's own array
        # Without the model's reference, the same output goes by reference, and the model's next look
        # at its input is an array of its own (writable), not the memory now on its way out.
        del kept
        msg = response_message(sink, pb_utils.InferenceResponse([pb_utils.Tensor("Y", source.as_numpy())]), True,
                               worker_arena)
        assert msg.outputs[0].owner == t_in.offset
        mine = source.as_numpy()
        assert mine.flags.writeable and address(mine) != front_arena.segments[0].addr + t_in.offset
        np.testing.assert_array_equal(mine, np.arange(N, dtype=np.float32))
    finally:
        worker_arena.close()
        worker_peer.close()
        front_arena.close()


def test_an_output_may_refer_only_to_its_own_requests_inputs():
    front_arena = Arena(64 << 20, 64 << 20)
    views = ArenaViews(front_arena, PeerArena(), lambda regions: None)
    try:
        seg, off = front_arena.alloc(N * 4)
        bad = [
            messages.Tensor("Y", "FP32", [N], None, seg, off, N * 4, off + 64),  # not an allocation
            messages.Tensor("Y", "FP32", [N], None, seg, off + 64, N * 4, off),  # past its end
            messages.Tensor("Y", "FP32", [N], None, 7, 0, 64, 0),  # no such segment
        ]
        for t in bad:
            with pytest.raises(ValueError):
                run_on_loop(lambda t=t: views.unpack(t, [(seg, off)]))
        with pytest.raises(ValueError):  # a live region, but another request's
            run_on_loop(lambda: views.unpack(messages.Tensor("Y", "FP32", [N], None, seg, off, N * 4, off), [(0, 1)]))
        assert views.live == 0
    finally:
        views.close()
        front_arena.close()


def test_a_fresh_output_array_is_copied_once_into_the_worker_arena():
    worker_arena, _ = pair()
    try:
        sink = ResponseSink(None, 1, None, None)
        out = np.ones(N, dtype=np.float32)
        msg = response_message(sink, pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor("Y", out)]), True,
                               worker_arena)
        assert msg.outputs[0].owner == -1 and worker_arena.allocated >= out.nbytes
    finally:
        worker_arena.close()


# ---- end to end: a real worker process serving the identity model ---------------------------


def identity_instance(tmp_path):
    from kernel.backends.python.instance import WorkerInstance, WorkerSettings

    repo = tmp_path / "repo"
    shutil.copytree(IDENTITY, repo / "identity_fp32")
    config = {"name": "identity_fp32", "backend": "python", "max_batch_size": 0,
              "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": ["-1"]}]}
    source = ModelSource("identity_fp32", 1, repo / "identity_fp32", repo / "identity_fp32" / "1", repo,
                         SimpleNamespace(default_model_filename="", parameters={}), json.dumps(config))
    return WorkerInstance(source, "identity_fp32_0_0", "KIND_CPU", 0, WorkerSettings())


def test_identity_round_trip_copies_the_tensor_once_and_reuses_regions_only_after_the_transport(tmp_path):
    inst = identity_instance(tmp_path)

    async def infer(data):
        got = asyncio.get_running_loop().create_future()
        r = InferRequest("identity_fp32", "", "r", [InferTensor("INPUT0", "FP32", [N], raw=memoryview(data).cast("B"))])
        r.on_response = got.set_result
        inst.submit([r])
        return await asyncio.wait_for(got, 30)

    async def main():
        await inst.start()
        try:
            first, second = np.arange(N, dtype=np.float32), -np.arange(N, dtype=np.float32)
            a = await infer(first)
            assert a.error is None, a.error
            raw_a = a.outputs[0].raw
            # Input: one copy into the front's arena. Output: the worker referred back to it, and the
            # transport's bytes are that same arena memory (no copy into the worker's arena, none out).
            assert inst._arena.allocated >= first.nbytes
            seg = inst._arena.segments[0]
            assert seg.addr <= address(raw_a) < seg.addr + seg.size
            b = await infer(second)  # while a's view is alive, b may not land on a's region
            raw_b = b.outputs[0].raw
            assert address(raw_b) != address(raw_a)
            np.testing.assert_array_equal(np.frombuffer(raw_a, np.float32), first)
            np.testing.assert_array_equal(np.frombuffer(raw_b, np.float32), second)
            del a, b, raw_a, raw_b
            await asyncio.sleep(0)
            assert inst._arena.allocated == 0 and inst._views.live == 0
        finally:
            await inst.stop(5)

    asyncio.run(main())


DOUBLE = '''
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        return [pb_utils.InferenceResponse(output_tensors=[pb_utils.Tensor(
            "OUTPUT0", pb_utils.get_input_tensor_by_name(r, "INPUT0").as_numpy() * 2)]) for r in requests]
'''


def test_a_new_output_array_is_copied_once_and_its_worker_region_waits_for_the_transport(tmp_path):
    inst = identity_instance(tmp_path)
    (inst.model_file).write_text(DOUBLE)

    async def infer(data):
        got = asyncio.get_running_loop().create_future()
        r = InferRequest("identity_fp32", "", "r", [InferTensor("INPUT0", "FP32", [N], raw=memoryview(data).cast("B"))])
        r.on_response = got.set_result
        inst.submit([r])
        return await asyncio.wait_for(got, 30)

    async def main():
        await inst.start()
        try:
            ones = np.ones(N, dtype=np.float32)
            a = await infer(ones)
            raw_a = a.outputs[0].raw
            seg = inst._peer.segments[0]  # the worker's arena, as mapped here: the output was copied there once
            assert seg.addr <= address(raw_a) < seg.addr + seg.size
            b = await infer(ones * 3)
            raw_b = b.outputs[0].raw
            assert address(raw_b) != address(raw_a)  # a's region is still being read: not reused
            np.testing.assert_array_equal(np.frombuffer(raw_a, np.float32), ones * 2)
            np.testing.assert_array_equal(np.frombuffer(raw_b, np.float32), ones * 6)
            first = address(raw_a)
            del a, raw_a
            for _ in range(100):  # the Release reaches the worker
                await asyncio.sleep(0.01)
            c = await infer(ones * 5)
            assert address(c.outputs[0].raw) == first  # given back, then reused
            np.testing.assert_array_equal(c.outputs[0].as_numpy(), ones * 10)
        finally:
            await inst.stop(5)

    asyncio.run(main())
