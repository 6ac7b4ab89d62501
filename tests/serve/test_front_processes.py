"""Several front processes in front of one set of model instances (`--front-processes N`): to a
client it is one server, whichever front its connection lands on (issue 32).

Connections are steered to a given front by opening them until the kernel's SO_REUSEPORT hash
puts one there (tests/fronts_helpers.py reads which front holds it from /proc).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import threading
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from conftest import EXAMPLES, TEST_MODELS, KernelProcess, children, free_ports, running
from fronts_helpers import http_connection_to, wait_for_fronts

SCHEDULING = TEST_MODELS / "scheduling"
REPOS = [EXAMPLES, TEST_MODELS / "good", SCHEDULING / "sequences", SCHEDULING / "batching", SCHEDULING / "ensembles"]
A = np.array([1, 2, 3, 4], np.float32)
B = np.array([10, 20, 30, 40], np.float32)


@pytest.fixture(scope="module")
def kernel():
    yield from running(KernelProcess(REPOS, "--front-processes", "2"))


@pytest.fixture(scope="module")
def fronts(kernel):
    pids = wait_for_fronts(kernel.proc.pid, 2)
    assert sorted(pids.values()) == [1, 2], pids
    return pids


@pytest.fixture
def conns(kernel, fronts):
    """A keep-alive HTTP connection to each front: {index: connection}."""
    made = {i: http_connection_to(kernel.http_port, i, fronts) for i in (1, 2)}
    yield made
    for c in made.values():
        c.close()


def call(conn, method: str, path: str, body=None) -> tuple[int, dict]:
    data = json.dumps(body).encode() if body is not None else None
    conn.request(method, path, body=data, headers={"Content-Type": "application/json"} if data else {})
    r = conn.getresponse()
    text = r.read()
    return r.status, (json.loads(text) if text else {})


def add_sub(conn, a=A, b=B, **params) -> dict:
    body = {"inputs": [{"name": "INPUT0", "shape": [4], "datatype": "FP32", "data": a.tolist()},
                       {"name": "INPUT1", "shape": [4], "datatype": "FP32", "data": b.tolist()}]}
    status, doc = call(conn, "POST", "/v2/models/add_sub/infer", body)
    assert status == 200, doc
    return {o["name"]: o["data"] for o in doc["outputs"]}


def model_stats(conn, model: str) -> dict:
    status, doc = call(conn, "GET", f"/v2/models/{model}/stats")
    assert status == 200, doc
    return doc["model_stats"][0]


# ---- one server on every front ---------------------------------------------------------------------


def test_every_front_answers_on_the_same_ports(kernel, conns):
    for conn in conns.values():
        out = add_sub(conn)
        assert out["OUTPUT0"] == (A + B).tolist() and out["OUTPUT1"] == (A - B).tolist()
        assert call(conn, "GET", "/v2/health/ready")[0] == 200
    log = kernel.log()
    assert log.count("Started HTTPService at") == 1 and log.count("Started GRPCInferenceService at") == 1


def test_model_instances_are_not_duplicated(kernel, fronts):
    """One worker per instance whatever the number of fronts: add_sub has one instance."""
    workers = []
    for pid in children(kernel.proc.pid):
        try:
            argv = open(f"/proc/{pid}/cmdline", "rb").read().split(b"\0")
        except OSError:
            continue
        if b"--model-file" in argv:
            workers.append(argv[argv.index(b"--model-file") + 1].decode())
    assert sum(1 for w in workers if w.endswith("model_repo_examples/add_sub/1/model.py")) == 1, workers
    assert sorted(fronts) == sorted(p for p in children(kernel.proc.pid) if p in fronts)


def test_statistics_are_totals_over_every_front(conns):
    before = [model_stats(c, "add_sub")["inference_stats"]["success"]["count"] for c in conns.values()]
    assert before[0] == before[1]  # either front answers for the whole server
    for _ in range(3):
        add_sub(conns[1])
    for _ in range(5):
        add_sub(conns[2])
    for conn in conns.values():
        stats = model_stats(conn, "add_sub")
        assert stats["inference_stats"]["success"]["count"] == before[0] + 8
        assert stats["execution_count"] >= 8 and stats["inference_count"] >= 8


def test_metrics_are_totals_over_every_front(kernel, conns):
    def success() -> float:
        text = urllib.request.urlopen(f"http://localhost:{kernel.metrics_port}/metrics", timeout=10).read().decode()
        line = next(l for l in text.splitlines() if l.startswith('nv_inference_request_success{model="add_sub"'))
        return float(line.split()[-1])

    before = success()
    add_sub(conns[1])
    add_sub(conns[2])
    add_sub(conns[2])
    assert success() == before + 3


def test_a_region_registered_on_one_front_serves_on_the_other(conns):
    from multiprocessing import shared_memory

    shm = shared_memory.SharedMemory(create=True, size=64)
    try:
        shm.buf[:16] = A.tobytes()
        shm.buf[16:32] = B.tobytes()
        key = "/" + shm.name.lstrip("/")
        status, doc = call(conns[1], "POST", "/v2/systemsharedmemory/region/fronts_in/register",
                           {"key": key, "offset": 0, "byte_size": 64})
        assert status == 200, doc
        status, listed = call(conns[2], "GET", "/v2/systemsharedmemory/status")
        assert status == 200 and [r["name"] for r in listed] == ["fronts_in"]
        body = {"inputs": [
            {"name": "INPUT0", "shape": [4], "datatype": "FP32",
             "parameters": {"shared_memory_region": "fronts_in", "shared_memory_byte_size": 16}},
            {"name": "INPUT1", "shape": [4], "datatype": "FP32",
             "parameters": {"shared_memory_region": "fronts_in", "shared_memory_offset": 16,
                            "shared_memory_byte_size": 16}}],
            "outputs": [{"name": "OUTPUT0", "parameters": {"shared_memory_region": "fronts_in",
                                                             "shared_memory_offset": 32, "shared_memory_byte_size": 16}}]}
        status, doc = call(conns[2], "POST", "/v2/models/add_sub/infer", body)
        assert status == 200, doc
        assert np.frombuffer(bytes(shm.buf[32:48]), np.float32).tolist() == (A + B).tolist()
        assert call(conns[2], "POST", "/v2/systemsharedmemory/region/fronts_in/unregister")[0] == 200
        assert call(conns[1], "GET", "/v2/systemsharedmemory/status")[1] == []
        status, doc = call(conns[1], "POST", "/v2/models/add_sub/infer", body)
        assert status == 404 and "fronts_in" in doc["error"]  # as with one front: the region is gone everywhere
    finally:
        shm.close()
        shm.unlink()


def test_log_and_trace_settings_change_on_every_front(conns):
    status, doc = call(conns[1], "POST", "/v2/logging", {"log_verbose_level": 1})
    assert status == 200 and doc["log_verbose_level"] == 1
    assert call(conns[2], "GET", "/v2/logging")[1]["log_verbose_level"] == 1
    assert call(conns[2], "POST", "/v2/logging", {"log_verbose_level": 0})[0] == 200
    assert call(conns[1], "GET", "/v2/logging")[1]["log_verbose_level"] == 0
    status, doc = call(conns[2], "POST", "/v2/models/add_sub/trace/setting", {"trace_rate": "7"})
    assert status == 200 and doc["trace_rate"] == "7"
    assert call(conns[1], "GET", "/v2/models/add_sub/trace/setting")[1]["trace_rate"] == "7"
    call(conns[1], "POST", "/v2/models/add_sub/trace/setting", {"trace_rate": None})


def test_a_sequence_split_over_fronts_keeps_one_state(conns):
    """A client that reconnects: the requests of one sequence land on different fronts, in order."""
    def step(conn, value, start=False, end=False):
        body = {"parameters": {"sequence_id": 4242, "sequence_start": start, "sequence_end": end},
                "inputs": [{"name": "INPUT", "shape": [1, 1], "datatype": "INT32", "data": [value]}]}
        status, doc = call(conn, "POST", "/v2/models/seq_direct/infer", body)
        assert status == 200, doc
        return {o["name"]: o["data"][0] for o in doc["outputs"]}

    sums = [step(conns[1], 1, start=True)["OUTPUT"], step(conns[2], 2)["OUTPUT"], step(conns[1], 3)["OUTPUT"],
            step(conns[2], 4, end=True)["OUTPUT"]]
    assert sums == [1, 3, 6, 10]


def test_ensembles_bls_and_streams_work_through_every_front(kernel, conns):
    import tritonclient.grpc as grpcclient

    for conn in conns.values():
        body = {"inputs": [{"name": "X", "shape": [4], "datatype": "FP32", "data": A.tolist()},
                           {"name": "Y", "shape": [4], "datatype": "FP32", "data": B.tolist()}]}
        status, doc = call(conn, "POST", "/v2/models/ens_pipeline/infer", body)
        assert status == 200, doc
        assert {o["name"]: o["data"] for o in doc["outputs"]}["Z"] == ((A + B) * (A - B)).tolist()
        body = {"inputs": [{"name": "INPUT0", "shape": [4], "datatype": "FP32", "data": A.tolist()},
                           {"name": "INPUT1", "shape": [4], "datatype": "FP32", "data": B.tolist()}]}
        status, doc = call(conn, "POST", "/v2/models/bls_add_sub/infer", body)
        assert status == 200, doc
    # a decoupled stream over gRPC, from several clients (their connections land on both fronts)
    for _ in range(4):
        got = []
        done = threading.Event()
        client = grpcclient.InferenceServerClient(kernel.grpc_url)

        def on_result(result, error):
            if error is not None:
                got.append(error)
                done.set()
                return
            if result.get_response().parameters["triton_final_response"].bool_param:
                done.set()
            elif result.as_numpy("OUT") is not None:
                got.append(int(result.as_numpy("OUT")[0]))

        client.start_stream(on_result)
        t = grpcclient.InferInput("IN", [3], "INT32")
        t.set_data_from_numpy(np.array([7, 8, 9], np.int32))
        client.async_stream_infer("repeat_int32", [t], enable_empty_final_response=True)
        assert done.wait(30)
        client.stop_stream()
        client.close()
        assert got == [7, 8, 9]


def test_a_client_that_goes_away_cancels_its_request_on_any_front(kernel, fronts):
    from fronts_helpers import front_of

    for index in (1, 2):
        for _ in range(200):
            sock = socket.create_connection(("127.0.0.1", kernel.http_port))
            if front_of(sock.getsockname()[1], kernel.http_port, fronts) == index:
                break
            sock.close()
        tag = f"front{index}-{time.monotonic_ns()}"
        body = json.dumps({"inputs": [{"name": "TAG", "shape": [1], "datatype": "BYTES", "data": [tag]}]}).encode()
        sock.sendall(b"POST /v2/models/cancel_watcher/infer HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
        time.sleep(0.5)
        sock.close()
        assert kernel.wait_for_log(f"cancel_watcher saw cancellation of {tag}", timeout=15), kernel.log()[-3000:]


def test_the_openai_api_streams_from_every_front(tmp_path):
    from openai import OpenAI
    from conftest import free_port

    port = free_port()
    k = KernelProcess([EXAMPLES], "--front-processes", "2", "--openai-port", str(port))
    try:
        k.wait_ready()
        client = OpenAI(base_url=f"http://localhost:{port}/v1", api_key="unused")
        texts = set()
        for _ in range(6):  # new connections: they land on both fronts
            stream = client.chat.completions.create(model="tiny_lm", messages=[{"role": "user", "content": "hi"}],
                                                    max_tokens=12, seed=3, stream=True)
            texts.add("".join(c.choices[0].delta.content or "" for c in stream if c.choices))
        assert len(texts) == 1 and len(next(iter(texts)).split()) > 3  # the same words, whichever front
    finally:
        k.stop()


def test_many_clients_on_both_fronts_get_their_own_answers(kernel, fronts):
    import tritonclient.http as httpclient

    def one(i: int) -> bool:
        client = httpclient.InferenceServerClient(kernel.url)
        try:
            a = np.full(4, i, np.float32)
            x = httpclient.InferInput("INPUT0", [4], "FP32")
            x.set_data_from_numpy(a)
            y = httpclient.InferInput("INPUT1", [4], "FP32")
            y.set_data_from_numpy(B)
            r = client.infer("add_sub", [x, y])
            return r.as_numpy("OUTPUT0").tolist() == (a + B).tolist()
        finally:
            client.close()

    with ThreadPoolExecutor(16) as pool:
        assert all(pool.map(one, range(64)))


@pytest.fixture(scope="module")
def three(tmp_path_factory):
    yield from running(KernelProcess([SCHEDULING / "batching"], "--front-processes", "3"))


def test_a_batch_forms_from_requests_of_different_fronts(three):
    """While the instance runs one batch, requests that came through two other fronts wait for it
    together and run as one batch (the worker merges what waits for it), as one queue would."""
    pids = wait_for_fronts(three.proc.pid, 3)
    conns = {i: http_connection_to(three.http_port, i, pids) for i in (1, 2, 3)}
    body = {"inputs": [{"name": "INPUT0", "shape": [1, 4], "datatype": "FP32", "data": A.tolist()},
                       {"name": "INPUT1", "shape": [1, 4], "datatype": "FP32", "data": B.tolist()}]}
    batches: dict[int, int] = {}

    def send(i: int) -> None:
        status, doc = call(conns[i], "POST", "/v2/models/dyn_batch/infer", body)
        assert status == 200, doc
        batches[i] = {o["name"]: o["data"] for o in doc["outputs"]}["BATCH"][0]

    for attempt in range(3):  # a loaded machine can stretch the 100 ms execution's timing
        first = threading.Thread(target=send, args=(1,))
        first.start()
        time.sleep(0.03)  # front 1's batch is executing (100 ms)
        others = [threading.Thread(target=send, args=(i,)) for i in (2, 3)]
        for t in others:
            t.start()
        for t in (first, *others):
            t.join(30)
        if batches.get(2) == 2 and batches.get(3) == 2:
            break
    assert batches[1] == 1 and batches[2] == 2 and batches[3] == 2, batches
    for c in conns.values():
        c.close()


def test_requests_on_different_fronts_within_the_queue_delay_run_as_one_batch(three):
    """dyn_delay holds requests up to 600 ms for a batch of 4. Two requests 150 ms apart through two
    fronts: one queue would run them together when the first one's delay is up, and so do several
    fronts (the worker asks every front for what it queued before it runs a batch that is not full).
    Before, each front held its own for the delay: two batches of 1, 150 ms apart."""
    pids = wait_for_fronts(three.proc.pid, 3)
    conns = {i: http_connection_to(three.http_port, i, pids) for i in (1, 2)}
    body = {"inputs": [{"name": "INPUT0", "shape": [1, 4], "datatype": "FP32", "data": A.tolist()},
                       {"name": "INPUT1", "shape": [1, 4], "datatype": "FP32", "data": B.tolist()}]}
    seen: dict[int, tuple[int, float]] = {}

    def send(i: int) -> None:
        start = time.monotonic()
        status, doc = call(conns[i], "POST", "/v2/models/dyn_delay/infer", body)
        assert status == 200, doc
        seen[i] = ({o["name"]: o["data"] for o in doc["outputs"]}["BATCH"][0], time.monotonic() - start)

    first = threading.Thread(target=send, args=(1,))
    first.start()
    time.sleep(0.15)
    second = threading.Thread(target=send, args=(2,))
    second.start()
    for t in (first, second):
        t.join(30)
    assert seen[1][0] == 2 and seen[2][0] == 2, seen
    assert seen[1][1] >= 0.55  # the delay is still honoured: the batch ran when the first had waited it out
    for c in conns.values():
        c.close()


def test_a_front_that_never_answers_holds_another_fronts_batch_no_longer_than_the_window():
    """The worker asks every front for what it queued before a batch runs; a front that is stopped
    (SIGSTOP: it never answers) must not hold front 1's request past its delay and the 2 ms bound."""
    k = KernelProcess([SCHEDULING / "batching"], "--front-processes", "2")
    try:
        k.wait_ready()
        pids = wait_for_fronts(k.proc.pid, 2)
        conn = http_connection_to(k.http_port, 1, pids)
        body = {"inputs": [{"name": "INPUT0", "shape": [1, 4], "datatype": "FP32", "data": A.tolist()},
                           {"name": "INPUT1", "shape": [1, 4], "datatype": "FP32", "data": B.tolist()}]}
        other = next(pid for pid, index in pids.items() if index == 2)
        os.kill(other, signal.SIGSTOP)
        try:
            start = time.monotonic()
            status, doc = call(conn, "POST", "/v2/models/dyn_delay/infer", body)
            took = time.monotonic() - start
        finally:
            os.kill(other, signal.SIGCONT)
        assert status == 200, doc
        assert {o["name"]: o["data"] for o in doc["outputs"]}["BATCH"][0] == 1
        assert 0.55 <= took < 1.1, took  # the 600 ms delay, not a wait for the stopped front
        conn.close()
    finally:
        k.stop()


