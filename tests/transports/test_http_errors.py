"""Bad input gets a clear error with Triton's status code, and nothing else breaks."""

from __future__ import annotations

import http.client
import json

import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException


def post(server, path: str, body: bytes, headers=None):
    conn = http.client.HTTPConnection("localhost", server.http_port, timeout=30)
    try:
        conn.request("POST", path, body=body, headers=headers or {})
        resp = conn.getresponse()
        data = resp.read()
        return resp.status, (json.loads(data) if data else None)
    finally:
        conn.close()


def fp32_inputs(**arrays):
    out = []
    for name, arr in arrays.items():
        t = httpclient.InferInput(name, list(arr.shape), "FP32")
        t.set_data_from_numpy(arr.astype(np.float32))
        out.append(t)
    return out


def assert_still_serving(client):
    a = np.ones(4, np.float32)
    result = client.infer("add_sub", fp32_inputs(INPUT0=a, INPUT1=a))
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), 2 * a)


def test_malformed_json(server, http_client):
    status, doc = post(server, "/v2/models/add_sub/infer", b'{"inputs": [ {"name": ')
    # tritonserver 2.51's words and RapidJSON's offset (issue 13), with 400 where it answers 500 (issue 14)
    assert (status, doc) == (400, {"error": "failed to parse the request JSON buffer: Invalid value. at 22"})
    assert_still_serving(http_client)


def test_json_with_wrong_structure(server):
    status, doc = post(server, "/v2/models/add_sub/infer", b'{"inputs": "nope"}')
    assert status == 400
    assert "inputs" in doc["error"]


def test_invalid_utf8_in_json(server):
    status, doc = post(server, "/v2/models/string_identity/infer", b'{"inputs": [{"name": "\xff\xfe", "shape": [1], "datatype": "BYTES", "data": ["x"]}]}')
    assert status == 400
    assert doc["error"]


def test_unknown_model(http_client):
    with pytest.raises(InferenceServerException) as info:
        http_client.infer("no_such_model", fp32_inputs(INPUT0=np.ones(4)))
    assert info.value.status() == "404"
    assert "Request for unknown model: 'no_such_model' is not found" in info.value.message()


def test_unknown_version(http_client):
    with pytest.raises(InferenceServerException) as info:
        http_client.infer("add_sub", fp32_inputs(INPUT0=np.ones(4), INPUT1=np.ones(4)), model_version="9")
    assert info.value.status() == "404"
    assert "version 9 is not found" in info.value.message()


def test_metadata_of_unknown_model(http_client):
    with pytest.raises(InferenceServerException) as info:
        http_client.get_model_metadata("no_such_model")
    assert "no_such_model" in info.value.message()


def test_missing_input(http_client):
    with pytest.raises(InferenceServerException) as info:
        http_client.infer("add_sub", fp32_inputs(INPUT0=np.ones(4)))
    assert info.value.status() == "400"
    assert "missing required input(s) ['INPUT1']" in info.value.message()


def test_extra_input(http_client):
    with pytest.raises(InferenceServerException) as info:
        http_client.infer("add_sub", fp32_inputs(INPUT0=np.ones(4), INPUT1=np.ones(4), INPUT9=np.ones(4)))
    assert info.value.status() == "400"
    # tritonserver counts inputs before it reads their names; its list is its hash map's order
    # (here the reverse of the order sent) and its list of missing inputs reads "]" when none is
    assert info.value.message() == (
        "[request id: <id_unknown>] expected 2 inputs but got 3 inputs for model 'add_sub'. Got input(s) "
        "['INPUT9','INPUT1','INPUT0'], but missing required input(s) ]. Please provide all required input(s).")


def test_unknown_input_with_the_right_count(http_client):
    with pytest.raises(InferenceServerException) as info:
        http_client.infer("add_sub", fp32_inputs(INPUT0=np.ones(4), INPUT9=np.ones(4)))
    assert info.value.message() == "[request id: <id_unknown>] unexpected inference input 'INPUT9' for model 'add_sub'"


