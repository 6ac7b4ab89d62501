"""kernel.client.utils (PyTriton's pytriton.client.utils) with tritonclient's HTTP and gRPC clients
against a real `kernel serve`."""

from __future__ import annotations

import textwrap
import threading
import time
import warnings

import pytest
import tritonclient.grpc
import tritonclient.http

from kernel.client import utils
from kernel.client.exceptions import PyTritonClientInvalidUrlError, PyTritonClientTimeoutError
from kernel.client.utils import (
    ModelState,
    create_client_from_url,
    get_model_config,
    get_model_state,
    wait_for_model_ready,
    wait_for_server_ready,
)
from kernel.model_config.triton_model_config import TritonModelConfig
from conftest import free_port


@pytest.fixture
def client(url):
    """A plain tritonclient client for the session server, made by create_client_from_url."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", utils.NotSupportedTimeoutWarning)
        c = create_client_from_url(url)
    yield c
    c.close()


def test_public_names_of_pytriton_module():
    for name in ["DEFAULT_GRPC_PORT", "DEFAULT_HTTP_PORT", "InferenceServerException", "LATEST_MODEL_VERSION",
                 "ModelConfigParser", "ModelState", "NotSupportedTimeoutWarning", "PyTritonClientInvalidUrlError",
                 "PyTritonClientTimeoutError", "RpcError", "TritonUrl", "create_client_from_url",
                 "get_model_config", "get_model_state", "parse_grpc_response", "parse_http_response",
                 "wait_for_model_ready", "wait_for_server_ready"]:
        assert hasattr(utils, name), name
    assert (utils.DEFAULT_HTTP_PORT, utils.DEFAULT_GRPC_PORT, utils.LATEST_MODEL_VERSION) == (8000, 8001, "<latest>")
    assert [s.value for s in ModelState] == ["LOADING", "UNLOADING", "UNAVAILABLE", "READY"]


def test_create_client_from_url_picks_library_by_scheme(server):
    http = create_client_from_url(server.url, network_timeout_s=5)  # no scheme: HTTP
    assert isinstance(http, tritonclient.http.InferenceServerClient)
    assert http.is_server_ready()
    http.close()
    with pytest.warns(utils.NotSupportedTimeoutWarning, match="Ignoring network_timeout: 60.0"):
        grpc = create_client_from_url(f"grpc://{server.grpc_url}")
    assert isinstance(grpc, tritonclient.grpc.InferenceServerClient)
    assert grpc.is_server_ready()
    grpc.close()


@pytest.mark.parametrize("bad", ["ftp://localhost:8000", "http://localhost:notaport", 8000])
def test_create_client_from_url_rejects_bad_urls(bad):
    with pytest.raises(PyTritonClientInvalidUrlError):
        create_client_from_url(bad)


def test_http_network_timeout_bounds_calls(server):
    """network_timeout_s reaches tritonclient.http: a 2 s model call fails after about 0.5 s."""
    import numpy as np

    client = create_client_from_url(f"http://{server.url}", network_timeout_s=0.5)
    a = tritonclient.http.InferInput("INPUT0", [4], "FP32")
    a.set_data_from_numpy(np.ones(4, np.float32))
    b = tritonclient.http.InferInput("INPUT1", [4], "FP32")
    b.set_data_from_numpy(np.ones(4, np.float32))
    started = time.monotonic()
    with pytest.raises(Exception):
        client.infer("slow_add_sub", [a, b])
    assert time.monotonic() - started < 1.9
    client.close()


def test_wait_for_server_and_model_ready(client):
    wait_for_server_ready(client, timeout_s=5)
    wait_for_model_ready(client, "add_sub", timeout_s=5)
    wait_for_model_ready(client, "add_sub", "1", timeout_s=5)


def test_wait_for_server_ready_times_out_on_closed_port(url):
    scheme = url.split("://")[0]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", utils.NotSupportedTimeoutWarning)
        client = create_client_from_url(f"{scheme}://127.0.0.1:{free_port()}")
    started = time.monotonic()
    with pytest.raises(PyTritonClientTimeoutError, match="Waiting for server to be ready timed out."):
        wait_for_server_ready(client, timeout_s=0.6)
    assert 0.5 < time.monotonic() - started < 5


def test_wait_for_model_ready_times_out_for_missing_version(client):
    with pytest.raises(PyTritonClientTimeoutError, match="Waiting for model add_sub/7 to be ready timed out."):
        wait_for_model_ready(client, "add_sub", "7", timeout_s=0.5)


def test_wait_for_model_ready_names_latest_version(server):
    client = create_client_from_url(f"http://{server.url}")
    with pytest.raises(PyTritonClientTimeoutError, match="Waiting for model no_such_model/<latest> to be ready"):
        wait_for_model_ready(client, "no_such_model", timeout_s=0.5)


def test_get_model_state(client):
    assert get_model_state(client, "add_sub") is ModelState.READY
    assert get_model_state(client, "add_sub", "1") is ModelState.READY
    assert get_model_state(client, "add_sub", "2") is ModelState.UNAVAILABLE
    assert get_model_state(client, "no_such_model") is ModelState.UNAVAILABLE


def test_get_model_config(client):
    config = get_model_config(client, "add_sub", timeout_s=5)
    assert isinstance(config, TritonModelConfig)
    assert config.model_name == "add_sub"
    assert config.max_batch_size == 0
    assert [(t.name, t.shape) for t in config.inputs] == [("INPUT0", (4,)), ("INPUT1", (4,))]
    assert [t.name for t in config.outputs] == ["OUTPUT0", "OUTPUT1"]
    assert get_model_config(client, "add_sub", "1").model_name == "add_sub"


def test_get_model_config_waits_then_times_out(client):
    with pytest.raises(PyTritonClientTimeoutError):
        get_model_config(client, "no_such_model", timeout_s=0.5)


def test_parse_responses_skip_entries_without_version():
    entries = [{"name": "a", "version": "1", "state": "READY"}, {"name": "b", "state": "UNAVAILABLE"},
               {"name": "c", "version": "2", "state": ""}]
    assert utils.parse_http_response(entries) == {("a", "1"): ModelState.READY, ("c", "2"): ModelState.LOADING}


SLOW_MODEL = textwrap.dedent('''
    import time
    import triton_python_backend_utils as pb_utils

    class TritonPythonModel:
        def initialize(self, args):
            time.sleep(3)

        def execute(self, requests):
            return [pb_utils.InferenceResponse([pb_utils.get_input_tensor_by_name(r, "X")]) for r in requests]
''')
SLOW_CONFIG = textwrap.dedent('''
    backend: "python"
    input [ { name: "X" data_type: TYPE_FP32 dims: [ 1 ] } ]
    output [ { name: "X" data_type: TYPE_FP32 dims: [ 1 ] } ]
''')


def test_state_while_loading_and_wait_for_model(tmp_path, start_kernel):
    """A model being loaded reads LOADING; wait_for_model_ready returns once it is READY."""
    (tmp_path / "slow" / "1").mkdir(parents=True)
    (tmp_path / "slow" / "1" / "model.py").write_text(SLOW_MODEL)
    (tmp_path / "slow" / "config.pbtxt").write_text(SLOW_CONFIG)
    k = start_kernel([tmp_path], "--model-control-mode=explicit").wait_ready()
    client = create_client_from_url(f"http://{k.url}")
    loader = threading.Thread(target=lambda: create_client_from_url(f"http://{k.url}").load_model("slow"))
    loader.start()
    try:
        deadline = time.monotonic() + 2.5
        seen = set()
        while time.monotonic() < deadline and ModelState.LOADING not in seen:
            seen.add(get_model_state(client, "slow"))
            time.sleep(0.05)
        assert ModelState.LOADING in seen
        wait_for_model_ready(client, "slow", timeout_s=30)
        assert get_model_state(client, "slow") is ModelState.READY
    finally:
        loader.join()
