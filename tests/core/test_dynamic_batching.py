"""The dynamic batcher: batches under load, queue delay, queue policies, priorities, shapes, instances.

Behaviour is observed the way a user would: through the model's own report of
its batches (tests/models/scheduling/_shared/probe_model.py) and the
statistics extension. No upper bounds on timings: the box may be loaded.
"""

from __future__ import annotations

import asyncio
import json
import time
import urllib.request

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from conftest import TEST_MODELS, serving

REPO = TEST_MODELS / "scheduling" / "batching"


@pytest.fixture(scope="module")
def kernel():
    yield from serving([REPO])


@pytest.fixture
def client(kernel):
    c = httpclient.InferenceServerClient(kernel.url, concurrency=16, network_timeout=60)
    yield c
    c.close()


def vec_inputs(value: float = 1.0, rows=1):
    a = np.full((rows, 4) if rows else (4,), value, dtype=np.float32)
    out = []
    for name in ("INPUT0", "INPUT1"):
        t = httpclient.InferInput(name, list(a.shape), "FP32")
        t.set_data_from_numpy(a)
        out.append(t)
    return out


def stats(kernel, model: str) -> dict:
    with urllib.request.urlopen(f"http://{kernel.url}/v2/models/{model}/stats") as r:
        return json.loads(r.read())["model_stats"][0]


def gather(futures):
    """Results (or the InferenceServerException) of async_infer calls."""
    out = []
    for f in futures:
        try:
            out.append(f.get_result())
        except InferenceServerException as exc:
            out.append(exc)
    return out


def test_concurrent_requests_are_batched(kernel, client):
    results = gather([client.async_infer("dyn_batch", vec_inputs(float(i))) for i in range(16)])
    for i, r in enumerate(results):
        np.testing.assert_array_equal(r.as_numpy("OUTPUT0"), np.full((1, 4), 2.0 * i, np.float32))
    sizes = [int(r.as_numpy("BATCH")[0][0]) for r in results]
    assert max(sizes) > 1, sizes
    s = stats(kernel, "dyn_batch")
    assert s["inference_count"] == 16
    assert s["execution_count"] < 16
    assert sum(b["batch_size"] * b["compute_infer"]["count"] for b in s["batch_stats"]) == 16
    assert any(b["batch_size"] > 1 for b in s["batch_stats"])


def test_requests_with_several_rows_are_batched_by_total_batch_size(kernel, client):
    before = stats(kernel, "dyn_batch")["inference_count"]
    results = gather([client.async_infer("dyn_batch", vec_inputs(1.0, rows=3)) for _ in range(5)])
    for r in results:
        assert r.as_numpy("OUTPUT0").shape == (3, 4)
    assert stats(kernel, "dyn_batch")["inference_count"] == before + 15


def test_queue_delay_is_honoured(kernel, client):
    # preferred batch size 4, max_queue_delay 600 ms: a lone request waits the delay out...
    start = time.monotonic()
    alone = client.infer("dyn_delay", vec_inputs())
    assert time.monotonic() - start >= 0.5
    assert int(alone.as_numpy("BATCH")[0][0]) == 1
    # ...and two requests sent together wait for each other and run as one batch.
    results = gather([client.async_infer("dyn_delay", vec_inputs()) for _ in range(2)])
    assert [int(r.as_numpy("BATCH")[0][0]) for r in results] == [2, 2]


def test_preferred_batch_size_is_sent_at_once(kernel, client):
    # Four requests make the preferred size: no need to wait for the 600 ms delay.
    results = gather([client.async_infer("dyn_delay", vec_inputs()) for _ in range(4)])
    assert sorted(int(r.as_numpy("BATCH")[0][0]) for r in results)[-1] >= 2


def test_full_queue_rejects_with_tritons_message(kernel, client):
    results = gather([client.async_infer("dyn_queue_full", vec_inputs()) for _ in range(6)])
    errors = [r for r in results if isinstance(r, InferenceServerException)]
    ok = [r for r in results if not isinstance(r, InferenceServerException)]
    assert errors, "some requests must find the queue full"
    assert len(ok) >= 3  # one executing + two queued
    for e in errors:
        assert "Exceeds maximum queue size" in e.message()
        assert e.status() == "503"


def test_queue_timeout_rejects(kernel, client):
    before = stats(kernel, "dyn_timeout")["inference_stats"]["fail"]["count"]
    results = gather([client.async_infer("dyn_timeout", vec_inputs()) for _ in range(3)])
    errors = [r for r in results if isinstance(r, InferenceServerException)]
    assert len(errors) >= 1
    for e in errors:
        assert e.message() == "Request timeout expired"
    assert stats(kernel, "dyn_timeout")["inference_stats"]["fail"]["count"] >= before + len(errors)


