"""Decoupled BLS streams: `await async_exec(decoupled=True)` and `exec(decoupled=True)` with cancel().

stream_callee sends COUNT responses 150 ms apart, then its final flag (which the
caller sees as an empty final response, as with tritonserver 2.51); it stops early
once its request reads cancelled, unless told to ignore that. stream_caller
(async execute) and stream_caller_sync (sync execute) report what they saw.
Triton 2.51's ResponseIterator has neither cancel() nor __aiter__ (both came in
later Python backends): those parts follow the later documentation.
"""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import tritonclient.http as httpclient
from conftest import TEST_MODELS, serving

ALL = [0, 1, 2, 3, None]  # four responses, then the empty final one


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    repo = tmp_path_factory.mktemp("repo")
    for name in ("stream_callee", "stream_caller", "stream_caller_sync"):
        shutil.copytree(TEST_MODELS / "model_process" / name, repo / name)
    yield from serving([repo])


def call(server, model, mode, ignore_cancel=0):
    client = httpclient.InferenceServerClient(server.url, network_timeout=60)
    inputs = []
    for name, array, datatype in (
        ("MODE", np.array([mode.encode()], np.object_), "BYTES"),
        ("COUNT", np.array([4], np.int32), "INT32"),
        ("IGNORE_CANCEL", np.array([ignore_cancel], np.int32), "INT32"),
    ):
        tensor = httpclient.InferInput(name, [1], datatype)
        tensor.set_data_from_numpy(array)
        inputs.append(tensor)
    return json.loads(client.infer(model, inputs).as_numpy("REPORT")[0])


def test_async_for_yields_responses_as_they_arrive(server):
    report = call(server, "stream_caller", "arrival")
    assert report["values"] == ALL
    times = report["times"]
    assert times == sorted(times)
    # The first response is in hand while the callee is still sending (4 x 150 ms).
    assert times[-1] - times[0] >= 0.4


def test_plain_for_over_the_awaited_stream_as_in_tritons_example(server):
    assert call(server, "stream_caller", "sync_for")["values"] == ALL


@pytest.mark.parametrize("model", ["stream_caller", "stream_caller_sync"])
def test_cancel_ends_the_callees_stream(server, model):
    before = server.log().count("stream_callee saw the cancellation after 1 responses")
    report = call(server, model, "cancel")
    assert report["values"] == [0, None]  # the callee stopped, and its final response ended the iteration
    assert server.wait_for_log("stream_callee saw the cancellation after 1 responses", times=before + 1)


@pytest.mark.parametrize("model", ["stream_caller", "stream_caller_sync"])
def test_a_callee_that_ignores_cancellation_streams_to_the_end(server, model):
    assert call(server, model, "cancel", ignore_cancel=1)["values"] == ALL


@pytest.mark.parametrize("model", ["stream_caller", "stream_caller_sync"])
def test_cancel_after_the_stream_ended_is_harmless(server, model):
    assert call(server, model, "cancel_after_end")["values"] == ALL