def test_unknown_output_has_no_request_id_prefix(http_client):
    a = np.ones(4)
    with pytest.raises(InferenceServerException) as info:
        http_client.infer("add_sub", fp32_inputs(INPUT0=a, INPUT1=a), outputs=[httpclient.InferRequestedOutput("NOPE")])
    assert info.value.status() == "400"
    assert info.value.message() == "unexpected inference output 'NOPE' for model 'add_sub'"


def test_shape_error_of_a_batching_model_has_tritons_note(server):
    body = json.dumps({"inputs": [{"name": "INPUT0", "datatype": "BYTES", "shape": [2], "data": ["a", "bc"]}]}).encode()
    status, doc = post(server, "/v2/models/string_identity/infer", body)
    assert status == 400
    assert doc["error"].endswith(
        "Expected [-1,-1], got [2]. NOTE: Setting a non-zero max_batch_size in the model config requires a batch "
        "dimension to be prepended to each input shape. If you want to specify the full shape including the batch "
        "dim in your input dims config, try setting max_batch_size to zero. See the model configuration docs for "
        "more info on max_batch_size.")


def test_wrong_datatype(http_client):
    t0 = httpclient.InferInput("INPUT0", [4], "INT32")
    t0.set_data_from_numpy(np.ones(4, np.int32))
    t1 = fp32_inputs(INPUT1=np.ones(4))[0]
    with pytest.raises(InferenceServerException) as info:
        http_client.infer("add_sub", [t0, t1])
    assert info.value.status() == "400"
    assert "inference input 'INPUT0' data-type is 'INT32', but model 'add_sub' expects 'FP32'" in info.value.message()


def test_unknown_datatype_name(server):
    body = json.dumps({"inputs": [{"name": "INPUT0", "shape": [4], "datatype": "FLOAT", "data": [1, 2, 3, 4]},
                                  {"name": "INPUT1", "shape": [4], "datatype": "FP32", "data": [1, 2, 3, 4]}]}).encode()
    assert post(server, "/v2/models/add_sub/infer", body) == (400, {"error": "invalid datatype for input INPUT0"})


def test_wrong_shape(http_client):
    with pytest.raises(InferenceServerException) as info:
        http_client.infer("add_sub", fp32_inputs(INPUT0=np.ones(5), INPUT1=np.ones(5)))
    assert info.value.status() == "400"
    assert "unexpected shape for input 'INPUT0' for model 'add_sub'. Expected [4], got [5]" in info.value.message()


def test_json_data_count_does_not_match_shape(server):
    body = json.dumps({"inputs": [
        {"name": "INPUT0", "shape": [4], "datatype": "FP32", "data": [1, 2, 3]},
        {"name": "INPUT1", "shape": [4], "datatype": "FP32", "data": [1, 2, 3, 4]},
    ]}).encode()
    status, doc = post(server, "/v2/models/add_sub/infer", body)
    assert status == 400
    assert "INPUT0" in doc["error"] and "expecting 4" in doc["error"]


def _binary_request(declared: int, actual: bytes):
    header = json.dumps({"inputs": [
        {"name": "IN_FP32", "shape": [4], "datatype": "FP32", "parameters": {"binary_data_size": declared}},
    ]}).encode()
    return header + actual, {"Inference-Header-Content-Length": str(len(header))}


def test_binary_section_shorter_than_declared(server, http_client):
    body, headers = _binary_request(16, b"\0" * 12)
    status, doc = post(server, "/v2/models/dtype_echo/infer", body, headers)
    assert status == 400
    assert "IN_FP32" in doc["error"]
    assert_still_serving(http_client)


def test_binary_section_longer_than_declared(server):
    body, headers = _binary_request(16, b"\0" * 20)
    status, doc = post(server, "/v2/models/dtype_echo/infer", body, headers)
    assert status == 400
    assert doc["error"] == "unexpected additional input data for model 'dtype_echo'"  # tritonserver's words