def test_every_front_writes_its_traces_into_the_one_trace_file(tmp_path):
    trace_file = tmp_path / "trace.json"
    k = KernelProcess([EXAMPLES], "--front-processes", "2", "--trace-config", f"triton,file={trace_file}",
                      "--trace-config", "level=TIMESTAMPS", "--trace-config", "rate=1")
    try:
        k.wait_ready()
        pids = wait_for_fronts(k.proc.pid, 2)
        for i in (1, 2):
            conn = http_connection_to(k.http_port, i, pids)
            for _ in range(3):
                add_sub(conn)
            conn.close()
    finally:
        k.stop()
    traces = json.loads(trace_file.read_text())  # one valid JSON array, closed at shutdown
    ids = {t["id"] for t in traces}
    assert len(ids) == 6 and all(t.get("model_name") == "add_sub" for t in traces if "model_name" in t)


def test_sagemaker_models_routes_are_refused_and_invocations_served_by_every_front():
    """Which models SageMaker's /models routes loaded is kept by the front that loaded them: with
    several fronts a load through one and an invoke through the other gave 404, a second load 200
    (tritonserver: 409). Without SAGEMAKER_MULTI_MODEL=true (which runs one front) those routes are
    refused on every front, naming the way to serve them; /invocations is served by every front."""
    (port,) = free_ports(1)
    k = KernelProcess([EXAMPLES], "--front-processes", "2", "--allow-sagemaker=true", f"--sagemaker-port={port}",
                      env={"SAGEMAKER_TRITON_DEFAULT_MODEL_NAME": "add_sub"})
    try:
        k.wait_ready()
        pids = wait_for_fronts(k.proc.pid, 2)
        body = {"inputs": [{"name": "INPUT0", "shape": [4], "datatype": "FP32", "data": A.tolist()},
                           {"name": "INPUT1", "shape": [4], "datatype": "FP32", "data": B.tolist()}]}
        for i in (1, 2):
            conn = http_connection_to(port, i, pids)
            status, doc = call(conn, "POST", "/models", {"model_name": "m", "url": "/nowhere"})
            assert status == 400 and "SAGEMAKER_MULTI_MODEL=true" in doc["error"], doc
            status, doc = call(conn, "GET", "/models")
            assert status == 400 and "--front-processes" in doc["error"], doc
            status, doc = call(conn, "POST", "/invocations", body)
            assert status == 200 and doc["outputs"][0]["data"] == (A + B).tolist(), doc
            conn.close()
    finally:
        k.stop()
