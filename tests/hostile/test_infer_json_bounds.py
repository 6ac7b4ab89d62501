"""A KServe infer request's JSON is bounded and read in pieces, beside the event loop (issue 31,
the general rule).

A large JSON header is decoded on a thread beside the loop (issue 23), but each msgspec call holds
the interpreter lock to its end, so one call over millions of values still froze the front: with a
24 MiB request, `parameters: {"a": [[],...]}` froze /v2/health/live 1.9 s, 600 000 inputs 1.0 s
(+800 MB), 2 million outputs 1.4 s, a 12-million-entry shape 143 ms. Now the objects outside the
data are counted first (at most 65536), the arrays are cut out and read on their own (a shape
counted, data in pieces), a request names at most 4096 inputs and 4096 outputs and a shape at most
64 dimensions, and a parameter that is an array or an object is refused (on the request) or
ignored (on a tensor) as tritonserver 2.51 does. Each body here is ~24 MiB, sent again and again
for a few seconds against a real `kernel serve` while the liveness probe measures the freeze.
"""

from __future__ import annotations

import json

import httpx
import numpy as np
import pytest

from conftest import EXAMPLES, KernelProcess, running
from liveness import LivenessProbe
from test_decompression_work import assert_stays_live, attack_rounds
from test_http2_limits import rss_mb

MIB = 1 << 20
N = 8 * MIB  # values of three bytes each: 24 MiB
DATA = b"[1.0,2.0,3.0,4.0]"
ROUTES = {"fast": {}, "asgi": {"Content-Encoding": "identity"}}


def tensor(name: bytes, shape: bytes = b"[4]", data: bytes = DATA, datatype: bytes = b"FP32", extra: bytes = b"") -> bytes:
    return (b'{"name":"' + name + b'","shape":' + shape + b',"datatype":"' + datatype + b'"' + extra
            + b',"data":' + data + b"}")


def request(inputs: bytes = None, extra: bytes = b"") -> bytes:
    return b'{"inputs":[' + (inputs or tensor(b"INPUT0") + b"," + tensor(b"INPUT1")) + b"]" + extra + b"}"


EMPTY_ARRAYS = b"[" + b"[]," * N + b"[]]"
HOSTILE = {  # name: (body, status, what the answer says)
    "request parameter of empty arrays": (
        request(extra=b',"parameters":{"a":' + EMPTY_ARRAYS + b"}"), 400,
        "parameter 'a' has invalid type. It should be either 'int', 'bool', or 'string'."),
    "input parameter of empty arrays (ignored, as by tritonserver)": (
        request(tensor(b"INPUT0", extra=b',"parameters":{"a":' + EMPTY_ARRAYS + b"}") + b"," + tensor(b"INPUT1")),
        200, '"OUTPUT0"'),
    "an unknown member of empty arrays (ignored, as by tritonserver)": (
        request(extra=b',"x":' + EMPTY_ARRAYS), 200, '"OUTPUT0"'),
    "inputs of empty arrays": (b'{"inputs":' + EMPTY_ARRAYS + b"}", 400, "Expected `object`, got `array` - at `$.inputs[0]`"),
    "370 000 inputs": (
        request(b",".join([tensor(b"X")] * 370_000)), 400,
        "more than 65536 objects or object members outside the tensors' data (a request may have at most "
        "4096 inputs and 4096 outputs"),
    "1.4 million outputs": (
        request(extra=b',"outputs":[' + b",".join([b'{"name":"OUTPUT0"}'] * 1_400_000) + b"]"), 400,
        "4096 inputs and 4096 outputs"),
    "2 million request parameters": (
        request(extra=b',"parameters":{' + b",".join(b'"p%d":1' % i for i in range(2_000_000)) + b"}"), 400,
        "more than 65536 objects or object members"),
    "12 million dimensions": (
        request(tensor(b"INPUT0", shape=b"[" + b"1," * 12_000_000 + b"4]") + b"," + tensor(b"INPUT1")), 400,
        "the shape of input 'INPUT0' has 12000001 dimensions, more than the 64 a tensor may have"),
    "data of empty arrays": (
        request(tensor(b"INPUT0", data=b"[" + b"[]," * N + DATA + b"]") + b"," + tensor(b"INPUT1")), 200, '"OUTPUT0"'),
    "data of strings": (
        request(tensor(b"INPUT0", shape=b"[%d]" % (N + 1), datatype=b"BYTES", data=b'["' + b'","' * N + b'"]')
                + b"," + tensor(b"INPUT1")), 400, "data-type is 'BYTES', but model 'add_sub' expects 'FP32'"),
    "data of objects": (
        request(tensor(b"INPUT0", data=b"[" + b"{}," * N + b"{}]") + b"," + tensor(b"INPUT1")), 400,
        "more than 65536 objects or object members"),
}
NORMAL = {"inputs": [{"name": n, "shape": [4], "datatype": "FP32", "data": [1.0, 2.0, 3.0, 4.0]}
                     for n in ("INPUT0", "INPUT1")]}


