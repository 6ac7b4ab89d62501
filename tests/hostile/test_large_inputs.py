"""A very large input costs its own client time, not every client's (a front's event loop).

A gRPC request message over 1 GiB was gathered from views of the socket's reads and joined on the
loop, and every input over 64 KiB was copied into the worker's arena on the loop in one slice
assignment: one ~1 GiB ModelInfer held the front's loop for 1-2 s (a new arena segment's page
faults included), every other client of the front waiting with it. Now any message from 256 KiB
up to the message size limit is read straight into its own buffer, and a batch with more than
8 MiB of inputs is copied into the arena on a thread (backends/python/input_copy.py). This
test sends one such request to a real `kernel serve --grpc-server native` with the bytes built
before the liveness probe starts, from a process of its own (a client sending 1 GiB holds its
process's GIL for a while, which would freeze a probe beside it), and checks the answer byte for byte.

A ModelStreamInfer message was parsed whole by protobuf, its raw_input_contents included (a copy
with the GIL held): one 512 MiB tensor on a stream held the loop ~0.6 s, the probe saw 0.93-1.02 s.
Its raw inputs are now taken out of the message as a unary call's are (codec.split_raw_inputs).
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import numpy as np
import pytest
from tritonclient.grpc import service_pb2 as tc_pb

from conftest import ROOT, KernelProcess, running
from kernel.transports.grpc.typed_contents import encode_varint
from liveness import probe_client

MIB = 1 << 20
MAX_FREEZE_MS = 500  # generous for a loaded 2-core box; the unfixed front froze 1 000-2 000 ms
INFER = "/inference.GRPCInferenceService/ModelInfer"


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    repo = tmp_path_factory.mktemp("large-inputs")
    shutil.copytree(ROOT / "benchmarks" / "model_repo_suite" / "identity_fp32", repo / "identity_fp32")
    yield from running(KernelProcess([repo], "--grpc-server", "native"))


def infer_message(data: np.ndarray) -> bytes:
    """ModelInferRequest for identity_fp32 with `data` as its raw input, serialised without a
    protobuf copy of the tensor: field 7 (raw_input_contents) appended by hand."""
    head = tc_pb.ModelInferRequest(
        model_name="identity_fp32",
        inputs=[tc_pb.ModelInferRequest.InferInputTensor(name="INPUT0", datatype="FP32", shape=[data.size])],
    ).SerializeToString()
    return b"".join([head, b"\x3a", encode_varint(data.nbytes), data.data])


# The client, in a process of its own: grpcio copies a 1 GiB message into its send buffers holding
# the GIL of the process that sends it, and a probe thread beside it then measured that client's
# pause (0.7-2.6 s in some runs), not the server's.
CLIENT = r"""
import sys
import grpc
import numpy as np
from tritonclient.grpc import service_pb2 as tc_pb
sys.path[:0] = [sys.argv[2], sys.argv[3]]  # this folder, and tests/ (its conftest: ROOT, KernelProcess)
from test_large_inputs import INFER, infer_message
n = (1 << 28) + 1024  # floats: 1 GiB + 4 KiB, past the old 1 GiB cap on direct reads
data = np.arange(n, dtype=np.uint32).view(np.float32)
message = infer_message(data)
assert len(message) > 1 << 30
options = [("grpc.max_send_message_length", -1), ("grpc.max_receive_message_length", -1)]
with grpc.insecure_channel(f"127.0.0.1:{sys.argv[1]}", options=options) as channel:
    call = channel.unary_unary(INFER)
    print("ready", flush=True)
    sys.stdin.readline()
    answer = call(message, timeout=300)
del message
response = tc_pb.ModelInferResponse.FromString(answer)
del answer
assert [o.name for o in response.outputs] == ["OUTPUT0"] and list(response.outputs[0].shape) == [n], response.outputs
assert len(response.raw_output_contents) == 1
out = np.frombuffer(response.raw_output_contents[0], np.float32)
assert out.nbytes == data.nbytes and np.array_equal(out.view(np.uint32), data.view(np.uint32)), "not the input"
print("answered byte for byte", flush=True)
"""


def test_a_request_over_1_gib_is_answered_without_freezing_the_front(server):
    here = Path(__file__).resolve().parent
    probe, out, err, status = probe_client(server.url, [sys.executable, "-c", CLIENT, str(server.grpc_port), str(here),
                                                        str(here.parent)])
    assert status == 0 and "answered byte for byte" in out, f"the client failed:\n{out}\n{err}"
    assert len(probe.latencies_ms) >= 10, probe.summary()
    assert probe.max_ms() < MAX_FREEZE_MS, f"/v2/health/live froze while the request was read and copied: {probe.summary()}"


STREAM_CLIENT = r"""
import queue
import sys
import numpy as np
import tritonclient.grpc as grpcclient
client = grpcclient.InferenceServerClient(f"127.0.0.1:{sys.argv[1]}")
data = np.arange(1 << 27, dtype=np.uint32).view(np.float32)  # 512 MiB
tensor = grpcclient.InferInput("INPUT0", [data.size], "FP32")
tensor.set_data_from_numpy(data)
answers = queue.Queue()
client.start_stream(callback=lambda result, error: answers.put((result, error)))
print("ready", flush=True)
sys.stdin.readline()
client.async_stream_infer("identity_fp32", [tensor])
result, error = answers.get(timeout=300)
assert error is None, error
assert np.array_equal(result.as_numpy("OUTPUT0").view(np.uint32), data.view(np.uint32)), "not the input"
client.stop_stream()
print("answered byte for byte", flush=True)
"""


def test_a_512_mib_stream_message_is_answered_without_freezing_the_front(server):
    probe, out, err, status = probe_client(server.url, [sys.executable, "-c", STREAM_CLIENT, str(server.grpc_port)])
    assert status == 0 and "answered byte for byte" in out, f"the client failed:\n{out}\n{err}"
    assert len(probe.latencies_ms) >= 10, probe.summary()
    assert probe.max_ms() < MAX_FREEZE_MS, f"/v2/health/live froze while the stream's message was parsed: {probe.summary()}"
