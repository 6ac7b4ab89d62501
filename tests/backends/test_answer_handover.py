"""An answer is what the model handed over when it handed it over (issue 23 A and B).

Triton copies a response's outputs into shared memory inside `send()` (and a BLS call's inputs
inside `exec()`), and gives each model input as the model's own writable array. Kernel moves large
tensors through shared memory without copying where it can; these tests pin down that no saving
may let a client see another request's data, or a buffer's later contents:

* A: a model that reuses one buffer for several `send()` calls (one batch, a decoupled stream, a
  thread of its own after execute returned) delivers each value as it was at its send; a BLS
  input overwritten after `exec()`/`async_exec()` reaches the callee as it was at the call.
* B: an output that is the model's input array goes back without a copy only when the model can
  no longer change it: a model that writes into its input between sends, keeps the array and
  zeroes it later, or answers with a kept input of an earlier request, gets what it handed over.
"""

from __future__ import annotations

import json
import queue
import socket
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from conftest import serving

MODELS = Path(__file__).resolve().parents[1] / "models" / "handover"
BIG = 4 << 20  # floats: 16 MiB, far above the 64 KiB that ride inside a message


@pytest.fixture(scope="module")
def server():
    yield from serving([MODELS])


def _input(module, name, array, datatype="FP32"):
    tensor = module.InferInput(name, list(array.shape), datatype)
    tensor.set_data_from_numpy(array)
    return tensor


def _stream(server, model: str, inputs: list, timeout: float = 60) -> list[np.ndarray]:
    """The OUT of every response of one decoupled request, in order, until the final flag."""
    got: queue.SimpleQueue = queue.SimpleQueue()
    client = grpcclient.InferenceServerClient(server.grpc_url)
    client.start_stream(callback=lambda result, error: got.put((result, error)))
    try:
        client.async_stream_infer(model, inputs, enable_empty_final_response=True)
        outs = []
        deadline = time.monotonic() + timeout
        while True:
            result, error = got.get(timeout=max(0.1, deadline - time.monotonic()))
            assert error is None, error
            response = result.get_response()
            if result.as_numpy("OUT") is not None:
                outs.append(result.as_numpy("OUT"))
            if response.parameters["triton_final_response"].bool_param:
                return outs
    finally:
        client.stop_stream()
        client.close()


# ---- A: send() fixes the answer ---------------------------------------------------------------


@pytest.mark.parametrize("size", [4, 1 << 16], ids=["inline", "arena"])
def test_a_batch_answered_from_one_reused_buffer_gives_each_client_its_own_answer(server, size):
    client = httpclient.InferenceServerClient(server.url, concurrency=8, network_timeout=60)
    try:
        for round_ in range(3):  # the first execute runs on the worker's loop; the later ones on its model thread
            values = [float(100 * round_ + i) for i in range(8)]
            pending = [client.async_infer("shared_sender", [_input(httpclient, "IN", np.full((1, size), v, np.float32))])
                       for v in values]
            for value, call in zip(values, pending):
                out = call.get_result().as_numpy("OUT")
                assert out.shape == (1, size)
                assert np.all(out == value), f"round {round_}: asked for {value}, got {np.unique(out)[:8]}"
    finally:
        client.close()


@pytest.mark.parametrize("from_thread", [0, 1], ids=["in_execute", "thread_after_execute"])
@pytest.mark.parametrize("n", [4, BIG], ids=["inline", "16MiB"])
def test_a_buffer_refilled_between_sends_arrives_as_it_was_at_each_send(server, n, from_thread):
    inputs = [_input(grpcclient, "N", np.array([n], np.int32), "INT32"),
              _input(grpcclient, "BASE", np.array([10.0], np.float32)),
              _input(grpcclient, "FROM_THREAD", np.array([from_thread], np.int32), "INT32")]
    outs = _stream(server, "refill_stream", inputs)
    assert len(outs) == 4
    for i, out in enumerate(outs):
        assert out.shape == (n,)
        assert np.all(out == 10.0 + i), f"response {i}: {np.unique(out)[:8]}"


@pytest.mark.parametrize("mode", ["async", "thread"])
@pytest.mark.parametrize("n", [16, 100_000], ids=["inline", "arena"])
def test_a_bls_input_overwritten_after_the_call_reaches_the_callee_as_it_was(server, mode, n):
    client = httpclient.InferenceServerClient(server.url, network_timeout=60)
    try:
        data = np.arange(n, dtype=np.float32)
        result = client.infer("bls_overwrite", [_input(httpclient, "MODE", np.array([mode.encode()], np.object_), "BYTES"),
                                                _input(httpclient, "IN", data)])
        np.testing.assert_array_equal(result.as_numpy("OUT"), data)
    finally:
        client.close()


# ---- B: an input handed back is fixed at hand-over ----------------------------------------------


def test_b_an_input_written_between_sends_arrives_as_it_was_at_each_send(server):
    data = np.arange(BIG, dtype=np.float32)
    outs = _stream(server, "rewrite_stream", [_input(grpcclient, "IN", data)])
    assert len(outs) == 3
    for i, out in enumerate(outs):
        np.testing.assert_array_equal(out, data + (i + 1), err_msg=f"response {i}")


