"""The trace extension (GET/POST /v2[/models/<m>]/trace/setting, gRPC TraceSetting), --trace-config
and the old --trace-* flags, and the JSON trace files in tritonserver's layout."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from conftest import EXAMPLES, TEST_MODELS, KernelProcess, running

HTTP_STAMPS = [
    "HTTP_RECV_START", "HTTP_RECV_END", "REQUEST_START", "QUEUE_START", "COMPUTE_START", "COMPUTE_INPUT_END",
    "COMPUTE_OUTPUT_START", "COMPUTE_END", "REQUEST_END", "INFER_RESPONSE_COMPLETE", "HTTP_SEND_START",
    "HTTP_SEND_END",
]
GRPC_STAMPS = [
    "GRPC_WAITREAD_START", "GRPC_WAITREAD_END", "REQUEST_START", "QUEUE_START", "COMPUTE_START",
    "COMPUTE_INPUT_END", "COMPUTE_OUTPUT_START", "COMPUTE_END", "REQUEST_END", "INFER_RESPONSE_COMPLETE",
    "GRPC_SEND_START", "GRPC_SEND_END",
]
ENSEMBLES = TEST_MODELS / "scheduling" / "ensembles"


def make_repo(base: Path) -> Path:
    repo = base / "repo"
    repo.mkdir()
    shutil.copytree(EXAMPLES / "add_sub", repo / "add_sub")
    shutil.copytree(TEST_MODELS / "good" / "logger_model", repo / "logger_model")
    for name in ("ens_pipeline", "ens_addsub", "ens_mul"):
        shutil.copytree(ENSEMBLES / name, repo / name)
    return repo


class Traces:
    """The indexed trace files (<trace_file>.<n>) a server writes with log_frequency set."""

    def __init__(self, trace_file: Path):
        self.trace_file = trace_file
        self.seen = 0

    def files(self) -> list[Path]:
        found = [p for p in self.trace_file.parent.glob(self.trace_file.name + ".*") if p.suffix[1:].isdigit()]
        return sorted(found, key=lambda p: int(p.suffix[1:]))

    def new(self, count: int, timeout: float = 10.0, settle: float = 0.3) -> list[list[dict]]:
        """Wait for `count` new files (and make sure no more than that appear); return their records."""
        deadline = time.time() + timeout
        while len(self.files()) < self.seen + count and time.time() < deadline:
            time.sleep(0.02)
        time.sleep(settle)
        files = self.files()
        assert len(files) == self.seen + count, f"expected {count} new trace files, found {len(files) - self.seen}"
        out = [json.loads(p.read_text()) for p in files[self.seen:]]
        self.seen = len(files)
        return out


@pytest.fixture(scope="module")
def kernel(tmp_path_factory):
    base = tmp_path_factory.mktemp("trace-api")
    trace_file = base / "trace.json"
    # Tracing starts off (level OFF); tests turn it on through the API. One file per trace.
    k = KernelProcess(
        [make_repo(base)], "--trace-config", f"triton,file={trace_file}", "--trace-config", "rate=1",
        "--trace-config", "triton,log-frequency=1",
    )
    k.traces = Traces(trace_file)
    yield from running(k)


@pytest.fixture
def http(kernel):
    with httpclient.InferenceServerClient(kernel.url) as c:
        yield c
        # Back to the start-up settings for the next test.
        unset = {"trace_level": None, "trace_rate": None, "trace_count": None, "log_frequency": None}
        for model in ("add_sub", "logger_model", "ens_pipeline"):
            c.update_trace_settings(model, unset)
        c.update_trace_settings(settings=unset)
    kernel.traces.seen = len(kernel.traces.files())


@pytest.fixture
def grpc_client(kernel):
    with grpcclient.InferenceServerClient(kernel.grpc_url) as c:
        yield c


def add_sub(client, module, request_id: str = "", value: float = 1.0):
    inputs = []
    for name in ("INPUT0", "INPUT1"):
        t = module.InferInput(name, [4], "FP32")
        t.set_data_from_numpy(np.array([value, 2, 3, 4.5], np.float32))
        inputs.append(t)
    return client.infer("add_sub", inputs, request_id=request_id)


def logger_model(client):
    t = httpclient.InferInput("INPUT", [1], "INT32")
    t.set_data_from_numpy(np.array([1], np.int32))
    client.infer("logger_model", [t])


def split(records: list[dict]) -> tuple[list[dict], dict[int, dict[str, int]]]:
    """(model records, {trace id: {timestamp name: ns}})."""
    models = [r for r in records if "model_name" in r]
    stamps: dict[int, dict[str, int]] = {}
    for r in records:
        for ts in r.get("timestamps", ()):
            stamps.setdefault(r["id"], {})[ts["name"]] = ts["ns"]
    return models, stamps


def test_trace_is_an_advertised_extension(http):
    assert "trace" in http.get_server_metadata()["extensions"]


def test_start_up_settings(http, grpc_client, kernel):
    expected = {"trace_level": ["OFF"], "trace_rate": "1", "trace_count": "-1", "log_frequency": "1",
                "trace_file": str(kernel.traces.trace_file), "trace_mode": "triton"}
    assert http.get_trace_settings() == expected
    assert http.get_trace_settings("add_sub") == expected
    settings = grpc_client.get_trace_settings(as_json=True)["settings"]
    assert {k: v["value"] for k, v in settings.items()} == {
        k: v if isinstance(v, list) else [v] for k, v in expected.items()
    }


def test_http_request_trace_records(kernel, http):
    http.update_trace_settings(settings={"trace_level": ["TIMESTAMPS"]})
    add_sub(http, httpclient, request_id="req-7")
    [records] = kernel.traces.new(1)
    models, stamps = split(records)
    assert len(models) == 1
    info = models[0]
    assert info["model_name"] == "add_sub" and info["model_version"] == 1 and info["request_id"] == "req-7"
    assert set(records[0]) == {"id", "timestamps"}  # every record is {"id", ...}
    ns = stamps[info["id"]]
    assert sorted(ns) == sorted(HTTP_STAMPS)
    order = ["HTTP_RECV_START", "HTTP_RECV_END", "REQUEST_START", "QUEUE_START", "COMPUTE_START",
             "COMPUTE_INPUT_END", "COMPUTE_OUTPUT_START", "COMPUTE_END", "HTTP_SEND_START", "HTTP_SEND_END"]
    assert [ns[n] for n in order] == sorted(ns[n] for n in order)
    assert ns["INFER_RESPONSE_COMPLETE"] <= ns["HTTP_SEND_START"]


def test_grpc_request_trace_records(kernel, http, grpc_client):
    http.update_trace_settings(settings={"trace_level": ["TIMESTAMPS"]})
    add_sub(grpc_client, grpcclient)
    [records] = kernel.traces.new(1)
    models, stamps = split(records)
    assert [m["model_name"] for m in models] == ["add_sub"] and "request_id" not in models[0]
    ns = stamps[models[0]["id"]]
    assert sorted(ns) == sorted(GRPC_STAMPS)
    order = ["GRPC_WAITREAD_START", "GRPC_WAITREAD_END", "REQUEST_START", "QUEUE_START", "COMPUTE_START",
             "COMPUTE_END", "GRPC_SEND_START", "GRPC_SEND_END"]
    assert [ns[n] for n in order] == sorted(ns[n] for n in order)


def test_trace_ids_are_distinct(kernel, http):
    http.update_trace_settings(settings={"trace_level": ["TIMESTAMPS"]})
    add_sub(http, httpclient)
    add_sub(http, httpclient)
    first, second = kernel.traces.new(2)
    assert {r["id"] for r in first}.isdisjoint({r["id"] for r in second})


def test_trace_rate_samples_every_nth_request(kernel, http):
    settings = http.update_trace_settings(settings={"trace_level": ["TIMESTAMPS"], "trace_rate": "3"})
    assert settings["trace_rate"] == "3"
    for _ in range(7):
        add_sub(http, httpclient)
    assert len(kernel.traces.new(2)) == 2  # the 3rd and the 6th


def test_trace_count_stops_sampling(kernel, http, grpc_client):
    http.update_trace_settings(settings={"trace_level": ["TIMESTAMPS"], "trace_count": "2"})
    for _ in range(4):
        add_sub(http, httpclient)
    assert len(kernel.traces.new(2)) == 2
    assert http.get_trace_settings()["trace_count"] == "0"  # the remaining count
    reply = grpc_client.update_trace_settings(settings={"trace_count": "1"}, as_json=True)
    assert reply["settings"]["trace_count"]["value"] == ["1"]
    add_sub(grpc_client, grpcclient)
    add_sub(grpc_client, grpcclient)
    assert len(kernel.traces.new(1)) == 1


def test_per_model_settings(kernel, http, grpc_client):
    # Global tracing stays off; only add_sub is traced.
    settings = http.update_trace_settings("add_sub", {"trace_level": ["TIMESTAMPS"]})
    assert settings["trace_level"] == ["TIMESTAMPS"] and settings["trace_rate"] == "1"
    assert http.get_trace_settings()["trace_level"] == ["OFF"]
    logger_model(http)
    add_sub(http, httpclient)
    [records] = kernel.traces.new(1)
    assert [r["model_name"] for r in records if "model_name" in r] == ["add_sub"]

    # Fields the model did not set follow the global setting; its own stay.
    reply = grpc_client.update_trace_settings("add_sub", {"trace_rate": "5"}, as_json=True)
    assert reply["settings"]["trace_rate"]["value"] == ["5"]
    http.update_trace_settings(settings={"trace_rate": "2", "trace_count": "9"})
    settings = http.get_trace_settings("add_sub")
    assert settings["trace_rate"] == "5" and settings["trace_count"] == "9"
    assert http.get_trace_settings("logger_model")["trace_rate"] == "2"

    # Clearing every field of the model hands it back to the global setting.
    http.update_trace_settings("add_sub", {"trace_level": None, "trace_rate": None})
    assert http.get_trace_settings("add_sub") == http.get_trace_settings()


def test_model_level_off_while_global_traces(kernel, http, grpc_client):
    http.update_trace_settings(settings={"trace_level": ["TIMESTAMPS"]})
    grpc_client.update_trace_settings("logger_model", {"trace_level": ["OFF"]})
    logger_model(http)
    add_sub(http, httpclient)
    [records] = kernel.traces.new(1)
    assert [r["model_name"] for r in records if "model_name" in r] == ["add_sub"]


def test_ensemble_steps_are_child_traces(kernel, http):
    http.update_trace_settings("ens_pipeline", {"trace_level": ["TIMESTAMPS"]})
    inputs = []
    for name in ("X", "Y"):
        t = httpclient.InferInput(name, [4], "FP32")
        t.set_data_from_numpy(np.arange(4, dtype=np.float32))
        inputs.append(t)
    http.infer("ens_pipeline", inputs)
    [records] = kernel.traces.new(1)
    models, stamps = split(records)
    parent = next(m for m in models if m["model_name"] == "ens_pipeline")
    children = [m for m in models if m is not parent]
    assert sorted(m["model_name"] for m in children) == ["ens_addsub", "ens_mul"]
    assert all(m["parent_id"] == parent["id"] for m in children)
    assert "parent_id" not in parent
    for child in children:
        assert {"REQUEST_START", "COMPUTE_START", "COMPUTE_END"} <= set(stamps[child["id"]])


def test_tensors_level(kernel, http):
    http.update_trace_settings(settings={"trace_level": ["TENSORS"]})
    add_sub(http, httpclient, value=1.0)
    [records] = kernel.traces.new(1)
    assert all("activity" in r for r in records)  # TENSORS alone records no timestamps
    by = {(r["activity"], r["tensor"]["name"]): r["tensor"] for r in records}
    assert by[("TENSOR_QUEUE_INPUT", "INPUT0")] == {"name": "INPUT0", "data": "1,2,3,4.5", "shape": "4",
                                                    "dtype": "FP32"}
    assert by[("TENSOR_BACKEND_OUTPUT", "OUTPUT0")]["data"] == "2,4,6,9"
    assert by[("TENSOR_BACKEND_OUTPUT", "OUTPUT1")]["data"] == "0,0,0,0"


def test_level_off_traces_nothing(kernel, http):
    http.update_trace_settings(settings={"trace_level": ["OFF"]})
    add_sub(http, httpclient)
    assert kernel.traces.new(0) == []


# ---- bad values -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "settings, status, message",
    [
        ({"trace_file": "/tmp/x"}, "501", "trace file location can not be updated through network protocol"),
        ({"trace_rate": "abc"}, "400", "Unable to parse 'trace_rate', got: abc"),
        ({"trace_rate": "99999999999"}, "400",
         "Unable to parse 'trace_rate', value is out of range [ 0, 4294967295 ], got: 99999999999"),
        ({"trace_rate": 5}, "400", "attempt to access JSON non-string as string"),
        ({"trace_rate": "0", "trace_level": ["TIMESTAMPS"]}, "400",
         "Attempting to set invalid trace setting :sample rate must be non-zero"),
        ({"trace_count": "-2"}, "400", "Unable to parse 'trace_count'. Expecting value >= -1, got:-2"),
        ({"trace_count": "x"}, "400", "Unable to parse 'trace_count', got: x"),
        ({"log_frequency": "x"}, "400", "Unable to parse 'log_frequency', got: x"),
        ({"trace_level": ["OFF", "TIMESTAMPS"]}, "400", "Expect only one trace level 'OFF' is specified"),
        ({"trace_level": "TIMESTAMPS"}, "400", "attempt to access JSON non-array as array"),
    ],
)
def test_bad_http_values_are_refused(http, settings, status, message):
    with pytest.raises(InferenceServerException) as info:
        http.update_trace_settings(settings=settings)
    assert (info.value.status(), info.value.message()) == (status, message)
    assert http.get_trace_settings()["trace_rate"] == "1"  # nothing changed, still serving


@pytest.mark.parametrize(
    "settings, code, message",
    [
        ({"trace_file": "x"}, "StatusCode.UNIMPLEMENTED",
         "trace file location can not be updated through network protocol"),
        ({"trace_rate": ["1", "2"]}, "StatusCode.INVALID_ARGUMENT", "expect only 1 value for 'trace_rate'"),
        ({"trace_count": "-3"}, "StatusCode.INVALID_ARGUMENT",
         "Unable to parse 'trace_count'. Expecting value >= -1, got: -3"),
        ({"log_frequency": "many"}, "StatusCode.INVALID_ARGUMENT", "Unable to parse 'log_frequency', got: many"),
    ],
)
def test_bad_grpc_values_are_refused(grpc_client, settings, code, message):
    with pytest.raises(InferenceServerException) as info:
        grpc_client.update_trace_settings(settings=settings)
    assert (info.value.status(), info.value.message()) == (code, message)


def test_unknown_model(http, grpc_client):
    with pytest.raises(InferenceServerException) as info:
        http.get_trace_settings("nope")
    assert (info.value.status(), info.value.message()) == ("400", "Request for unknown model : nope")
    with pytest.raises(InferenceServerException) as info:
        grpc_client.update_trace_settings("nope", {"trace_rate": "2"})
    assert info.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert info.value.message() == "Request for unknown model : nope"


# ---- start-up flags ------------------------------------------------------------------------------


def test_defaults_without_trace_flags(start_kernel):
    k = start_kernel([EXAMPLES]).wait_ready()
    client = httpclient.InferenceServerClient(k.url)
    try:
        assert client.get_trace_settings() == {
            "trace_level": ["OFF"], "trace_rate": "1000", "trace_count": "-1", "log_frequency": "0",
            "trace_file": "", "trace_mode": "triton",
        }
        with pytest.raises(InferenceServerException) as info:
            client.update_trace_settings(settings={"trace_level": ["TIMESTAMPS"]})
        assert info.value.message() == "Attempting to set invalid trace setting :trace file name is not given"
        assert add_sub(client, httpclient).as_numpy("OUTPUT0").tolist() == [2, 4, 6, 9]
    finally:
        client.close()


def test_old_trace_flags_and_count_exhaustion(start_kernel, tmp_path):
    trace_file = tmp_path / "old.json"
    k = start_kernel(
        [EXAMPLES], "--trace-file", str(trace_file), "--trace-level", "TIMESTAMPS", "--trace-rate", "2",
        "--trace-count", "2",
    ).wait_ready()
    client = httpclient.InferenceServerClient(k.url)
    try:
        assert client.get_trace_settings() == {
            "trace_level": ["TIMESTAMPS"], "trace_rate": "2", "trace_count": "2", "log_frequency": "0",
            "trace_file": str(trace_file), "trace_mode": "triton",
        }
        for _ in range(6):
            add_sub(client, httpclient)
        # With the count used up, the collected traces go to <trace_file>.0 at once.
        [records] = Traces(trace_file).new(1)
        models, _ = split(records)
        assert len(models) == 2
        assert client.get_trace_settings()["trace_count"] == "0"
    finally:
        client.close()


def test_trace_file_is_written_at_shutdown(start_kernel, tmp_path):
    trace_file = tmp_path / "all.json"
    k = start_kernel(
        [EXAMPLES], "--trace-config", f"triton,file={trace_file}", "--trace-config", "level=TIMESTAMPS",
        "--trace-config", "rate=1",
    ).wait_ready()
    client = httpclient.InferenceServerClient(k.url)
    try:
        add_sub(client, httpclient, request_id="a")
        add_sub(client, httpclient, request_id="b")
    finally:
        client.close()
    assert k.stop() == 0
    models, stamps = split(json.loads(trace_file.read_text()))
    assert [m["request_id"] for m in models] == ["a", "b"]
    assert all(sorted(stamps[m["id"]]) == sorted(HTTP_STAMPS) for m in models)


@pytest.mark.parametrize(
    "flags, message",
    [
        (["--trace-config", "level=LOUD"], "invalid value for trace level option: LOUD"),
        (["--trace-config", "jaeger,url=x"], "invalid value for trace mode option: jaeger"),
        (["--trace-config", "rate"], "--trace-config option format is '<trace mode>,<setting>=<value>'. Got rate"),
        (["--trace-rate", "often"], "Invalid option value. Got often"),
    ],
)
def test_bad_trace_flags_stop_the_server(start_kernel, flags, message):
    k = start_kernel([EXAMPLES], *flags)
    assert k.wait_exit(60) != 0
    assert message in k.log()