def test_request_timeout_override_is_shorter_than_default(kernel, client):
    blocker = client.async_infer("dyn_timeout", vec_inputs())
    time.sleep(0.2)
    start = time.monotonic()
    with pytest.raises(InferenceServerException, match="Request timeout expired"):
        client.infer("dyn_timeout", vec_inputs(), timeout=50_000)  # 50 ms, below the 300 ms default
    assert time.monotonic() - start >= 0.04
    blocker.get_result()


def test_delay_action_keeps_timed_out_requests(kernel, client):
    results = gather([client.async_infer("dyn_delay_action", vec_inputs()) for _ in range(3)])
    assert not [r for r in results if isinstance(r, InferenceServerException)]


def test_higher_priority_runs_first(kernel, client):
    blocker = client.async_infer("dyn_priority", vec_inputs())
    time.sleep(0.3)  # the blocker is executing (0.5 s)
    low = [client.async_infer("dyn_priority", vec_inputs(), priority=2) for _ in range(2)]
    time.sleep(0.05)
    high = client.async_infer("dyn_priority", vec_inputs(), priority=1)
    seq_high = int(high.get_result().as_numpy("SEQ")[0][0])
    seq_low = [int(f.get_result().as_numpy("SEQ")[0][0]) for f in low]
    blocker.get_result()
    assert seq_high < min(seq_low), (seq_high, seq_low)


def test_requests_of_different_shapes_are_not_batched_together(kernel, client):
    futures = []
    for i in range(8):
        n = 2 if i < 4 else 3  # a run of one shape, then the other: each run can batch
        t = httpclient.InferInput("INPUT0", [1, n], "FP32")
        t.set_data_from_numpy(np.ones((1, n), np.float32))
        futures.append(client.async_infer("dyn_shapes", [t]))
    results = gather(futures)
    assert all(int(r.as_numpy("SHAPES")[0][0]) == 1 for r in results)
    assert max(int(r.as_numpy("BATCH")[0][0]) for r in results) > 1


def test_two_instances_share_the_load(kernel, client):
    results = gather([client.async_infer("multi_instance", vec_inputs(rows=None)) for _ in range(6)])
    names = {r.as_numpy("INSTANCE")[0] for r in results}
    assert len(names) == 2, names


def test_two_instances_behind_the_batcher_both_work(kernel, client):
    results = gather([client.async_infer("multi_instance_batched", vec_inputs()) for _ in range(8)])
    names = {r.as_numpy("INSTANCE")[0][0] for r in results}
    assert len(names) == 2, names
    assert all(int(r.as_numpy("BATCH")[0][0]) <= 2 for r in results)


def test_preserve_ordering_model_answers(kernel, client):
    results = gather([client.async_infer("dyn_ordered", vec_inputs(float(i))) for i in range(6)])
    for i, r in enumerate(results):
        np.testing.assert_array_equal(r.as_numpy("OUTPUT0"), np.full((1, 4), 2.0 * i, np.float32))


# ---- the batcher's decisions, without processes ------------------------------------------


class _FakeInstance:
    """Records batches; finishes them when told to."""

    def __init__(self, name="fake_0"):
        self.name = name
        self.healthy = True
        self.batches: list[list] = []
        self._executing = 0
        self.on_available = None

    @property
    def executing(self):
        return self._executing

    @property
    def in_flight(self):
        return self._executing

    def submit(self, requests):
        self.batches.append(requests)
        self._executing += 1

    def finish(self):
        self._executing -= 1
        self.on_available(self)


def _model(config_text: str):
    from kernel.config import pbtxt as model_config
    from kernel.core.backend import ModelSource
    from kernel.core.model import Model

    cfg = model_config.parse_config_text(config_text, "config.pbtxt")
    model_config.normalize_config(cfg, cfg.name)
    source = ModelSource(cfg.name, 1, None, None, None, cfg, model_config.config_to_json(cfg))
    return Model(source, model_config.config_to_dict(cfg), "python")


_BATCH_CFG = """
name: "m"
backend: "python"
max_batch_size: 8
input [ { name: "X", data_type: TYPE_FP32, dims: [ 2 ] } ]
output [ { name: "Y", data_type: TYPE_FP32, dims: [ 2 ] } ]
dynamic_batching { %s }
"""


def _request(priority=0, rows=1):
    from kernel.core.request import InferRequest, InferTensor

    r = InferRequest("m", inputs=[InferTensor("X", "FP32", (rows, 2), raw=bytes(8 * rows))], priority=priority)
    r.on_response = lambda response: None
    return r


