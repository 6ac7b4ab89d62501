"""The sequence batcher with tritonclient: correlation IDs, control inputs, strategies, idle
sequences, iterative sequences and request rescheduling."""

from __future__ import annotations

import json
import queue
import threading
import time
import urllib.request

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from conftest import TEST_MODELS, serving

REPO = TEST_MODELS / "scheduling" / "sequences"


@pytest.fixture(scope="module")
def kernel():
    yield from serving([REPO])


@pytest.fixture
def client(kernel):
    c = httpclient.InferenceServerClient(kernel.url, concurrency=8, network_timeout=60)
    yield c
    c.close()


def value_input(v: int, batched: bool = True, module=httpclient):
    shape = [1, 1] if batched else [1]
    t = module.InferInput("INPUT", shape, "INT32")
    t.set_data_from_numpy(np.array([v], np.int32).reshape(shape))
    return t


def step(client, model, v, sid, start=False, end=False, batched=True):
    r = client.infer(model, [value_input(v, batched)], sequence_id=sid, sequence_start=start, sequence_end=end)
    return r


def first(r, name):
    return r.as_numpy(name).reshape(-1)[0]


def stats(kernel, model: str) -> dict:
    with urllib.request.urlopen(f"http://{kernel.url}/v2/models/{model}/stats") as r:
        return json.loads(r.read())["model_stats"][0]


def test_uint64_sequence_accumulates_with_controls(client):
    sid = 2**63 + 5  # beyond int64: correlation IDs are uint64
    sums = []
    for i, v in enumerate((1, 2, 3, 4)):
        r = step(client, "seq_direct", v, sid, start=i == 0, end=i == 3)
        sums.append(int(first(r, "OUTPUT")))
        assert int(first(r, "CORRID_OUT")) == sid
        assert int(first(r, "READY_OUT")) == 1
    assert sums == [1, 3, 6, 10]


def test_string_sequence_ids(client):
    for sid in ("alpha", "beta"):
        out = []
        for i, v in enumerate((5, 6, 7)):
            r = step(client, "seq_string", v, sid, start=i == 0, end=i == 2, batched=False)
            out.append(int(first(r, "OUTPUT")))
            assert first(r, "CORRID_OUT") == sid.encode()
        assert out == [5, 11, 18]


def test_request_of_an_unknown_sequence_is_refused(client):
    with pytest.raises(InferenceServerException) as info:
        step(client, "seq_direct", 1, 987654)
    assert info.value.message() == (
        "inference request for sequence 987654 to model 'seq_direct' must specify the START flag on the "
        "first request of the sequence"
    )
    with pytest.raises(InferenceServerException, match="must specify the START flag"):
        step(client, "seq_string", 1, "never-started", batched=False)


def test_request_after_the_end_of_a_sequence_is_refused(client):
    step(client, "seq_direct", 1, 555, start=True)
    step(client, "seq_direct", 1, 555, end=True)
    with pytest.raises(InferenceServerException, match="must specify the START flag"):
        step(client, "seq_direct", 1, 555)


def test_request_without_correlation_id_is_refused(client):
    with pytest.raises(InferenceServerException) as info:
        client.infer("seq_direct", [value_input(1)])
    assert "must specify a non-zero or non-empty correlation ID" in info.value.message()


def test_correlation_id_of_the_wrong_type_is_refused(client):
    with pytest.raises(InferenceServerException) as info:
        step(client, "seq_direct", 1, "text-id", start=True)
    assert info.value.message() == (
        "[request id: <id_unknown>] sequence batching control 'CORRID' data-type is 'BYTES', "
        "but model 'seq_direct' expects 'UINT64'"
    )


def test_batched_request_to_a_sequence_model_is_refused(client):
    t = httpclient.InferInput("INPUT", [2, 1], "INT32")
    t.set_data_from_numpy(np.ones((2, 1), np.int32))
    with pytest.raises(InferenceServerException, match="must specify batch-size 1"):
        client.infer("seq_direct", [t], sequence_id=77, sequence_start=True)


def _run_sequences(url, model, ids, length=5, batched=True):
    results: dict = {}
    errors: list = []

    def run(sid):
        # tritonclient.http clients are gevent-based: one per thread.
        own = httpclient.InferenceServerClient(url, network_timeout=60)
        try:
            out = []
            for i in range(length):
                r = step(own, model, i + 1, sid, start=i == 0, end=i == length - 1, batched=batched)
                out.append((int(first(r, "OUTPUT")), int(first(r, "BATCH"))))
            results[sid] = out
        except Exception as exc:  # noqa: BLE001
            errors.append(exc)
        finally:
            own.close()

    threads = [threading.Thread(target=run, args=(sid,)) for sid in ids]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    return results


