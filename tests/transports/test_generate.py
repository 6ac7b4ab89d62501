"""The HTTP generate extension: POST /v2/models/<m>[/versions/<v>]/generate and /generate_stream."""

from __future__ import annotations

import json
import socket
import time

import httpx
import pytest

from conftest import EXAMPLES, TEST_MODELS, serving

CLOUD = TEST_MODELS / "cloud"


@pytest.fixture(scope="module")
def kernel():
    yield from serving([EXAMPLES, CLOUD])


@pytest.fixture
def client(kernel):
    with httpx.Client(base_url=f"http://{kernel.url}", timeout=30) as c:
        yield c


def sse_events(text: str) -> list[dict]:
    events = []
    for chunk in text.split("\n\n"):
        if chunk.strip():
            assert chunk.startswith("data: "), chunk
            events.append(json.loads(chunk[len("data: "):]))
    return events


def test_generate_maps_keys_to_inputs_and_parameters(client):
    r = client.post(
        "/v2/models/text_echo/generate",
        json={"id": "42", "text_input": "hello", "max_tokens": 7, "parameters": {"stream": False, "tag": "x"}},
    )
    assert r.status_code == 200, r.text
    assert r.headers["content-type"] == "application/json"
    body = r.json()
    assert body["id"] == "42"
    assert body["model_name"] == "text_echo"
    assert body["model_version"] == "1"
    assert body["text_output"] == "HELLO"
    assert body["length"] == 5  # one element: a scalar
    assert body["scores"] == [0.5, 1.5, 2.5]
    # keys that are not inputs reach the model as request parameters (echoed back by text_echo)
    assert body["max_tokens"] == 7 and body["stream"] is False and body["tag"] == "x"
    assert list(body) == sorted(body)


def test_generate_with_version_and_without_id(client):
    r = client.post("/v2/models/text_echo/versions/1/generate", json={"text_input": "abc"})
    assert r.status_code == 200, r.text
    assert "id" not in r.json()
    assert r.json()["text_output"] == "ABC"
    r = client.post("/v2/models/text_echo/versions/9/generate", json={"text_input": "abc"})
    assert r.status_code == 404 and "version 9" in r.json()["error"]


def test_generate_fits_arrays_to_batched_and_fixed_shapes(client):
    r = client.post("/v2/models/string_identity/generate", json={"INPUT0": ["a", "b", "c"]})
    assert r.status_code == 200, r.text
    assert r.json()["OUTPUT0"] == ["a", "b", "c"]
    r = client.post("/v2/models/add_sub/generate", json={"INPUT0": [1, 2, 3, 4], "parameters": {"INPUT1": [1, 1, 1, 1]}})
    assert r.status_code == 200, r.text
    assert r.json()["OUTPUT0"] == [2, 3, 4, 5] and r.json()["OUTPUT1"] == [0, 1, 2, 3]
    r = client.post("/v2/models/add_sub/generate", json={"INPUT0": [1, 2, 3], "INPUT1": [1, 1, 1]})
    assert r.status_code == 400 and "can not convert input 'INPUT0'" in r.json()["error"]


@pytest.mark.parametrize(
    "body, status, message",
    [
        (b"{not json", 400, "failed to parse the request JSON"),
        (b"[1, 2]", 400, "must be a JSON object"),
        (b'{"text_input": "a", "parameters": [1]}', 400, "Expected JSON object for keyword: 'parameters'"),
        (b'{"text_input": "a", "extra": {"x": 1}}', 400, "parameter 'extra' has invalid type"),
        (b'{"text_input": "a", "id": 5}', 400, "Unable to parse 'id'"),
        (b'{"text_input": 5}', 400, "text_input"),
        (b"{}", 400, "missing required input(s) ['text_input']"),
        (b'{"text_input": "error"}', 500, "text_echo was asked to fail"),
    ],
)
def test_generate_errors_are_json_with_a_status(client, body, status, message):
    r = client.post("/v2/models/text_echo/generate", content=body)
    assert r.status_code == status, r.text
    assert r.headers["content-type"] == "application/json"
    assert message in r.json()["error"]
    # the endpoint keeps serving
    assert client.post("/v2/models/text_echo/generate", json={"text_input": "ok"}).json()["text_output"] == "OK"


def test_generate_unknown_model_and_method(client):
    r = client.post("/v2/models/no_such_model/generate", json={"text_input": "a"})
    assert r.status_code == 404 and "unknown model" in r.json()["error"]
    assert client.get("/v2/models/text_echo/generate").status_code == 405
    r = client.post("/v2/models/no_such_model/generate_stream", json={"text_input": "a"})
    assert r.status_code == 404 and r.headers["content-type"] == "application/json"