@pytest.fixture(scope="module")
def server():
    yield from running(KernelProcess([EXAMPLES], "--grpc-server", "native"))


def assert_add_sub_works(client: httpx.Client) -> None:
    r = client.post("/v2/models/add_sub/infer", json=NORMAL)
    assert r.status_code == 200, r.text[:300]
    assert r.json()["outputs"][0]["data"] == [2.0, 4.0, 6.0, 8.0]


@pytest.mark.parametrize("case", sorted(HOSTILE))
def test_a_hostile_infer_json_is_answered_without_freezing_the_front(server, case):
    body, status, says = HOSTILE[case]
    assert 22 * MIB < len(body) < 40 * MIB
    with httpx.Client(base_url=f"http://{server.url}", timeout=120) as client:
        assert_add_sub_works(client)
        before = rss_mb(server.proc.pid)
        with LivenessProbe(server.url) as probe:
            answers = attack_rounds(lambda: client.post("/v2/models/add_sub/infer", content=body), seconds=3.0,
                                    rounds=20)
        grown = rss_mb(server.proc.pid) - before
        assert_stays_live(probe)
        for r in answers:
            assert r.status_code == status, r.text[:300]
            assert says in r.text, r.text[:300]
        # what the front holds: the body it reads and a few pieces of it, whatever the body holds
        assert grown < 4 * len(body) / MIB + 50, f"front RSS grew {grown:.0f} MB for a {len(body) / MIB:.0f} MiB body"
        assert_add_sub_works(client)


@pytest.mark.parametrize("route", sorted(ROUTES))
def test_both_routes_bound_the_json(server, route):
    """The fast path and the ASGI route decode through the same code; both stay live."""
    body, status, says = HOSTILE["370 000 inputs"]
    with httpx.Client(base_url=f"http://{server.url}", timeout=120) as client:
        with LivenessProbe(server.url) as probe:
            answers = attack_rounds(lambda: client.post("/v2/models/add_sub/infer", content=body,
                                                        headers=ROUTES[route]), seconds=2.0, rounds=10)
        assert_stays_live(probe)
        assert all(r.status_code == status and says in r.text for r in answers), answers[0].text[:300]
        assert_add_sub_works(client)


SMALL = [  # small bodies (decoded on the loop): the same bounds, the same words
    ({"inputs": [{"name": f"X{i}", "shape": [1], "datatype": "FP32", "data": [1.0]} for i in range(4097)]},
     "4097 inputs, more than the 4096 a request may have"),
    ({**NORMAL, "outputs": [{"name": "OUTPUT0"}] * 4097}, "4097 outputs, more than the 4096 a request may have"),
    ({"inputs": [{**NORMAL["inputs"][0], "shape": [1] * 65}, NORMAL["inputs"][1]]},
     "the shape of input 'INPUT0' has 65 dimensions, more than the 64 a tensor may have"),
    ({**NORMAL, "parameters": {"a": [[]] * 1000}}, "parameter 'a' has invalid type"),
]


@pytest.mark.parametrize("body,says", SMALL, ids=["inputs", "outputs", "dimensions", "parameter"])
def test_the_bounds_hold_for_small_bodies_too(server, body, says):
    with httpx.Client(base_url=f"http://{server.url}", timeout=60) as client:
        r = client.post("/v2/models/add_sub/infer", content=json.dumps(body))
        assert r.status_code == 400 and says in r.json()["error"], r.text[:300]
        assert_add_sub_works(client)