def _binary_request(model: str, data: np.ndarray) -> bytes:
    header = json.dumps({"inputs": [{"name": "IN", "shape": list(data.shape), "datatype": "FP32",
                                     "parameters": {"binary_data_size": data.nbytes}}],
                         "outputs": [{"name": "OUT", "parameters": {"binary_data": True}}]}).encode()
    body = header + data.tobytes()
    return (f"POST /v2/models/{model}/infer HTTP/1.1\r\nHost: x\r\nContent-Type: application/octet-stream\r\n"
            f"Inference-Header-Content-Length: {len(header)}\r\nContent-Length: {len(body)}\r\n\r\n").encode() + body


def _read_response(sock: socket.socket) -> np.ndarray:
    """OUT of one HTTP binary-tensor response read from sock."""
    buf = bytearray()
    while b"\r\n\r\n" not in buf:
        chunk = sock.recv(1 << 20)
        assert chunk, "connection closed"
        buf += chunk
    head, _, rest = bytes(buf).partition(b"\r\n\r\n")
    headers = {k.strip().lower(): v.strip() for k, _, v in (line.partition(":") for line in head.decode().split("\r\n")[1:])}
    assert head.startswith(b"HTTP/1.1 200"), head
    length = int(headers["content-length"])
    body = bytearray(rest)
    while len(body) < length:
        chunk = sock.recv(min(1 << 20, length - len(body)))
        assert chunk, "connection closed"
        body += chunk
    json_size = int(headers["inference-header-content-length"])
    return np.frombuffer(bytes(body[json_size:]), np.float32)


def test_b_a_kept_input_zeroed_later_does_not_change_an_answer_still_being_read(server):
    """A 32 MiB identity answer to a client that reads slowly, from a model that keeps its input array
    and zeroes it when the next request comes: the slow client still reads its input back."""
    n = 8 << 20
    first, second = np.arange(n, dtype=np.float32), np.full(n, 7.0, np.float32)
    port = int(server.url.rsplit(":", 1)[1])
    slow = socket.create_connection(("127.0.0.1", port))
    slow.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 << 10)
    try:
        slow.sendall(_binary_request("keeps_input", first))
        time.sleep(1.0)  # answered: most of the 32 MiB still waits in the server for this reader
        with socket.create_connection(("127.0.0.1", port)) as fast:
            fast.sendall(_binary_request("keeps_input", second))
            np.testing.assert_array_equal(_read_response(fast), second)  # the model has zeroed `first` by now
        got = _read_response(slow)
        assert np.count_nonzero(got != first) == 0, f"{np.count_nonzero(got != first)} of {n} values changed"
    finally:
        slow.close()


def test_b_an_input_the_model_kept_keeps_its_contents_whoever_comes_next(server):
    client = httpclient.InferenceServerClient(server.url, network_timeout=60)
    try:
        a, b, c = (np.full(1 << 20, v, np.float32) for v in (1.0, 2.0, 3.0))
        client.infer("previous_input", [_input(httpclient, "IN", a)])
        np.testing.assert_array_equal(client.infer("previous_input", [_input(httpclient, "IN", b)]).as_numpy("OUT"), a)
        np.testing.assert_array_equal(client.infer("previous_input", [_input(httpclient, "IN", c)]).as_numpy("OUT"), b)
    finally:
        client.close()


def test_b_an_input_sent_back_untouched_stays_the_models_own_writable_array(server):
    data = np.arange(BIG, dtype=np.float32)
    outs = _stream(server, "lent_then_written", [_input(grpcclient, "IN", data)])
    assert len(outs) == 2
    np.testing.assert_array_equal(outs[0], data)
    np.testing.assert_array_equal(outs[1], data + 1)


@pytest.mark.parametrize("n", [4, BIG], ids=["inline", "16MiB"])
def test_b_inputs_are_writable_and_in_place_math_is_answered(server, n):
    client = httpclient.InferenceServerClient(server.url, network_timeout=60)
    try:
        data = np.arange(n, dtype=np.float32)
        for _ in range(2):
            np.testing.assert_array_equal(client.infer("inplace_add", [_input(httpclient, "IN", data)]).as_numpy("OUT"),
                                          data + 1)
    finally:
        client.close()


def test_b_concurrent_identity_clients_each_get_their_own_tensor(server):
    errors = []

    def client_loop(value: float) -> None:
        client = httpclient.InferenceServerClient(server.url, network_timeout=60)
        try:
            data = np.full(1 << 20, value, np.float32)
            for _ in range(5):
                out = client.infer("identity", [_input(httpclient, "IN", data)]).as_numpy("OUT")
                if not np.all(out == value):
                    errors.append((value, np.unique(out)[:8]))
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append((value, exc))
        finally:
            client.close()

    threads = [threading.Thread(target=client_loop, args=(float(v),)) for v in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
