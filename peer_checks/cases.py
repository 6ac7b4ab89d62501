"""The table of requests the differential check sends to real Triton and to Kernel.

One row per request, in the order they are sent (some change server state: loads,
unloads; both peers see the same sequence). A row says what to send and how much
of the answer to compare:

- "full": status and the whole body (normalised: see normalise.py)
- "error": status, and the `error` text (or gRPC details) when there is one
- "status": the status only (bodies that legitimately differ: metrics text, ...)

Rows are built with the helpers below; `CASES` is the table.
"""

from __future__ import annotations

import base64
import json
import struct
from dataclasses import dataclass, field
from typing import Optional

from peers import RESTRICTED_KEY, RESTRICTED_VALUE


@dataclass(frozen=True)
class Case:
    id: str
    kind: str  # "http" | "grpc" | "stream"
    endpoint: str = "http"  # http | sagemaker | vertex | metrics (kind "http")
    method: str = "GET"
    path: str = ""
    body: Optional[bytes] = None
    headers: dict = field(default_factory=dict)
    rpc: str = ""
    request: object = None  # gRPC: the request as a dict (a list of them for "stream")
    metadata: tuple = ()
    compare: str = "full"
    timeout: float = 60.0  # "stream": what arrived by then is the answer
    # Bodies may hold "{mme}", "{shm_key}", "{add_sub_model_py}" and "{metrics_port}" (the peer's
    # own): filled in at run time.


def _json(doc) -> bytes:
    return json.dumps(doc).encode()


def get(id_, path, endpoint="http", compare="full", headers=None) -> Case:
    return Case(id_, "http", endpoint, "GET", path, None, headers or {}, compare=compare)


def post(id_, path, body=None, endpoint="http", compare="full", headers=None, method="POST") -> Case:
    data = body if body is None or isinstance(body, bytes) else _json(body)
    return Case(id_, "http", endpoint, method, path, data, headers or {}, compare=compare)


def rpc(id_, name, request=None, compare="full", metadata=()) -> Case:
    return Case(id_, "grpc", rpc=name, request=request or {}, compare=compare, metadata=metadata)


def stream(id_, requests, compare="full", timeout=60.0) -> Case:
    return Case(id_, "stream", request=requests, compare=compare, timeout=timeout)


# ---- request bodies ---------------------------------------------------------------------------

V4 = [1.0, 2.0, 3.0, 4.0]


def add_sub(in0=None, in1=None, dtype="FP32", shape=(4,), **extra) -> dict:
    """add_sub's two inputs; a wrong dtype, shape or data goes on INPUT0 only (which of two bad
    inputs Triton reports depends on its hash map's order, not on anything a client controls)."""
    doc = {"inputs": [
        {"name": "INPUT0", "datatype": dtype, "shape": list(shape), "data": in0 if in0 is not None else V4},
        {"name": "INPUT1", "datatype": "FP32", "shape": [4], "data": in1 if in1 is not None else V4},
    ]}
    doc.update(extra)
    return doc


def binary_add_sub(header_extra: int = 0, data_bytes: int = 16) -> tuple[bytes, dict]:
    """add_sub with both inputs as binary data; header_extra/data_bytes make it wrong on purpose."""
    blob = struct.pack("<4f", *V4)
    header = {"inputs": [
        {"name": "INPUT0", "datatype": "FP32", "shape": [4], "parameters": {"binary_data_size": data_bytes}},
        {"name": "INPUT1", "datatype": "FP32", "shape": [4], "parameters": {"binary_data_size": 16}},
    ], "outputs": [{"name": "OUTPUT0", "parameters": {"binary_data": False}}]}
    head = _json(header)
    body = head + blob + blob
    return body, {"Inference-Header-Content-Length": str(len(head) + header_extra)}


def grpc_add_sub(model="add_sub", version="", dtype="FP32", shape=(4,), raw=True, **extra) -> dict:
    blob = base64.b64encode(struct.pack("<4f", *V4)).decode()
    request = {  # as add_sub(): only INPUT0 is ever wrong
        "model_name": model, "model_version": version,
        "inputs": [{"name": "INPUT0", "datatype": dtype, "shape": list(shape)},
                   {"name": "INPUT1", "datatype": "FP32", "shape": [4]}],
    }
    if raw:
        request["raw_input_contents"] = [blob, blob]
    request.update(extra)
    return request


def _bytes_tensor(*items: bytes) -> str:
    """raw_input_contents of a BYTES tensor: each element with its 4-byte length first."""
    return base64.b64encode(b"".join(struct.pack("<I", len(i)) + i for i in items)).decode()