async def test_batcher_waits_for_a_free_instance_and_takes_everything_queued():
    from kernel.core.scheduling.dynamic import DynamicBatcher

    model = _model(_BATCH_CFG % "")
    inst = _FakeInstance()
    batcher = DynamicBatcher(model, [inst])
    batcher.enqueue(_request())
    await asyncio.sleep(0)
    assert [len(b) for b in inst.batches] == [1]
    for _ in range(5):
        batcher.enqueue(_request())
    await asyncio.sleep(0)
    assert len(inst.batches) == 1  # the instance is busy: nothing else is sent
    assert batcher.pending_count() == 5
    inst.finish()
    assert [len(b) for b in inst.batches] == [1, 5]
    assert batcher.pending_count() == 0


async def test_batcher_respects_max_batch_size_and_preferred_sizes():
    from kernel.core.scheduling.dynamic import DynamicBatcher

    model = _model(_BATCH_CFG % "preferred_batch_size: [ 2, 4 ] max_queue_delay_microseconds: 10000000")
    inst = _FakeInstance()
    batcher = DynamicBatcher(model, [inst])
    for _ in range(7):
        batcher.enqueue(_request())
    await asyncio.sleep(0)
    # The largest preferred size that fits goes at once; the rest waits for the delay.
    assert [len(b) for b in inst.batches] == [4]
    inst.finish()
    assert [len(b) for b in inst.batches] == [4, 2]
    batcher.close()


async def test_a_gathering_instance_gets_what_is_queued_at_once_within_its_room():
    """Another front's batch waits in a shared instance's worker with room for 3: what this front
    queued goes now, the 10 s delay or not, at most 3 rows (kernel.core.backend.BackendInstance.on_gather)."""
    from kernel.core.scheduling.dynamic import DynamicBatcher

    model = _model(_BATCH_CFG % "preferred_batch_size: [ 8 ] max_queue_delay_microseconds: 10000000")
    inst = _FakeInstance()
    batcher = DynamicBatcher(model, [inst])
    for _ in range(5):
        batcher.enqueue(_request())
    await asyncio.sleep(0)
    assert inst.batches == []  # waiting for the delay or a batch of 8
    inst.on_gather(inst, 3)
    assert [len(b) for b in inst.batches] == [3]
    assert batcher.pending_count() == 2
    inst.on_gather(inst, 0)  # no room: nothing
    assert [len(b) for b in inst.batches] == [3] and batcher.pending_count() == 2
    batcher.close()


async def test_batcher_counts_rows_against_max_batch_size():
    from kernel.core.scheduling.dynamic import DynamicBatcher

    model = _model(_BATCH_CFG % "")
    inst = _FakeInstance()
    inst._executing = 1  # busy while we queue
    batcher = DynamicBatcher(model, [inst])
    for rows in (3, 3, 3):
        batcher.enqueue(_request(rows=rows))
    inst.finish()
    assert [sum(r.inputs[0].shape[0] for r in b) for b in inst.batches] == [6]


async def test_batcher_serves_priority_levels_in_order():
    from kernel.core.scheduling.dynamic import DynamicBatcher

    model = _model(_BATCH_CFG.replace("max_batch_size: 8", "max_batch_size: 1")
                   % "priority_levels: 3 default_priority_level: 3")
    inst = _FakeInstance()
    inst._executing = 1
    batcher = DynamicBatcher(model, [inst])
    order = [_request(priority=p) for p in (0, 3, 2, 1, 9)]  # 0 and 9 mean the default level (3)
    for r in order:
        batcher.enqueue(r)
    served = []
    for _ in order:
        inst.finish()
        served.append(inst.batches[-1][0].priority)
    assert served == [1, 2, 0, 3, 9]


async def test_orderer_releases_responses_in_request_order():
    from kernel.core.scheduling.dynamic import _Orderer
    from kernel.core.request import InferResponse

    got = []
    requests = [_request() for _ in range(3)]
    for i, r in enumerate(requests):
        r.on_response = lambda response, i=i: got.append(i)
    orderer = _Orderer()
    orderer.track(requests)
    requests[2].on_response(InferResponse("m", "1"))
    requests[1].on_response(InferResponse("m", "1"))
    assert got == []
    requests[0].on_response(InferResponse("m", "1"))
    assert got == [0, 1, 2]



async def test_direct_scheduler_keeps_every_instance_busy():
    from kernel.core.scheduling.direct import DirectScheduler

    a, b = _FakeInstance("a"), _FakeInstance("b")
    sched = DirectScheduler("m", [a, b])
    requests = [_request() for _ in range(4)]
    for r in requests:
        sched.enqueue(r)
    assert [len(a.batches), len(b.batches)] == [1, 1]
    assert sched.pending_count() == 2  # waiting for whichever instance finishes first
    b.finish()
    assert b.batches[-1] == [requests[2]]
    b.finish()
    assert b.batches[-1] == [requests[3]]
    assert len(a.batches) == 1 and sched.pending_count() == 0