def test_more_sequences_than_slots_all_complete_correctly(kernel):
    ids = list(range(1001, 1007))  # 6 sequences, 4 slots: two wait in the backlog
    results = _run_sequences(kernel.url, "seq_direct", ids)
    expected = [1, 3, 6, 10, 15]
    for sid in ids:
        assert [s for s, _ in results[sid]] == expected, (sid, results[sid])
    s = stats(kernel, "seq_direct")
    assert any(b["batch_size"] > 1 for b in s["batch_stats"]), s["batch_stats"]


def test_oldest_strategy_batches_sequences(kernel):
    ids = list(range(2001, 2005))
    results = _run_sequences(kernel.url, "seq_oldest", ids)
    for sid in ids:
        assert [s for s, _ in results[sid]] == [1, 3, 6, 10, 15]
    assert max(b for sid in ids for _, b in results[sid]) > 1


def test_string_sequences_on_two_instances(kernel):
    ids = [f"s{i}" for i in range(4)]
    results = _run_sequences(kernel.url, "seq_string", ids, length=3, batched=False)
    for sid in ids:
        assert [s for s, _ in results[sid]] == [1, 3, 6]


def test_idle_sequence_is_ended_and_a_waiting_sequence_gets_its_slot(client):
    # seq_idle has one slot and a 300 ms idle timeout.
    assert int(first(step(client, "seq_idle", 1, 3001, start=True, batched=False), "OUTPUT")) == 1
    # A second sequence waits in the backlog until the first idles out.
    r = step(client, "seq_idle", 10, 3002, start=True, batched=False)
    assert int(first(r, "OUTPUT")) == 10
    time.sleep(0.5)
    with pytest.raises(InferenceServerException, match="must specify the START flag"):
        step(client, "seq_idle", 1, 3001, batched=False)


def test_sequences_over_grpc(kernel):
    c = grpcclient.InferenceServerClient(kernel.grpc_url)
    try:
        out = []
        for i, v in enumerate((4, 5, 6)):
            r = c.infer("seq_direct", [value_input(v, module=grpcclient)], sequence_id=4242,
                        sequence_start=i == 0, sequence_end=i == 2)
            out.append(int(first(r, "OUTPUT")))
        assert out == [4, 9, 15]
        r = c.infer("seq_string", [value_input(3, False, module=grpcclient)], sequence_id="grpc-seq",
                    sequence_start=True, sequence_end=True)
        assert first(r, "CORRID_OUT") == b"grpc-seq"
    finally:
        c.close()


def test_iterative_sequence_reschedules_until_done(kernel, client):
    before = stats(kernel, "iterative")
    r = client.infer("iterative", [value_input(3)])
    assert int(first(r, "OUTPUT")) == 3  # ran three times
    after = stats(kernel, "iterative")
    assert after["inference_stats"]["success"]["count"] == before["inference_stats"]["success"]["count"] + 1
    assert after["execution_count"] == before["execution_count"] + 3


def test_iterative_sequences_run_concurrently(client):
    futures = [client.async_infer("iterative", [value_input(n)]) for n in (1, 2, 3, 4, 5, 6)]
    assert [int(first(f.get_result(), "OUTPUT")) for f in futures] == [1, 2, 3, 4, 5, 6]


def test_iterative_decoupled_sends_a_response_per_run(kernel):
    c = grpcclient.InferenceServerClient(kernel.grpc_url)
    got: queue.Queue = queue.Queue()
    c.start_stream(callback=lambda result, error: got.put((result, error)))
    try:
        c.async_stream_infer("iterative_decoupled", [value_input(3, False, module=grpcclient)],
                             enable_empty_final_response=True)
        values = []
        while True:
            result, error = got.get(timeout=30)
            assert error is None, error
            response = result.get_response()
            if response.outputs:
                values.append(int(result.as_numpy("OUTPUT")[0]))
            if response.parameters["triton_final_response"].bool_param:
                break
        assert values == [2, 1, 0]
    finally:
        c.stop_stream()
        c.close()


def test_reschedule_without_iterative_sequence_is_an_error(client):
    with pytest.raises(InferenceServerException) as info:
        client.infer("reschedule_unsupported", [value_input(2, False)])
    assert info.value.message() == (
        "Request is released with TRITONSERVER_REQUEST_RELEASE_RESCHEDULE, while the model is not "
        "configured to handle such a flag."
    )