def test_generate_needs_exactly_one_response(client):
    r = client.post("/v2/models/token_stream/generate", json={"text_input": "one"})
    assert r.status_code == 200, r.text
    assert r.json()["text_output"] == "one" and r.json()["index"] == 0
    r = client.post("/v2/models/token_stream/generate", json={"text_input": "one two"})
    assert r.status_code == 500  # tritonserver 2.51: 200 with the same body (a deliberate difference)
    assert r.json() == {"error": "generate expects model to produce exactly 1 response, use generate stream for "
                                 "model that generates various number of responses"}


def test_generate_stream_sends_one_event_per_response(client):
    r = client.post(
        "/v2/models/token_stream/generate_stream", json={"id": "s1", "text_input": "a b c", "parameters": {"tag": "t"}}
    )
    assert r.status_code == 200
    assert r.headers["content-type"] == "text/event-stream; charset=utf-8"
    events = sse_events(r.text)
    assert [e["text_output"] for e in events] == ["a", "b", "c"]
    assert [e["index"] for e in events] == [0, 1, 2]
    assert all(e["id"] == "s1" and e["tag"] == "t" and e["model_name"] == "token_stream" for e in events)


def _chunks(host: str, port: int, path: str, body: bytes) -> tuple[int, list[bytes]]:
    """POST `body` over a raw HTTP/1.1 connection; the status and the chunks of its chunked answer."""
    with socket.create_connection((host, port), timeout=30) as sock:
        sock.sendall(b"POST " + path.encode() + b" HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: " + str(len(body)).encode() + b"\r\nConnection: close\r\n\r\n" + body)
        data = b""
        while True:
            part = sock.recv(1 << 20)
            if not part:
                break
            data += part
    head, _, rest = data.partition(b"\r\n\r\n")
    assert b"transfer-encoding: chunked" in head.lower(), head
    chunks = []
    while True:
        size_line, _, rest = rest.partition(b"\r\n")
        size = int(size_line.split(b";")[0], 16)
        if size == 0:
            return int(head.split()[1]), chunks
        chunks.append(rest[:size])
        rest = rest[size + 2:]


def test_generate_stream_joins_responses_that_wait_into_one_write(kernel):
    """A model that sends faster than the front writes: the responses waiting when a write is due
    leave in one chunk (each still its own event, in order), not a write per response; the first
    event leaves alone (never held back for the next)."""
    words = [f"w{i}" for i in range(2000)]
    host, port = kernel.url.rsplit(":", 1)
    body = json.dumps({"text_input": " ".join(words)}).encode()
    status, chunks = _chunks(host, int(port), "/v2/models/token_stream/generate_stream", body)
    assert status == 200
    events = sse_events(b"".join(chunks).decode())
    assert [e["text_output"] for e in events] == words
    assert [e["index"] for e in events] == list(range(2000))
    assert sse_events(chunks[0].decode())[0]["text_output"] == "w0" and len(sse_events(chunks[0].decode())) == 1
    assert all(c.endswith(b"\n\n") for c in chunks)  # an event is never split over two writes
    assert len(chunks) < len(events) // 2, f"{len(chunks)} writes for {len(events)} events"


def test_generate_stream_reports_errors_as_events(client):
    r = client.post("/v2/models/token_stream/generate_stream", json={"text_input": "a FAIL b"})
    assert r.status_code == 200
    events = sse_events(r.text)
    assert events[0]["text_output"] == "a"
    assert events[1] == {"error": "word 1 is FAIL"}
    assert events[2]["text_output"] == "b"
    # an error as the first response sets the status
    r = client.post("/v2/models/token_stream/generate_stream", json={"text_input": "FAIL x"})
    assert r.status_code == 500 and r.headers["content-type"].startswith("text/event-stream")
    assert sse_events(r.text)[0] == {"error": "word 0 is FAIL"}


def test_generate_stream_of_a_non_decoupled_model(client):
    r = client.post("/v2/models/text_echo/generate_stream", json={"text_input": "hi"})
    assert r.status_code == 200
    events = sse_events(r.text)
    assert len(events) == 1 and events[0]["text_output"] == "HI"


def test_generate_stream_is_incremental_and_disconnect_cancels(kernel, client):
    words = " ".join(f"w{i}" for i in range(40))
    start = time.monotonic()
    with httpx.stream(
        "POST", f"http://{kernel.url}/v2/models/token_stream/generate_stream",
        json={"text_input": f"cancelme {words}", "delay_ms": 250}, timeout=30,
    ) as r:
        assert r.status_code == 200
        first = next(line for line in r.iter_lines() if line.startswith("data: "))
        assert json.loads(first[6:])["text_output"] == "cancelme"
        assert time.monotonic() - start < 5  # the first event came before the model finished
    assert kernel.wait_for_log("token_stream saw cancellation of 'cancelme'", timeout=15)
    assert client.post("/v2/models/text_echo/generate", json={"text_input": "after"}).status_code == 200
