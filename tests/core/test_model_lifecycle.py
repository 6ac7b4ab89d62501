"""Loading, failing to load, and shutting down, as a tritonserver user sees them."""

from __future__ import annotations

import socket
import threading
import time
import urllib.request

import numpy as np
import pytest
import tritonclient.http as httpclient

from conftest import EXAMPLES, TEST_MODELS, copy_model

BAD = TEST_MODELS / "bad"


def _ready(k) -> int:
    try:
        with urllib.request.urlopen(f"http://{k.url}/v2/health/ready", timeout=2) as r:
            return r.status
    except urllib.error.HTTPError as e:
        return e.code


@pytest.mark.parametrize(
    "model, reason",
    [
        ("init_fails", "initialize refused to start"),
        ("syntax_error", "SyntaxError"),
        # the Python backend stub's words, which tritonserver users find in its log
        ("missing_model_py", "Failed to preinitialize Python stub: Python model file not found in '"),
        ("broken_config", "config.pbtxt"),
    ],
)
def test_failed_model_stops_the_server_by_default(start_kernel, tmp_path, model, reason):
    copy_model(BAD / model, tmp_path)
    copy_model(EXAMPLES / "add_sub", tmp_path)
    k = start_kernel([tmp_path])
    assert k.wait_exit(60) != 0
    log = k.log()
    assert f"failed to load '{model}'" in log
    assert reason in log
    assert "| add_sub" in log  # the model table is printed before exiting


def test_exit_on_error_false_serves_the_other_models(start_kernel, tmp_path):
    for m in ("init_fails", "syntax_error", "broken_config"):
        copy_model(BAD / m, tmp_path)
    copy_model(EXAMPLES / "add_sub", tmp_path)
    k = start_kernel([tmp_path], "--exit-on-error=false", "--strict-readiness=false")
    k.wait_ready()
    client = httpclient.InferenceServerClient(k.url)
    assert client.is_model_ready("add_sub")
    assert not client.is_model_ready("init_fails")
    a = np.ones(4, np.float32)
    inputs = [httpclient.InferInput(n, [4], "FP32") for n in ("INPUT0", "INPUT1")]
    for t in inputs:
        t.set_data_from_numpy(a)
    np.testing.assert_array_equal(client.infer("add_sub", inputs).as_numpy("OUTPUT0"), 2 * a)
    log = k.log()
    assert "UNAVAILABLE" in log and "initialize refused to start" in log


def test_strict_readiness_reports_not_ready_with_a_failed_model(start_kernel, tmp_path):
    copy_model(BAD / "init_fails", tmp_path)
    copy_model(EXAMPLES / "add_sub", tmp_path)
    k = start_kernel([tmp_path], "--exit-on-error", "false")
    # Metrics start last: from then on only the failed model can make the server not ready.
    assert k.wait_for_log("Started Metrics Service", timeout=60)
    assert _ready(k) == 400
    client = httpclient.InferenceServerClient(k.url)
    assert client.is_server_live()
    assert client.is_model_ready("add_sub")


def test_lifecycle_logs_initialize_args_and_finalize(start_kernel):
    k = start_kernel([TEST_MODELS / "lifecycle"]).wait_ready()
    k.stop()
    log = k.log()
    expected_keys = "model_config,model_instance_device_id,model_instance_kind,model_instance_name,model_name,model_repository,model_version"
    assert f"greeter initialize keys={expected_keys} instance=greeter_0" in log
    assert "loading: greeter:1" in log
    assert "successfully loaded 'greeter'" in log
    assert "greeter finalize called" in log
    assert "| greeter | 1       | READY  |" in log


def test_graceful_shutdown_finishes_in_flight_requests(start_kernel):
    k = start_kernel([TEST_MODELS / "lifecycle"]).wait_ready()
    client = httpclient.InferenceServerClient(k.url)
    t = httpclient.InferInput("DELAY_MS", [1], "INT32")
    t.set_data_from_numpy(np.array([1500], np.int32))
    result = {}

    def call():
        result["out"] = client.infer("greeter", [t]).as_numpy("DONE")

    th = threading.Thread(target=call)
    th.start()
    assert k.wait_for_log("greeter executing delay=1500", timeout=30)
    assert k.stop() == 0
    th.join(10)
    np.testing.assert_array_equal(result["out"], np.array([1500], np.int32))
    assert "greeter finalize called" in k.log()


def test_busy_grpc_port_fails_start_up_and_is_never_ready(start_kernel):
    # HTTP starts before gRPC: readiness must wait for every transport, or a client could see
    # "ready" on HTTP and find nothing listening on the gRPC port.
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        k = start_kernel([EXAMPLES], "--grpc-address", "127.0.0.1", "--grpc-port", str(port))
        seen = set()
        while k.proc.poll() is None:
            try:
                seen.add(_ready(k))
            except OSError:
                pass
            time.sleep(0.01)
    assert k.wait_exit(30) != 0
    assert 200 not in seen
    log = k.log()
    assert f"failed to start GRPC service: Unavailable - Socket '127.0.0.1:{port}' already in use" in log


def test_unknown_flag_is_an_error(start_kernel):
    k = start_kernel([EXAMPLES], "--no-such-flag", "1")
    assert k.wait_exit(30) != 0
    assert "--no-such-flag" in k.log()


def test_unsupported_tritonserver_flag_says_so(start_kernel):
    k = start_kernel([EXAMPLES], "--rate-limit", "execution_count")
    assert k.wait_exit(30) != 0
    assert "--rate-limit: this tritonserver flag is not supported by Kernel yet" in k.log()
