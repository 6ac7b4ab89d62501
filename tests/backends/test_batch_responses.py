"""One execute answering a dynamic batch three ways at once, as tritonserver 2.51 serves it.

batch_mix answers each request by its MODE: in the returned list, through its
response sender before returning (None in the list), or through its sender
from a thread after returning (None in the list). With Triton all three
arrive with their outputs.
"""

from __future__ import annotations

import shutil

import numpy as np
import pytest
import tritonclient.http as httpclient
from conftest import TEST_MODELS, serving


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    repo = tmp_path_factory.mktemp("repo")
    shutil.copytree(TEST_MODELS / "model_process" / "batch_mix", repo / "batch_mix")
    yield from serving([repo])


def test_returned_sent_before_and_sent_after_responses_all_arrive(server):
    client = httpclient.InferenceServerClient(server.url, concurrency=3, network_timeout=30)
    try:
        pending = []
        for value, mode in ((1, "return"), (2, "send_before"), (3, "send_after")):
            x = httpclient.InferInput("IN", [1, 1], "INT32")
            x.set_data_from_numpy(np.array([[value]], np.int32))
            m = httpclient.InferInput("MODE", [1, 1], "BYTES")
            m.set_data_from_numpy(np.array([[mode.encode()]], np.object_))
            pending.append((value, mode, client.async_infer("batch_mix", [x, m])))
        for value, mode, future in pending:
            result = future.get_result()
            assert result.as_numpy("OUT").tolist() == [[10 * value]], mode
            assert result.as_numpy("BATCH").tolist() == [[3]], mode  # all three were one execute
    finally:
        client.close()


def test_one_batch_over_one_grpc_stream_answers_each_request_with_its_output(server):
    """Triton's QA case (response_sender_batching): one stream, three requests batched into one
    execute, one answered in the returned list, one through its sender before returning and one
    after, each sent as a response with flags 0 and then the FINAL flag alone. Every request gets
    one message with its output; the FINAL-only send must not replace the answer that waits in
    the stream behind the first request's (it read as a response without outputs)."""
    import queue

    import tritonclient.grpc as grpcclient

    got: queue.Queue = queue.Queue()
    client = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        client.start_stream(lambda result, error: got.put((result, error)))
        modes = ((1, "return"), (2, "send_then_final"), (3, "send_after_then_final"))
        for value, mode in modes:
            x = grpcclient.InferInput("IN", [1, 1], "INT32")
            x.set_data_from_numpy(np.array([[value]], np.int32))
            m = grpcclient.InferInput("MODE", [1, 1], "BYTES")
            m.set_data_from_numpy(np.array([[mode.encode()]], np.object_))
            client.async_stream_infer("batch_mix", [x, m], request_id=mode)
        answers = [got.get(timeout=30) for _ in modes]
        client.stop_stream()  # waits for the stream to end: nothing more may come
        assert got.empty(), [r.get_response() if r else e for r, e in [got.get() for _ in range(got.qsize())]]
    finally:
        client.close()
    for (value, mode), (result, error) in zip(modes, answers):  # a plain model's answers keep request order
        assert error is None, (mode, error)
        assert result.get_response().id == mode
        out = result.as_numpy("OUT")
        assert out is not None and out.tolist() == [[10 * value]], (mode, result.get_response())
        assert result.as_numpy("BATCH").tolist() == [[3]], mode