def test_a_tensor_parameter_that_is_an_array_is_ignored_as_by_tritonserver(server):
    """tritonserver 2.51 reads only its own keys of an input's or output's parameters: anything
    else, arrays and objects too, is left alone (200); its own keys are type-checked (400)."""
    inputs = [{**NORMAL["inputs"][0], "parameters": {"tags": [1, [2]], "more": {"a": 1}}}, NORMAL["inputs"][1]]
    with httpx.Client(base_url=f"http://{server.url}", timeout=60) as client:
        r = client.post("/v2/models/add_sub/infer",
                        json={"inputs": inputs, "outputs": [{"name": "OUTPUT0", "parameters": {"t": [1]}}]})
        assert r.status_code == 200, r.text[:300]
        inputs[0]["parameters"]["binary_data_size"] = [16]
        r = client.post("/v2/models/add_sub/infer", json={"inputs": inputs})
        assert r.status_code == 400 and "invalid binary_data_size for input 'INPUT0'" in r.text, r.text[:300]




# ---- gRPC: the same bounds, checked before the codec reads each tensor and parameter ----------

def grpc_request(inputs: int = 2, outputs: int = 0, dims: int = 1, parameters: int = 0):
    from tritonclient.grpc import service_pb2 as tc_pb

    req = tc_pb.ModelInferRequest(model_name="add_sub")
    for i in range(inputs):
        t = req.inputs.add()
        t.name, t.datatype = f"INPUT{i}" if inputs == 2 else "X", "FP32"
        t.shape.extend([1] * (dims - 1) + [4])
    for _ in range(outputs):
        req.outputs.add().name = "OUTPUT0"
    for i in range(parameters):
        req.parameters[f"p{i}"].int64_param = 1
    req.raw_input_contents.extend([np.ones(4, np.float32).tobytes()] * min(inputs, 2))
    return req


GRPC_HOSTILE = {  # name: (request, what the error says, the freeze left (ms)); ~8-14 MiB each
    "600 000 inputs": (lambda: grpc_request(inputs=600_000), "600000 inputs, more than the 4096", 500),
    "1 million outputs": (lambda: grpc_request(outputs=1_000_000), "1000000 outputs, more than the 4096", 500),
    "4 million dimensions": (lambda: grpc_request(dims=4_000_000), "has 4000000 dimensions, more than the 64", 500),
    # protobuf's parse of a 600 000-entry map, on the loop, is most of the ~1 s left here
    "600 000 parameters": (lambda: grpc_request(parameters=600_000), "600000 parameters, more than the 16384", 3000),
}


@pytest.mark.parametrize("case", sorted(GRPC_HOSTILE))
def test_a_hostile_grpc_infer_is_refused_before_its_tensors_are_read(server, case):
    """The unbounded codec read every one of them on the event loop (1 million outputs: ~2 s, a
    walk of the message's top-level fields ~1 s more). What is left is protobuf's parse of the
    message, on the loop too (~100 ms for 10 MiB of tensors; ~1 s for a 600 000-entry map)."""
    import grpc
    from tritonclient.grpc import service_pb2_grpc as tc_grpc

    build, says, freeze_ms = GRPC_HOSTILE[case]
    message = build()
    with grpc.insecure_channel(server.grpc_url) as channel:
        stub = tc_grpc.GRPCInferenceServiceStub(channel)
        with LivenessProbe(server.url) as probe:
            for _ in range(3):
                with pytest.raises(grpc.RpcError) as info:
                    stub.ModelInfer(message, timeout=60)
                assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT, info.value.details()
                assert says in info.value.details(), info.value.details()
        print(probe.summary())
        assert probe.max_ms() < freeze_ms, f"/v2/health/live froze while the request was read: {probe.summary()}"
        answer = stub.ModelInfer(grpc_request(), timeout=60)
        assert np.frombuffer(answer.raw_output_contents[0], np.float32).tolist() == [2.0] * 4
