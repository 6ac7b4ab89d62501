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