def batch_mix(value: int, mode: str) -> dict:
    """One request to batch_mix: answered its MODE's way (see its model.py)."""
    return {"model_name": "batch_mix", "id": mode, "inputs": [
        {"name": "IN", "datatype": "INT32", "shape": [1, 1]}, {"name": "MODE", "datatype": "BYTES", "shape": [1, 1]}],
        "raw_input_contents": [base64.b64encode(struct.pack("<i", value)).decode(), _bytes_tensor(mode.encode())]}


def async_bls_for(i: int, wait_s: float) -> dict:
    return {"model_name": "async_bls_for", "id": str(i), "inputs": [{"name": "WAIT_S", "datatype": "FP32", "shape": [1, 1]}],
            "raw_input_contents": [base64.b64encode(struct.pack("<f", wait_s)).decode()]}


def chunked(body: bytes, count: int, size: int = 8) -> bytes:
    """`body` as a chunked HTTP body of exactly `count` non-empty chunks (JSON whitespace after it):
    sent in one piece, so the server's reads split some chunks between them."""
    pieces = [body[i:i + size] for i in range(0, len(body), size)]
    pieces += [b" " * size] * (count - len(pieces))
    return b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in pieces) + b"0\r\n\r\n"


CONFIG_OVERRIDE = json.dumps({
    "backend": "python", "max_batch_size": 0,
    "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [4]},
              {"name": "INPUT1", "data_type": "TYPE_FP32", "dims": [4]}],
    "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [4]},
               {"name": "OUTPUT1", "data_type": "TYPE_FP32", "dims": [4]}],
})
MODEL_PY = "{add_sub_model_py}"  # replaced by the runner with add_sub's model.py, base64
# A config override named otherwise than the model being loaded: what Triton's QA model_control
# test sends for 'model{test}' (curl takes the braces for a glob and loads 'modeltest').
MISNAMED_OVERRIDE = json.dumps({**json.loads(CONFIG_OVERRIDE), "name": "model{test}"})


ONE_INPUT = {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [2], "data": [1.0, 2.0]}]}
ONE_INPUT_1 = {"inputs": [{"name": "IN", "datatype": "FP32", "shape": [1], "data": [1.0]}]}
RESTRICTED_HEADER = {RESTRICTED_KEY: RESTRICTED_VALUE}
RESTRICTED_METADATA = ((f"triton-grpc-protocol-{RESTRICTED_KEY}", RESTRICTED_VALUE),)

BIN, BIN_HEADERS = binary_add_sub()
BAD_BIN, BAD_BIN_HEADERS = binary_add_sub(header_extra=1000)
SHORT_BIN, SHORT_BIN_HEADERS = binary_add_sub(data_bytes=12)
SAGEMAKER_BINARY = {"Content-Type": "application/vnd.sagemaker-triton.binary+json;json-header-size="
                                    + BIN_HEADERS["Inference-Header-Content-Length"]}
VERTEX_BINARY = {"Content-Type": "application/vnd.vertex-ai-triton.binary+json;json-header-size="
                                 + BIN_HEADERS["Inference-Header-Content-Length"]}
REDIRECT = "X-Vertex-Ai-Triton-Redirect"


