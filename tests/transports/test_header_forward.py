"""--grpc-header-forward-pattern (and --http-header-forward-pattern): gRPC metadata / HTTP headers
whose names match the regular expression reach the model as string request parameters, as in
tritonserver: matched ignoring case unless the pattern starts with `(?-i)`, on ModelInfer and on
every request of a ModelStreamInfer call, over an explicit parameter of the same name; reserved
names are refused with INVALID_ARG. Checked on all three gRPC server implementations, calling the
params_echo test model (it returns its request's parameters() JSON) with tritonclient."""

from __future__ import annotations

import json
import queue

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from conftest import TEST_MODELS, KernelProcess, copy_model, running

LIBRARIES = ["native", "grpclib", "grpcio"]
# Upper case on purpose: gRPC metadata keys are lower case, and the match ignores case as in tritonserver.
# It also matches names Triton reserves (triton_*, priority), which must be refused rather than forwarded.
PATTERN = "^(X-FWD-|TRITON_|PRIORITY$)"


@pytest.fixture(scope="module")
def repo(tmp_path_factory):
    path = tmp_path_factory.mktemp("header-forward-repo")
    copy_model(TEST_MODELS / "good" / "params_echo", path)
    return path


@pytest.fixture(scope="module", params=LIBRARIES)
def forwarding(request, repo):
    yield from running(KernelProcess(
        [repo], f"--grpc-server={request.param}", f"--grpc-header-forward-pattern={PATTERN}",
        f"--http-header-forward-pattern={PATTERN}", "--allow-metrics=false",
    ))


@pytest.fixture
def client(forwarding):
    c = grpcclient.InferenceServerClient(forwarding.grpc_url)
    yield c
    c.close()


def _input(module):
    t = module.InferInput("INPUT", [1], "INT32")
    t.set_data_from_numpy(np.array([1], np.int32))
    return t


def _params(result) -> dict:
    return json.loads(result.as_numpy("PARAMS_JSON")[0])


def _stream(client, headers, n, parameters=None) -> list:
    """Send n requests on one ModelStreamInfer call opened with `headers`; (result, error) per request."""
    answers = queue.Queue()
    client.start_stream(lambda result, error: answers.put((result, error)), headers=headers)
    try:
        for i in range(n):
            client.async_stream_infer("params_echo", [_input(grpcclient)], request_id=str(i), parameters=parameters)
        return [answers.get(timeout=30) for _ in range(n)]
    finally:
        client.stop_stream()


# ---- ModelInfer ----------------------------------------------------------------------------------


def test_matching_metadata_become_parameters(client):
    result = client.infer(
        "params_echo", [_input(grpcclient)], headers={"x-fwd-user": "alice", "x-fwd-tenant": "t1", "other": "no"},
        parameters={"explicit": 5},
    )
    assert _params(result) == {"explicit": 5, "x-fwd-user": "alice", "x-fwd-tenant": "t1"}


def test_forwarded_metadata_win_over_an_explicit_parameter(client):
    result = client.infer("params_echo", [_input(grpcclient)], headers={"x-fwd-user": "header"},
                          parameters={"x-fwd-user": "explicit"})
    assert _params(result) == {"x-fwd-user": "header"}


def test_binary_metadata_are_forwarded_decoded(client):
    result = client.infer("params_echo", [_input(grpcclient)], headers={"x-fwd-blob-bin": b"\x01ab"})
    assert _params(result) == {"x-fwd-blob-bin": "\x01ab"}


def test_a_call_without_matching_metadata_gets_no_parameters(client):
    result = client.infer("params_echo", [_input(grpcclient)], headers={"fwd-x-not-at-start": "1"})
    assert _params(result) == {}


def test_a_reserved_name_is_refused_and_the_server_keeps_serving(client):
    for name in ("triton_x", "priority"):
        with pytest.raises(InferenceServerException) as err:
            client.infer("params_echo", [_input(grpcclient)], headers={"x-fwd-ok": "1", name: "1"})
        assert err.value.status() == "StatusCode.INVALID_ARGUMENT"
        assert err.value.message() == f"Header '{name}' is reserved for Triton usage and cannot be forwarded."
    assert _params(client.infer("params_echo", [_input(grpcclient)], headers={"x-fwd-ok": "1"})) == {"x-fwd-ok": "1"}


# ---- ModelStreamInfer ----------------------------------------------------------------------------


def test_every_stream_request_gets_the_calls_metadata(client):
    answers = _stream(client, {"x-fwd-session": "s1", "other": "no"}, 3, parameters={"x-fwd-session": "explicit"})
    for result, error in answers:
        assert error is None
        assert _params(result) == {"x-fwd-session": "s1"}


def test_a_reserved_name_fails_each_stream_request_and_the_stream_goes_on(client):
    answers = _stream(client, {"triton_bad": "1"}, 2)
    for result, error in answers:
        assert result is None
        assert "Header 'triton_bad' is reserved for Triton usage and cannot be forwarded." in str(error)
    assert all(error is None for _, error in _stream(client, {"x-fwd-ok": "1"}, 2))


# ---- HTTP follows the same matching ---------------------------------------------------------------


def test_http_headers_match_ignoring_case(forwarding):
    with httpclient.InferenceServerClient(forwarding.url) as c:
        result = c.infer("params_echo", [_input(httpclient)], headers={"X-Fwd-User": "bob", "other": "no"})
    assert _params(result) == {"x-fwd-user": "bob"}


# ---- without the flag, and other patterns ---------------------------------------------------------------


@pytest.mark.parametrize("library", LIBRARIES)
def test_nothing_is_forwarded_without_the_flag(start_kernel, repo, library):
    k = start_kernel([repo], f"--grpc-server={library}", "--allow-metrics=false").wait_ready()
    with grpcclient.InferenceServerClient(k.grpc_url) as c:
        assert _params(c.infer("params_echo", [_input(grpcclient)], headers={"x-fwd-user": "alice"})) == {}
        answers = _stream(c, {"x-fwd-user": "alice"}, 1)
    assert answers[0][1] is None and _params(answers[0][0]) == {}


def test_a_leading_case_sensitive_flag_turns_case_matching_on(start_kernel, repo):
    k = start_kernel([repo], "--grpc-header-forward-pattern=(?-i)^(x-fwd-|Y-)", "--allow-metrics=false").wait_ready()
    with grpcclient.InferenceServerClient(k.grpc_url) as c:
        result = c.infer("params_echo", [_input(grpcclient)], headers={"x-fwd-a": "1", "y-b": "2"})
    assert _params(result) == {"x-fwd-a": "1"}
    assert "has no effect" not in k.log()


def test_an_invalid_pattern_stops_the_server(start_kernel, repo):
    k = start_kernel([repo], "--grpc-header-forward-pattern=x-(", "--allow-metrics=false")
    assert k.wait_exit(60) != 0
    assert "invalid header forward pattern 'x-('" in k.log()
