"""Millions of BYTES elements cost their own client time, not every client's.

Validating a BYTES input walks its elements' length prefixes (each one a step in Python): the
front did it on its event loop, and built every element as it went. 64 MiB of empty elements
(16 Mi of them, within the default --http-max-input-size) held every client of the front for
6.0-6.5 s. Now the walk makes no elements (datatypes.check_bytes) and a request that may hold many
runs it on a thread (kernel.core.admission), where it hands the GIL to the loop every switch
interval. This test sends such a request to a real `kernel serve` from a process of its own with
the liveness probe running, then a malformed one, which gets Triton's 400 as a small one does.

Over gRPC the elements can come as `contents.bytes_contents`, which protobuf parsed and the codec
turned into bytes element by element on the loop: 4 Mi empty elements (an 8 MB message) froze the
front 0.75 s, 8 Mi 1.6 s. Large typed contents are now cut out of the message and made into bytes
beside the loop (transports/grpc/typed_contents.py).
"""

from __future__ import annotations

import json
import struct
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from conftest import TEST_MODELS, KernelProcess, running
from liveness import probe_client

MAX_FREEZE_MS = 500  # generous for a loaded 2-core box; the unfixed front froze 6 000 ms
ELEMENTS = (16 << 20) - 64  # 64 MiB of 4-byte length prefixes, under the default 64 MiB body limit


@pytest.fixture(scope="module")
def server():
    yield from running(KernelProcess([TEST_MODELS / "bytes_elements"]))


def infer(address: str, body_bytes: bytes, shape: int) -> tuple[int, bytes]:
    header = json.dumps({"inputs": [{"name": "INPUT0", "datatype": "BYTES", "shape": [shape],
                                     "parameters": {"binary_data_size": len(body_bytes)}}]}).encode()
    request = urllib.request.Request(f"http://{address}/v2/models/first_bytes/infer", data=header + body_bytes,
                                     headers={"Inference-Header-Content-Length": str(len(header))})
    try:
        with urllib.request.urlopen(request, timeout=300) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


CLIENT = r"""
import sys
sys.path[:0] = [sys.argv[2], sys.argv[3]]  # this folder, and tests/ (its conftest)
from test_bytes_elements import ELEMENTS, infer
body = bytes(4 * ELEMENTS)  # every element empty
print("ready", flush=True)
sys.stdin.readline()
status, answer = infer(sys.argv[1], body, ELEMENTS)
print(status, answer.decode()[:300], flush=True)
"""


def test_16_mi_empty_elements_do_not_freeze_the_front(server):
    here = Path(__file__).resolve().parent
    probe, out, err, status = probe_client(server.url, [sys.executable, "-c", CLIENT, server.url, str(here), str(here.parent)])
    assert status == 0, err
    assert out.startswith("200 ") and '"data":[""]' in out, out  # the model's answer: its first element
    assert len(probe.latencies_ms) >= 10, probe.summary()
    assert probe.max_ms() < MAX_FREEZE_MS, f"/v2/health/live froze while the elements were checked: {probe.summary()}"


@pytest.mark.parametrize("elements", [3, 100_000])  # checked on the loop, and beside it
def test_a_malformed_tensor_gets_the_same_400_either_way(server, elements):
    body = struct.pack("<I", 1) + b"x" + bytes(4 * (elements - 2))  # one element short
    status, answer = infer(server.url, body, elements)
    assert status == 400
    assert json.loads(answer) == {"error": (
        "[request id: <id_unknown>] input byte size mismatch for input 'INPUT0' for model 'first_bytes'. "
        f"expected {elements} BYTES elements, found {elements - 1}")}
    status, answer = infer(server.url, struct.pack("<I", 2) + b"ok", 1)  # and the server serves the next
    assert status == 200 and json.loads(answer)["outputs"][0]["data"] == ["ok"]


GRPC_CLIENT = r"""
import sys
import grpc
from tritonclient.grpc import service_pb2 as pb
elements = 8 << 20
request = pb.ModelInferRequest(model_name="first_bytes")
tensor = request.inputs.add(name="INPUT0", datatype="BYTES", shape=[elements])
tensor.contents.bytes_contents.extend([b"first"] + [b""] * (elements - 1))
message = request.SerializeToString()
channel = grpc.insecure_channel(f"127.0.0.1:{sys.argv[1]}", options=[("grpc.max_send_message_length", -1)])
call = channel.unary_unary("/inference.GRPCInferenceService/ModelInfer")
print("ready", flush=True)
sys.stdin.readline()
answer = pb.ModelInferResponse.FromString(call(message, timeout=300))
print("answered", answer.raw_output_contents[0][4:].decode(), flush=True)
"""


def test_8_mi_grpc_bytes_contents_do_not_freeze_the_front(server):
    probe, out, err, status = probe_client(server.url, [sys.executable, "-c", GRPC_CLIENT, str(server.grpc_port)])
    assert status == 0 and "answered first" in out, f"the client failed:\n{out}\n{err}"
    assert len(probe.latencies_ms) >= 10, probe.summary()
    assert probe.max_ms() < MAX_FREEZE_MS, f"/v2/health/live froze while the contents were parsed: {probe.summary()}"