CASES: list[Case] = [
    # ---- health, metadata -----------------------------------------------------------------
    get("health-live", "/v2/health/live"),
    get("health-ready", "/v2/health/ready"),
    post("health-live-post", "/v2/health/live", b""),
    get("server-metadata", "/v2"),
    get("model-metadata", "/v2/models/add_sub"),
    get("model-metadata-version", "/v2/models/add_sub/versions/1"),
    get("model-metadata-unknown-version", "/v2/models/add_sub/versions/7"),
    get("model-metadata-bad-version", "/v2/models/add_sub/versions/abc"),
    get("model-metadata-unknown", "/v2/models/no_such_model"),
    get("model-ready", "/v2/models/add_sub/ready"),
    get("model-ready-unknown", "/v2/models/no_such_model/ready"),
    get("model-ready-unloaded", "/v2/models/init_fails/ready"),
    get("model-config", "/v2/models/add_sub/config"),
    get("model-config-strings", "/v2/models/string_identity/config"),
    get("model-config-unknown", "/v2/models/no_such_model/config"),
    get("unknown-route", "/v2/nothing/here"),
    get("unknown-root", "/"),
    # ---- inference over HTTP --------------------------------------------------------------
    post("infer-json", "/v2/models/add_sub/infer", add_sub()),
    post("infer-json-id-and-outputs", "/v2/models/add_sub/infer",
         add_sub(id="req-7", outputs=[{"name": "OUTPUT1"}])),
    post("infer-version", "/v2/models/add_sub/versions/1/infer", add_sub()),
    post("infer-unknown-version", "/v2/models/add_sub/versions/3/infer", add_sub()),
    post("infer-unknown-model", "/v2/models/no_such_model/infer", add_sub()),
    post("infer-wrong-dtype", "/v2/models/add_sub/infer", add_sub(dtype="INT32", in0=[1, 2, 3, 4])),
    post("infer-wrong-shape", "/v2/models/add_sub/infer", add_sub(shape=(2, 2))),
    post("infer-too-few-elements", "/v2/models/add_sub/infer", add_sub(in0=[1.0, 2.0])),
    post("infer-missing-input", "/v2/models/add_sub/infer",
         {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [4], "data": V4}]}),
    post("infer-unknown-input", "/v2/models/add_sub/infer",
         {"inputs": add_sub()["inputs"] + [{"name": "EXTRA", "datatype": "FP32", "shape": [1], "data": [1]}]}),
    post("infer-unknown-output", "/v2/models/add_sub/infer", add_sub(outputs=[{"name": "NOPE"}])),
    post("infer-bad-datatype-name", "/v2/models/add_sub/infer", add_sub(dtype="FLOAT")),
    post("infer-data-not-numbers", "/v2/models/add_sub/infer", add_sub(in0=["a", "b", "c", "d"])),
    post("infer-malformed-json", "/v2/models/add_sub/infer", b'{"inputs": [ {"name": '),
    post("infer-not-json", "/v2/models/add_sub/infer", b"not json"),
    post("infer-empty-document", "/v2/models/add_sub/infer", b"   "),
    post("infer-inputs-not-a-list", "/v2/models/add_sub/infer", {"inputs": "nope"}),
    post("infer-no-inputs", "/v2/models/add_sub/infer", {"inputs": []}),
    post("infer-binary", "/v2/models/add_sub/infer", BIN, headers=BIN_HEADERS),
    post("infer-binary-header-too-long", "/v2/models/add_sub/infer", BAD_BIN, headers=BAD_BIN_HEADERS),
    post("infer-binary-size-mismatch", "/v2/models/add_sub/infer", SHORT_BIN, headers=SHORT_BIN_HEADERS),
    post("infer-binary-header-not-a-number", "/v2/models/add_sub/infer", BIN,
         headers={"Inference-Header-Content-Length": "abc"}),
    post("infer-bad-parameter-type", "/v2/models/add_sub/infer", add_sub(parameters={"priority": "high"})),
    post("infer-bad-sequence-id", "/v2/models/add_sub/infer", add_sub(parameters={"sequence_id": [1]})),
    post("infer-bad-timeout", "/v2/models/add_sub/infer", add_sub(parameters={"timeout": "soon"})),
    post("infer-strings", "/v2/models/string_identity/infer",
         {"inputs": [{"name": "INPUT0", "datatype": "BYTES", "shape": [2], "data": ["a", "bc"]}]}),
    post("infer-model-raises", "/v2/models/raises/infer",
         {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [2], "data": [1, 2]}]}),
    post("infer-decoupled-over-http", "/v2/models/repeat_int32/infer",
         {"inputs": [{"name": "IN", "datatype": "INT32", "shape": [2], "data": [1, 2]}]}),
    post("infer-get-method", "/v2/models/add_sub/infer", add_sub(), method="GET"),
    post("infer-classification", "/v2/models/add_sub/infer",
         add_sub(outputs=[{"name": "OUTPUT0", "parameters": {"classification": 2}}])),
    post("infer-binary-output", "/v2/models/add_sub/infer",
         add_sub(outputs=[{"name": "OUTPUT1", "parameters": {"binary_data": True}}])),
    post("infer-sequence-on-plain-model", "/v2/models/add_sub/infer",
         add_sub(parameters={"sequence_id": 7, "sequence_start": True})),
    post("infer-priority-and-timeout", "/v2/models/add_sub/infer",
         add_sub(parameters={"priority": 1, "timeout": 1000000})),
    post("infer-unknown-shm-region", "/v2/models/add_sub/infer", {"inputs": [
        {"name": "INPUT0", "datatype": "FP32", "shape": [4],
         "parameters": {"shared_memory_region": "nope", "shared_memory_byte_size": 16}},
        {"name": "INPUT1", "datatype": "FP32", "shape": [4], "data": V4}]}),
    post("infer-raw-binary-single-input", "/v2/models/raises/infer", struct.pack("<2f", 1, 2),
         headers={"Inference-Header-Content-Length": "0", "Content-Type": "application/octet-stream"}),
    post("generate", "/v2/models/add_sub/generate", {"INPUT0": V4, "INPUT1": V4}),
    post("generate-missing-input", "/v2/models/add_sub/generate", {"INPUT0": V4}),
    post("generate-stream", "/v2/models/add_sub/generate_stream", {"INPUT0": V4, "INPUT1": V4}),
    post("generate-unknown-model", "/v2/models/no_such_model/generate", {"INPUT0": V4}),
    # ---- statistics, repository index, shared memory, trace, logging ------------------------
    get("stats-all", "/v2/models/stats"),
    get("model-ready-version", "/v2/models/add_sub/versions/1/ready"),
    get("model-config-version", "/v2/models/add_sub/versions/1/config"),
    post("generate-stream-decoupled", "/v2/models/repeat_int32/generate_stream", {"IN": [7, 8]}),
    post("generate-decoupled", "/v2/models/repeat_int32/generate", {"IN": [7, 8]}),
    get("stats-version", "/v2/models/add_sub/versions/1/stats"),
    post("repository-index-ready-not-bool", "/v2/repository/index", {"ready": "yes"}),
    post("shm-register", "/v2/systemsharedmemory/region/peer_r1/register",
         {"key": "{shm_key}", "offset": 0, "byte_size": 32}),
    post("shm-register-again", "/v2/systemsharedmemory/region/peer_r1/register",
         {"key": "{shm_key}", "offset": 0, "byte_size": 32}),
    get("shm-status-registered", "/v2/systemsharedmemory/region/peer_r1/status"),
    post("infer-from-shm", "/v2/models/add_sub/infer", {"inputs": [
        {"name": "INPUT0", "datatype": "FP32", "shape": [4],
         "parameters": {"shared_memory_region": "peer_r1", "shared_memory_byte_size": 16}},
        {"name": "INPUT1", "datatype": "FP32", "shape": [4],
         "parameters": {"shared_memory_region": "peer_r1", "shared_memory_byte_size": 16,
                        "shared_memory_offset": 16}}]}),
    post("infer-shm-past-region", "/v2/models/add_sub/infer", {"inputs": [
        {"name": "INPUT0", "datatype": "FP32", "shape": [4],
         "parameters": {"shared_memory_region": "peer_r1", "shared_memory_byte_size": 16,
                        "shared_memory_offset": 24}},
        {"name": "INPUT1", "datatype": "FP32", "shape": [4], "data": V4}]}),
    post("shm-unregister", "/v2/systemsharedmemory/region/peer_r1/unregister", b""),
    post("cuda-shm-register", "/v2/cudasharedmemory/region/c1/register",
         {"raw_handle": {"b64": "AAAA"}, "device_id": 0, "byte_size": 16}),
    get("model-trace-restricted", "/v2/models/add_sub/trace/setting"),
    post("logging-update", "/v2/logging", {"log_info": True}),
    get("stats-model", "/v2/models/add_sub/stats"),
    get("stats-unknown", "/v2/models/no_such_model/stats"),
    post("repository-index", "/v2/repository/index", b""),
    post("repository-index-ready", "/v2/repository/index", {"ready": True}),
    post("repository-index-bad-json", "/v2/repository/index", b"{nope"),
    get("shm-status", "/v2/systemsharedmemory/status"),
    get("shm-status-unknown-region", "/v2/systemsharedmemory/region/nope/status"),
    post("shm-register-missing-key", "/v2/systemsharedmemory/region/r1/register", {"offset": 0, "byte_size": 16}),
    post("shm-register-no-such-key", "/v2/systemsharedmemory/region/r1/register",
         {"key": "/no_such_shm_key", "offset": 0, "byte_size": 16}),
    post("shm-unregister-unknown", "/v2/systemsharedmemory/region/nope/unregister", b""),
    get("cuda-shm-status", "/v2/cudasharedmemory/status"),
    get("trace-restricted", "/v2/trace/setting"),
    get("trace-with-key", "/v2/trace/setting", headers=RESTRICTED_HEADER),
    post("trace-update-bad", "/v2/trace/setting", {"trace_level": ["NOPE"]}, headers=RESTRICTED_HEADER),
    get("logging", "/v2/logging"),
    post("logging-bad-value", "/v2/logging", {"log_verbose_level": "loud"}),
    # ---- the model repository API: lifecycle failures, overrides, names ----------------------
    post("load-init-fails", "/v2/repository/models/init_fails/load", b""),
    post("load-syntax-error", "/v2/repository/models/syntax_error/load", b""),
    post("load-broken-config", "/v2/repository/models/broken_config/load", b""),
    post("load-autocomplete-fails", "/v2/repository/models/autocomplete_fails/load", b""),
    post("load-unknown-model", "/v2/repository/models/no_such_model/load", b""),
    # models that load and then fail in execute, each its own way
    post("load-wrong-count", "/v2/repository/models/wrong_count/load", b""),
    post("infer-wrong-count", "/v2/models/wrong_count/infer", ONE_INPUT),
    post("load-wrong-type", "/v2/repository/models/wrong_type/load", b""),
    post("infer-wrong-type", "/v2/models/wrong_type/infer", ONE_INPUT),
    post("load-error-response", "/v2/repository/models/error_response/load", b""),
    post("infer-error-response", "/v2/models/error_response/infer", ONE_INPUT),
    rpc("grpc-infer-error-response", "ModelInfer", {
        "model_name": "error_response", "inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1]}],
        "raw_input_contents": [base64.b64encode(struct.pack("<f", 1.0)).decode()]}),
    post("load-crasher", "/v2/repository/models/crasher/load", b""),
    post("infer-crasher-ok", "/v2/models/crasher/infer", ONE_INPUT),
    post("infer-crasher-dies", "/v2/models/crasher/infer",
         {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1], "data": [-1.0]}]}),
    get("model-ready-after-crash", "/v2/models/crasher/ready"),
    post("infer-crasher-after-crash", "/v2/models/crasher/infer", ONE_INPUT),
    post("unload-crasher", "/v2/repository/models/crasher/unload", b""),
    post("load-files-without-config", "/v2/repository/models/ovr_a/load",
         {"parameters": {"file:1/model.py": MODEL_PY}}),
    post("load-file-escapes", "/v2/repository/models/ovr_b/load",
         {"parameters": {"config": CONFIG_OVERRIDE, "file:1/model.py": MODEL_PY, "file:../../x": MODEL_PY}}),
    post("load-file-leading-slash", "/v2/repository/models/ovr_c/load",
         {"parameters": {"config": CONFIG_OVERRIDE, "file:/1/model.py": MODEL_PY}}),
    post("infer-on-override", "/v2/models/ovr_c/infer", add_sub()),
    post("unload-override", "/v2/repository/models/ovr_c/unload", b""),
    post("unload-unknown", "/v2/repository/models/no_such_model/unload", b""),
    post("unload-bad-dependents", "/v2/repository/models/no_such_model/unload",
         {"parameters": {"unload_dependents": "yes"}}),
    post("repository-index-after-failures", "/v2/repository/index", b""),
    get("model-ready-after-failed-load", "/v2/models/init_fails/ready"),
    get("health-ready-after-failed-loads", "/v2/health/ready"),
    # ---- gRPC -------------------------------------------------------------------------------
    rpc("grpc-server-live", "ServerLive"),
    rpc("grpc-server-ready", "ServerReady"),
    rpc("grpc-server-metadata", "ServerMetadata"),
    rpc("grpc-model-ready", "ModelReady", {"name": "add_sub"}),
    rpc("grpc-model-ready-unknown", "ModelReady", {"name": "no_such_model"}),
    rpc("grpc-model-metadata", "ModelMetadata", {"name": "add_sub"}),
    rpc("grpc-model-metadata-unknown", "ModelMetadata", {"name": "no_such_model"}),
    rpc("grpc-model-metadata-bad-version", "ModelMetadata", {"name": "add_sub", "version": "abc"}),
    rpc("grpc-model-config", "ModelConfig", {"name": "add_sub"}),
    rpc("grpc-model-config-unknown", "ModelConfig", {"name": "no_such_model"}),
    rpc("grpc-infer", "ModelInfer", grpc_add_sub()),
    rpc("grpc-infer-unknown-model", "ModelInfer", grpc_add_sub(model="no_such_model")),
    rpc("grpc-infer-unknown-version", "ModelInfer", grpc_add_sub(version="9")),
    rpc("grpc-infer-wrong-dtype", "ModelInfer", grpc_add_sub(dtype="INT32")),
    rpc("grpc-infer-wrong-shape", "ModelInfer", grpc_add_sub(shape=(2, 2))),
    rpc("grpc-infer-raw-size-mismatch", "ModelInfer", grpc_add_sub(shape=(3,))),
    rpc("grpc-infer-raw-and-shape-disagree", "ModelInfer", grpc_add_sub(raw_input_contents=[
        base64.b64encode(struct.pack("<3f", 1, 2, 3)).decode(), base64.b64encode(struct.pack("<4f", *V4)).decode()])),
    rpc("grpc-infer-no-data", "ModelInfer", grpc_add_sub(raw=False)),
    rpc("grpc-infer-unknown-output", "ModelInfer", grpc_add_sub(outputs=[{"name": "NOPE"}])),
    rpc("grpc-infer-bad-parameter", "ModelInfer",
        grpc_add_sub(parameters={"priority": {"string_param": "high"}})),
    rpc("grpc-infer-decoupled", "ModelInfer", {
        "model_name": "repeat_int32", "inputs": [{"name": "IN", "datatype": "INT32", "shape": [1]}],
        "raw_input_contents": [base64.b64encode(struct.pack("<i", 5)).decode()]}),
    rpc("grpc-infer-model-raises", "ModelInfer", {
        "model_name": "raises", "inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1]}],
        "raw_input_contents": [base64.b64encode(struct.pack("<f", 1.0)).decode()]}),
    stream("grpc-stream-decoupled", [{
        "model_name": "repeat_int32", "id": "s1", "inputs": [{"name": "IN", "datatype": "INT32", "shape": [3]}],
        "raw_input_contents": [base64.b64encode(struct.pack("<3i", 4, 5, 6)).decode()]}]),
    stream("grpc-stream-unknown-model", [grpc_add_sub(model="no_such_model")]),
    rpc("grpc-statistics", "ModelStatistics", {"name": "add_sub"}),
    rpc("grpc-statistics-unknown", "ModelStatistics", {"name": "no_such_model"}),
    rpc("grpc-repository-index", "RepositoryIndex", {}),
    rpc("grpc-load-unknown", "RepositoryModelLoad", {"model_name": "no_such_model"}),
    rpc("grpc-load-init-fails", "RepositoryModelLoad", {"model_name": "init_fails"}),
    rpc("grpc-load-shell-name", "RepositoryModelLoad", {"model_name": "a b"}, compare="error"),
    rpc("grpc-unload-unknown", "RepositoryModelUnload", {"model_name": "no_such_model"}),
    rpc("grpc-shm-status", "SystemSharedMemoryStatus", {}),
    rpc("grpc-shm-register-bad", "SystemSharedMemoryRegister", {"name": "r", "key": "/no_such_key", "byte_size": 8}),
    rpc("grpc-shm-unregister-unknown", "SystemSharedMemoryUnregister", {"name": "nope"}),
    rpc("grpc-cuda-shm-status", "CudaSharedMemoryStatus", {}),
    rpc("grpc-trace-restricted", "TraceSetting", {}),
    rpc("grpc-trace-with-key", "TraceSetting", {}, metadata=RESTRICTED_METADATA),
    rpc("grpc-log-settings", "LogSettings", {}),
    rpc("grpc-statistics-all", "ModelStatistics", {}),
    rpc("grpc-statistics-version", "ModelStatistics", {"name": "add_sub", "version": "1"}),
    # after every statistics row: Triton runs it (one more add_sub inference), Kernel refuses it
    rpc("grpc-infer-extra-raw-contents", "ModelInfer", grpc_add_sub(raw_input_contents=[
        base64.b64encode(struct.pack("<4f", *V4)).decode()] * 3)),
    rpc("grpc-model-ready-version", "ModelReady", {"name": "add_sub", "version": "1"}),
    rpc("grpc-model-ready-bad-version", "ModelReady", {"name": "add_sub", "version": "x"}),
    rpc("grpc-shm-register", "SystemSharedMemoryRegister", {"name": "peer_g1", "key": "{shm_key}", "byte_size": 32}),
    rpc("grpc-shm-status-region", "SystemSharedMemoryStatus", {"name": "peer_g1"}),
    rpc("grpc-infer-from-shm", "ModelInfer", grpc_add_sub(raw=False, inputs=[
        {"name": "INPUT0", "datatype": "FP32", "shape": [4], "parameters": {
            "shared_memory_region": {"string_param": "peer_g1"}, "shared_memory_byte_size": {"int64_param": 16}}},
        {"name": "INPUT1", "datatype": "FP32", "shape": [4], "parameters": {
            "shared_memory_region": {"string_param": "peer_g1"}, "shared_memory_byte_size": {"int64_param": 16},
            "shared_memory_offset": {"int64_param": 16}}}])),
    rpc("grpc-shm-unregister", "SystemSharedMemoryUnregister", {"name": "peer_g1"}),
    rpc("grpc-cuda-shm-unregister-unknown", "CudaSharedMemoryUnregister", {"name": "nope"}),
    rpc("grpc-log-settings-update", "LogSettings", {"settings": {"log_info": {"bool_param": True}}}),
    rpc("grpc-log-settings-bad", "LogSettings", {"settings": {"log_verbose_level": {"string_param": "loud"}}}),
    rpc("grpc-trace-with-key-model", "TraceSetting", {"model_name": "add_sub"}, metadata=RESTRICTED_METADATA),
    rpc("grpc-unload-dependents-unknown", "RepositoryModelUnload", {
        "model_name": "no_such_model", "parameters": {"unload_dependents": {"bool_param": True}}}),
    rpc("grpc-infer-classification", "ModelInfer",
        grpc_add_sub(outputs=[{"name": "OUTPUT0", "parameters": {"classification": {"int64_param": 2}}}])),
    rpc("grpc-infer-sequence-on-plain-model", "ModelInfer",
        grpc_add_sub(parameters={"sequence_id": {"int64_param": 7}, "sequence_start": {"bool_param": True}})),
    rpc("grpc-infer-unknown-shm-region", "ModelInfer", grpc_add_sub(raw=False, inputs=[
        {"name": "INPUT0", "datatype": "FP32", "shape": [4], "parameters": {
            "shared_memory_region": {"string_param": "nope"}, "shared_memory_byte_size": {"int64_param": 16}}},
        {"name": "INPUT1", "datatype": "FP32", "shape": [4], "contents": {"fp32_contents": V4}}])),
    rpc("grpc-infer-contents", "ModelInfer", grpc_add_sub(raw=False, inputs=[
        {"name": "INPUT0", "datatype": "FP32", "shape": [4], "contents": {"fp32_contents": V4}},
        {"name": "INPUT1", "datatype": "FP32", "shape": [4], "contents": {"fp32_contents": V4}}])),
    rpc("grpc-infer-contents-wrong-type", "ModelInfer", grpc_add_sub(raw=False, inputs=[
        {"name": "INPUT0", "datatype": "FP32", "shape": [4], "contents": {"int_contents": [1, 2, 3, 4]}},
        {"name": "INPUT1", "datatype": "FP32", "shape": [4], "contents": {"fp32_contents": V4}}])),
    rpc("grpc-load-override", "RepositoryModelLoad", {"model_name": "ovr_g", "parameters": {
        "config": {"string_param": CONFIG_OVERRIDE}, "file:1/model.py": {"bytes_param": MODEL_PY}}}),
    rpc("grpc-infer-override", "ModelInfer", grpc_add_sub(model="ovr_g")),
    rpc("grpc-unload-override", "RepositoryModelUnload", {"model_name": "ovr_g"}),
    rpc("grpc-load-bad-parameter", "RepositoryModelLoad", {"model_name": "add_sub", "parameters": {
        "config": {"int64_param": 3}}}, compare="error"),
    rpc("grpc-cuda-shm-register", "CudaSharedMemoryRegister",
        {"name": "c1", "raw_handle": "AAAA", "device_id": 0, "byte_size": 16}),
    rpc("grpc-trace-update-restricted", "TraceSetting", {"settings": {"trace_rate": {"value": ["5"]}}}),
    # ---- SageMaker ----------------------------------------------------------------------------
    get("sagemaker-ping", "/ping", endpoint="sagemaker"),
    post("sagemaker-invocations", "/invocations", add_sub(), endpoint="sagemaker"),
    post("sagemaker-invocations-binary", "/invocations", BIN, endpoint="sagemaker", headers=SAGEMAKER_BINARY),
    post("sagemaker-invocations-not-json", "/invocations", b"not json", endpoint="sagemaker"),
    post("sagemaker-invocations-bad-json", "/invocations", b"{bad", endpoint="sagemaker"),
    post("sagemaker-invocations-wrong-dtype", "/invocations", add_sub(dtype="INT32", in0=[1, 2, 3, 4]),
         endpoint="sagemaker"),
    get("sagemaker-invocations-get", "/invocations", endpoint="sagemaker"),
    get("sagemaker-models-empty", "/models", endpoint="sagemaker"),
    post("sagemaker-load", "/models", {"model_name": "mme1", "url": "{mme}"}, endpoint="sagemaker",
         headers={"X-Amzn-SageMaker-Target-Model": "mme1.tar.gz"}),
    get("sagemaker-models-listed", "/models", endpoint="sagemaker"),
    get("sagemaker-model-described", "/models/mme1", endpoint="sagemaker"),
    post("sagemaker-invoke", "/models/mme1/invoke", add_sub(), endpoint="sagemaker",
         headers={"X-Amzn-SageMaker-Target-Model": "mme1.tar.gz"}),
    post("sagemaker-invoke-bad-json", "/models/mme1/invoke", b"{bad", endpoint="sagemaker"),
    post("sagemaker-invoke-wrong-dtype", "/models/mme1/invoke", add_sub(dtype="INT32", in0=[1, 2, 3, 4]),
         endpoint="sagemaker"),
    post("sagemaker-invocations-response-stream", "/invocations-response-stream", add_sub(), endpoint="sagemaker"),
    post("sagemaker-load-again", "/models", {"model_name": "mme1", "url": "{mme}"}, endpoint="sagemaker"),
    post("sagemaker-load-missing-url", "/models", {"model_name": "mme2", "url": "/no/such/folder"},
         endpoint="sagemaker"),
    get("sagemaker-model-unknown", "/models/nope", endpoint="sagemaker"),
    post("sagemaker-invoke-unknown", "/models/nope/invoke", add_sub(), endpoint="sagemaker"),
    post("sagemaker-unload-unknown", "/models/nope", b"", endpoint="sagemaker", method="DELETE"),
    get("sagemaker-unknown-route", "/nothing", endpoint="sagemaker"),
    # ---- Vertex AI ------------------------------------------------------------------------------
    get("vertex-health", "/health", endpoint="vertex"),
    post("vertex-predict", "/predict", add_sub(), endpoint="vertex"),
    post("vertex-predict-binary", "/predict", BIN, endpoint="vertex", headers=VERTEX_BINARY),
    post("vertex-predict-bad-json", "/predict", b"{oops", endpoint="vertex"),
    post("vertex-redirect-metadata", "/predict", b"", endpoint="vertex", headers={REDIRECT: "v2/models/add_sub"}),
    post("vertex-redirect-server", "/predict", b"", endpoint="vertex", headers={REDIRECT: "v2"}),
    post("vertex-redirect-stats", "/predict", b"", endpoint="vertex", headers={REDIRECT: "v2/models/stats"},
         compare="status"),
    post("vertex-redirect-infer", "/predict", add_sub(), endpoint="vertex",
         headers={REDIRECT: "v2/models/add_sub/infer"}),
    post("vertex-redirect-index", "/predict", b"", endpoint="vertex", headers={REDIRECT: "v2/repository/index"}),
    post("vertex-redirect-metrics", "/predict", b"", endpoint="vertex", headers={REDIRECT: "metrics"},
         compare="status"),
    post("vertex-redirect-slash-metrics", "/predict", b"", endpoint="vertex", headers={REDIRECT: "/metrics"}),
    post("vertex-redirect-unknown", "/predict", b"", endpoint="vertex", headers={REDIRECT: "v2/nothing"}),
    post("vertex-redirect-health-ready", "/predict", b"", endpoint="vertex", headers={REDIRECT: "v2/health/ready"}),
    post("vertex-redirect-unload", "/predict", b"", endpoint="vertex",
         headers={REDIRECT: "v2/repository/models/string_identity/unload"}),
    get("vertex-predict-get", "/predict", endpoint="vertex"),
    get("vertex-unknown-route", "/nothing", endpoint="vertex"),
    # ---- metrics --------------------------------------------------------------------------------
    get("metrics", "/metrics", endpoint="metrics", compare="status"),
    get("metrics-other-path", "/other", endpoint="metrics", compare="status"),
    # ---- issue 26: batched response senders, async BLS, self-checks, chunk count, names -----------
    post("load-batch-mix", "/v2/repository/models/batch_mix/load", b""),
    stream("grpc-stream-batch-response-senders", [
        batch_mix(1, "return"), batch_mix(2, "send_then_final"), batch_mix(3, "send_after_then_final")]),
    post("load-async-bls-for", "/v2/repository/models/async_bls_for/load", b""),
    post("load-async-sleep", "/v2/repository/models/async_sleep/load", b""),
    stream("grpc-stream-async-bls-warm", [async_bls_for(0, 0.0)]),
    # four executes of 1 to 1.45 s awaiting BLS side by side: all four within 3 s (one after the other:
    # 4.9 s), answered in the order they finish (150 ms apart)
    stream("grpc-stream-async-bls-concurrent", [async_bls_for(i, 1.0 + 0.15 * i) for i in range(4)], timeout=3.0),
    post("load-tensor-arg-order", "/v2/repository/models/tensor_arg_order/load", b""),
    post("infer-tensor-arg-order", "/v2/models/tensor_arg_order/infer", ONE_INPUT_1),
    post("load-metrics-self-check", "/v2/repository/models/metrics_self_check/load", b""),
    post("infer-metrics-self-check", "/v2/models/metrics_self_check/infer", {"inputs": [
        {"name": "METRICS_URL", "datatype": "BYTES", "shape": [1], "data": ["http://127.0.0.1:{metrics_port}/metrics"]}]}),
    post("sagemaker-invocations-chunked-at-max", "/invocations", chunked(_json(add_sub()), 65536),
         endpoint="sagemaker", headers={"Transfer-Encoding": "chunked", "Content-Type": "application/json"}),
    post("load-override-named-otherwise", "/v2/repository/models/modeltest/load",
         {"parameters": {"config": MISNAMED_OVERRIDE, "file:1/model.py": MODEL_PY}}),
    # ---- last: loads that name a serving model (a failed one may take it down) -----------------
    post("load-bad-json", "/v2/repository/models/add_sub/load", b"{nope"),
    post("load-bad-config-override", "/v2/repository/models/add_sub/load", {"parameters": {"config": "{not json"}}),
    post("load-bad-parameter-type", "/v2/repository/models/add_sub/load", {"parameters": {"config": 7}}),
    post("load-reload", "/v2/repository/models/add_sub/load", b""),
    get("model-ready-after-bad-reloads", "/v2/models/add_sub/ready"),
]