def test_binary_size_not_matching_shape(server):
    body, headers = _binary_request(12, b"\0" * 12)
    status, doc = post(server, "/v2/models/dtype_echo/infer", body, headers)
    assert status == 400
    assert "input byte size mismatch for input 'IN_FP32' for model 'dtype_echo'. Expected 16, got 12" in doc["error"]


def test_header_length_past_the_body(server):
    status, doc = post(server, "/v2/models/dtype_echo/infer", b"{}", {"Inference-Header-Content-Length": "99"})
    assert status == 400
    assert doc["error"] == "inference header size should be in range (0, 2), got: 99"  # tritonserver's words


def test_truncated_bytes_element(server):
    header = json.dumps({"inputs": [
        {"name": "IN_STRING", "shape": [1], "datatype": "BYTES", "parameters": {"binary_data_size": 6}},
    ]}).encode()
    body = header + (10).to_bytes(4, "little") + b"ab"  # claims 10 bytes, has 2
    status, doc = post(server, "/v2/models/dtype_echo/infer", body, {"Inference-Header-Content-Length": str(len(header))})
    assert status == 400
    assert "IN_STRING" in doc["error"]


def test_body_over_the_size_limit(start_kernel, tmp_path):
    from conftest import EXAMPLES

    k = start_kernel([EXAMPLES], "--http-max-input-size", "1000").wait_ready()
    body = json.dumps({"inputs": [{"name": "INPUT0", "shape": [4], "datatype": "FP32", "data": [0.0] * 400}]}).encode()
    status, doc = post(k, "/v2/models/add_sub/infer", body)
    assert status == 400
    assert "exceeds the maximum allowed input size of 1000 bytes" in doc["error"]
    client = httpclient.InferenceServerClient(k.url)
    assert_still_serving(client)


def test_model_that_raises(http_client):
    with pytest.raises(InferenceServerException) as info:
        http_client.infer("raises", fp32_inputs(INPUT0=np.ones(3)))
    assert info.value.status() == "500"
    message = info.value.message()
    assert "Failed to process the request(s) for model 'raises_0'" in message  # Triton's words
    assert "ValueError: this model always fails" in message
    assert_still_serving(http_client)


def test_model_returning_wrong_number_of_responses(http_client):
    with pytest.raises(InferenceServerException) as info:
        http_client.infer("wrong_count", fp32_inputs(INPUT0=np.ones(3)))
    assert info.value.status() == "500"
    assert info.value.message() == (  # Triton's words and framing
        "Failed to process the request(s) for model 'wrong_count_0', message: Number of InferenceResponse objects "
        "do not match the number of InferenceRequest objects. InferenceRequest(s) size is:1, and InferenceResponse(s) "
        "size is:0\n")


def test_model_returning_wrong_type(http_client):
    with pytest.raises(InferenceServerException) as info:
        http_client.infer("wrong_type", fp32_inputs(INPUT0=np.ones(3)))
    assert info.value.status() == "500"
    assert info.value.message() == ("Failed to process the request(s) for model 'wrong_type_0', message: "
                                    "Expected a list in the execute return, found type '<class 'dict'>'.")


def test_model_error_response(http_client):
    with pytest.raises(InferenceServerException) as info:
        http_client.infer("error_response", fp32_inputs(INPUT0=np.ones(3)))
    assert info.value.status() == "500"
    assert "the model refused this request" in info.value.message()


def test_unknown_path_and_wrong_method(server):
    status, doc = post(server, "/v2/nothing/here", b"")
    assert status == 404
    status, doc = post(server, "/v2/models/add_sub/config", b"")
    assert status == 405


def test_crashing_worker_fails_only_its_requests_and_restarts(server, http_client):
    import time

    with pytest.raises(InferenceServerException) as info:
        http_client.infer("crasher", fp32_inputs(INPUT0=-np.ones(2)))
    assert info.value.status() == "500"
    assert info.value.message() == "Stub process 'crasher_0' is not healthy."  # tritonserver 2.51's whole answer
    assert_still_serving(http_client)
    deadline = time.time() + 30
    while time.time() < deadline and not http_client.is_model_ready("crasher"):
        time.sleep(0.1)
    assert http_client.is_model_ready("crasher")
    result = http_client.infer("crasher", fp32_inputs(INPUT0=np.ones(2)))
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), np.ones(2, np.float32))


def _request(server, method: str, path: str, body: bytes = b""):
    conn = http.client.HTTPConnection("localhost", server.http_port, timeout=30)
    try:
        conn.request(method, path, body=body)
        resp = conn.getresponse()
        data = resp.read()
        return resp.status, (json.loads(data) if data else None)
    finally:
        conn.close()


def test_health_routes_take_only_get(server):
    """tritonserver 2.51: POST on /v2/health/live or /ready is 405 Method Not Allowed."""
    for route, body in (("/v2/health/live", {"live": True}), ("/v2/health/ready", {"ready": True})):
        assert _request(server, "POST", route) == (405, {"error": "Method Not Allowed"})
        assert _request(server, "GET", route) == (200, body)  # KServe v2's body (Triton: none)


def test_version_that_is_not_a_number_matches_no_route(server):
    """tritonserver's model routes want versions/[0-9]+; anything else is its plain 404."""
    for path in ("/v2/models/add_sub/versions/abc", "/v2/models/add_sub/versions/1x/ready",
                 "/v2/models/add_sub/versions/-1/config"):
        assert _request(server, "GET", path) == (404, {"error": "Not Found"}), path
    assert _request(server, "POST", "/v2/models/add_sub/versions/abc/infer", b"{}") == (404, {"error": "Not Found"})
    assert _request(server, "GET", "/v2/models/add_sub/versions/1/ready") == (200, {"name": "add_sub", "ready": True})


def test_model_not_ready_has_tritons_body(server):
    for path in ("/v2/models/no_such_model/ready", "/v2/models/add_sub/versions/7/ready"):
        assert _request(server, "GET", path) == (400, {"error": "Model version not ready"}), path


def test_decoupled_model_over_http_infer_is_501(server, http_client):
    body = json.dumps({"inputs": [{"name": "IN", "datatype": "INT32", "shape": [2], "data": [1, 2]}]}).encode()
    status, doc = post(server, "/v2/models/repeat_int32/infer", body)
    assert (status, doc) == (501, {"error": "HTTP end point doesn't support models with decoupled transaction policy"})
    assert_still_serving(http_client)


def test_raw_binary_body_is_the_only_inputs_data(server, http_client):
    """Inference-Header-Content-Length: 0: no JSON, the body is the data of the model's one input
    (tritonserver's raw request; shape from the config, the -1 dimension from the body's size)."""
    raw = np.array([1.5, 2.5, 3.5], np.float32).tobytes()
    conn = http.client.HTTPConnection("localhost", server.http_port, timeout=30)
    try:
        conn.request("POST", "/v2/models/crasher/infer", body=raw,
                     headers={"Inference-Header-Content-Length": "0", "Content-Type": "application/octet-stream"})
        resp = conn.getresponse()
        doc = json.loads(resp.read())
    finally:
        conn.close()
    assert resp.status == 200, doc
    assert doc["outputs"][0]["shape"] == [3] and doc["outputs"][0]["data"] == [1.5, 2.5, 3.5]
    # a model with two inputs cannot take it (Triton's words)
    status, doc = post(server, "/v2/models/add_sub/infer", raw, {"Inference-Header-Content-Length": "0"})
    assert (status, doc) == (400, {"error": "[request id: <id_unknown>] Raw request must only have 1 input (found 1) "
                                            "to be deduced but got 2 inputs in 'add_sub' model configuration"})
    status, doc = post(server, "/v2/models/string_identity/infer", b"text", {"Inference-Header-Content-Length": "0"})
    assert (status, doc) == (400, {"error": "[request id: <id_unknown>] For BYTE datatype raw input 'INPUT0', the "
                                            "model must have input shape [1]"})
    assert_still_serving(http_client)
