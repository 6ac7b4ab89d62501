"""Slow gRPC clients against Kernel's own HTTP/2 server (issue 23): what they make it hold, and shutdown.

Each test drives a real `kernel serve --grpc-server native` with raw HTTP/2 frames (real clients
always read and always finish their messages):

- a client that never opens its flow-control window while its answers pile up: the answers a
  connection holds are bounded, the streams are cut after --client-stall-timeout-secs (so the
  worker's arena regions behind them are released), and everyone else is served meanwhile;
- answers held by all connections together past --max-held-output-bytes: new calls are refused
  with UNAVAILABLE naming the limit until the longest-stalled streams are cut;
- clients that send most of a large request message and stop: the bytes are bounded by
  --max-held-input-bytes and the calls are cut after the stall timeout;
- SIGTERM: a slow reader of a large answer still gets all of it within --exit-timeout-secs, a
  reader that never opens its window is cut when the timeout is spent, idle connections get
  GOAWAY at once.
"""

from __future__ import annotations

import contextlib
import signal
import struct
import threading
import time
from pathlib import Path

import hpack
import numpy as np
import pytest
from tritonclient.grpc import service_pb2 as tc_pb

from conftest import EXAMPLES, KernelProcess, children
from test_http2_limits import (
    DATA, HEADERS, INFER, PREFACE, RST_STREAM, SETTINGS, WINDOW_UPDATE, Goaway,
    RawH2, assert_infer_works, frame, grpc_message, rss_mb,
)

MIB = 1 << 20
SETTINGS_INITIAL_WINDOW_SIZE = 0x4
RESOURCE_EXHAUSTED, UNAVAILABLE = 8, 14

BIG_OUTPUT_CONFIG = """
backend: "python"
max_batch_size: 0
input [ { name: "MIB", data_type: TYPE_INT32, dims: [ 1 ] } ]
output [ { name: "OUT", data_type: TYPE_UINT8, dims: [ -1 ] } ]
instance_group [ { kind: KIND_CPU, count: 1 } ]
"""

BIG_OUTPUT_MODEL = '''
"""OUT: MIB mebibytes of 7s, from a 4-byte request (an answer far larger than its question)."""
import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            n = int(pb_utils.get_input_tensor_by_name(request, "MIB").as_numpy()[0])
            responses.append(pb_utils.InferenceResponse([pb_utils.Tensor("OUT", np.full(n << 20, 7, np.uint8))]))
        return responses
'''


@pytest.fixture(scope="module")
def big_repo(tmp_path_factory) -> Path:
    repo = tmp_path_factory.mktemp("slow_grpc_models")
    (repo / "big_output" / "1").mkdir(parents=True)
    (repo / "big_output" / "config.pbtxt").write_text(BIG_OUTPUT_CONFIG)
    (repo / "big_output" / "1" / "model.py").write_text(BIG_OUTPUT_MODEL)
    return repo


def big_request(mib: int) -> bytes:
    req = tc_pb.ModelInferRequest(model_name="big_output")
    t = req.inputs.add()
    t.name, t.datatype = "MIB", "INT32"
    t.shape.append(1)
    req.raw_input_contents.append(np.array([mib], np.int32).tobytes())
    return grpc_message(req)


def add_sub_message() -> bytes:
    req = tc_pb.ModelInferRequest(model_name="add_sub")
    for name in ("INPUT0", "INPUT1"):
        t = req.inputs.add()
        t.name, t.datatype = name, "FP32"
        t.shape.append(4)
        req.raw_input_contents.append(np.arange(4, dtype=np.float32).tobytes())
    return grpc_message(req)


@contextlib.contextmanager
def serving(*args: str):
    """A `kernel serve --grpc-server native` on the given repositories and flags, stopped afterwards."""
    k = KernelProcess(*args)
    try:
        yield k.wait_ready()
    finally:
        k.stop()


def connect(port: int, window: int) -> RawH2:
    """A connection whose streams start with `window` bytes of flow-control window (0: never read)."""
    c = RawH2(port, preface=False)
    c.send(PREFACE + frame(SETTINGS, 0, 0, struct.pack(">HL", SETTINGS_INITIAL_WINDOW_SIZE, window)))
    if window > 65_535:
        c.send(frame(WINDOW_UPDATE, 0, 0, struct.pack(">L", window - 65_535)))
    return c


def statuses(c: RawH2, ids, timeout: float, on_wait=None, enough: int = 0) -> dict[int, tuple[int, str]]:
    """(grpc-status, grpc-message) of the calls in `ids`, read off `c` within `timeout` seconds
    (or once `enough` of them have ended); `on_wait` is called between reads (sampling memory,
    serving others)."""
    decoder = hpack.Decoder()
    got: dict[int, tuple[int, str]] = {}
    want = enough or len(ids)
    deadline = time.monotonic() + timeout
    while len(got) < want and time.monotonic() < deadline:
        if on_wait is not None:
            on_wait()
        try:
            kind, _, sid, payload = c.read_frame(0.2)
        except Goaway:
            continue
        except ConnectionError:
            break
        except OSError:  # (a read timeout)
            continue
        if kind == HEADERS and sid in ids:
            fields = dict(decoder.decode(payload))
            if "grpc-status" in fields:
                got[sid] = (int(fields["grpc-status"]), fields.get("grpc-message", ""))
        elif kind == HEADERS:
            decoder.decode(payload)
    return got


def worker_arena_bytes(front_pid: int) -> int:
    """Bytes of the workers' own arenas (their memfd segments for outputs) mapped right now."""
    total = 0
    for pid in children(front_pid):
        try:
            maps = Path(f"/proc/{pid}/maps").read_text()
        except OSError:
            continue
        for line in maps.splitlines():
            if "memfd:kernel-" in line and "-out" in line:
                lo, hi = line.split()[0].split("-")
                total += int(hi, 16) - int(lo, 16)
    return total


class Peak:
    """The largest value `probe()` returned while an attack was on."""

    def __init__(self, probe):
        self.probe, self.value = probe, probe()

    def __call__(self) -> None:
        self.value = max(self.value, self.probe())


# ---------------------------------------------------------------- answers nobody reads


STALL_S = 4


@pytest.fixture(scope="module")
def stall_server(big_repo):
    with serving([big_repo, EXAMPLES], "--grpc-server", "native", f"--client-stall-timeout-secs={STALL_S}") as k:
        yield k


def _zero_window_round(server, n: int, mib: int) -> tuple[RawH2, dict, int]:
    """n calls for `mib` MiB answers on one connection that never opens its window: their
    statuses, and the most the workers' arenas grew while they were held.

    Each call is sent once the previous one's answer has begun (its HEADERS): the model makes one
    answer at a time, so what the arena holds is what the front keeps, not a batch in the model."""
    base = worker_arena_bytes(server.proc.pid)
    peak = Peak(lambda: worker_arena_bytes(server.proc.pid))
    c = connect(server.grpc_port, 0)
    ids = [2 * i + 1 for i in range(n)]
    decoder = hpack.Decoder()
    got: dict[int, tuple[int, str]] = {}
    for sid in ids:
        c.send(c.call(sid, INFER, big_request(mib)))
        answered = False
        while not answered:
            kind, _, stream_id, payload = c.read_frame(30)
            if kind == HEADERS:
                fields = dict(decoder.decode(payload))
                answered = answered or stream_id == sid
                if "grpc-status" in fields:
                    got[stream_id] = (int(fields["grpc-status"]), fields.get("grpc-message", ""))
        peak()
    served = []

    def meanwhile():
        peak()
        if not served:
            assert_infer_works(server.grpc_url)  # others are served while the answers are held
            served.append(True)

    got.update(statuses(c, [sid for sid in ids if sid not in got], STALL_S + 40, meanwhile))
    assert served, "nobody else was served meanwhile"
    return c, got, peak.value - base


def test_answers_a_client_never_reads_are_bounded_and_cut(stall_server):
    """100 streams of a 32 MiB answer on one zero-window connection pinned 3.2 GB of a worker's
    arena, still pinned 70 s later: the answers one connection holds are bounded, and stalled
    streams are cut after the stall timeout, releasing the regions behind them."""
    c, got, grown = _zero_window_round(stall_server, 40, 16)
    try:
        assert len(got) == 40, f"{40 - len(got)} calls never got an answer"
        assert grown < 400 * MIB, f"the worker's arena grew {grown / MIB:.0f} MiB for 640 MiB of unread answers"
        assert {code for code, _ in got.values()} == {RESOURCE_EXHAUSTED}, got
        stalled = [m for _, m in got.values() if "no progress" in m]
        capped = [m for _, m in got.values() if "on this connection" in m]
        assert stalled, "no stream was cut for making no progress"
        assert len(stalled) + len(capped) == 40, got
        assert all(f"stall timeout {STALL_S} s" in m for m in stalled)
        # The cut streams' regions were released: the same again (connection still open) reuses them.
        c2, got2, grown2 = _zero_window_round(stall_server, 40, 16)
        c2.close()
        assert len(got2) == 40
        assert grown2 < 400 * MIB, f"the arena grew another {grown2 / MIB:.0f} MiB: regions were not released"
    finally:
        c.close()
    assert_infer_works(stall_server.grpc_url)


def test_a_stream_of_large_answers_nobody_reads_is_bounded_and_releases_its_regions(stall_server):
    """One ModelStreamInfer call asks for 100 x 4 MiB answers and never reads. A stream answer over
    1 MiB is sent from the worker's arena as it lies (transports/grpc/stream_message.py), not
    copied: the regions it pins are the held answers the connection's bound counts, so the call is
    cut and the arena stays bounded; once it is cut the same again reuses the regions."""
    def unread_round() -> tuple[dict, int]:
        base = worker_arena_bytes(stall_server.proc.pid)
        peak = Peak(lambda: worker_arena_bytes(stall_server.proc.pid))
        c = connect(stall_server.grpc_port, 0)
        try:
            c.send(c.headers(1, "/inference.GRPCInferenceService/ModelStreamInfer"))
            for _ in range(100):
                c.send(frame(DATA, 0, 1, big_request(4)))
                peak()
                time.sleep(0.01)
            return statuses(c, [1], STALL_S + 40, peak), peak.value - base
        finally:
            c.close()

    for round_ in range(2):
        got, grown = unread_round()
        print(f"round {round_}: arena grew {grown / MIB:.0f} MiB; {got}")
        assert got.get(1, (None,))[0] == RESOURCE_EXHAUSTED, f"round {round_}: the call was not cut: {got}"
        assert grown < 400 * MIB, f"round {round_}: the worker's arena grew {grown / MIB:.0f} MiB for 400 MiB unread"
    assert_infer_works(stall_server.grpc_url)


def test_a_client_that_reads_nothing_is_dropped_after_the_stall_timeout(stall_server):
    """Open windows but a socket nobody reads: what the transport could not hand to the socket
    (and the streams behind it) stayed queued as long as the connection was open."""
    c = connect(stall_server.grpc_port, 1 << 30)
    try:
        ids = [1, 3, 5, 7, 9, 11]
        c.send(b"".join(c.call(sid, INFER, big_request(32)) for sid in ids))  # 192 MiB of answers
        time.sleep(STALL_S + 4)  # reading nothing meanwhile
        assert_infer_works(stall_server.grpc_url)
        decoder = hpack.Decoder()
        received, ok = 0, []
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                kind, _, sid, payload = c.read_frame(5)
            except Goaway:
                continue
            except OSError:  # closed (or reset) by the server, once what was in the socket is read
                break
            if kind == DATA:
                received += len(payload)
            elif kind == HEADERS and dict(decoder.decode(payload)).get("grpc-status") == "0":
                ok.append(sid)
        else:
            raise AssertionError("the connection is still open")
        # What the kernel's socket buffers took before the cut still arrives (up to tcp_rmem +
        # tcp_wmem, 36 MiB here: perhaps a whole answer); the rest was dropped with the connection.
        assert len(ok) < 3 and received < 96 * MIB, f"{received} bytes and OK for {ok}: the answers were kept"
    finally:
        c.close()


def test_answers_held_over_the_global_limit_refuse_new_calls(big_repo):
    """Past --max-held-output-bytes new calls get UNAVAILABLE naming the limit, until the
    longest-stalled streams are cut; then calls are served again."""
    with serving([big_repo, EXAMPLES], "--grpc-server", "native", f"--max-held-output-bytes={100 * MIB}",
                 "--client-stall-timeout-secs=120") as server:
        hog = connect(server.grpc_port, 0)
        other = connect(server.grpc_port, 1 << 30)  # (window for all the answers it reads)
        try:
            ids = [2 * i + 1 for i in range(8)]  # 8 x 16 MiB = 128 MiB held
            hog.send(b"".join(hog.call(sid, INFER, big_request(16)) for sid in ids))
            refused = None
            sid = 1
            deadline = time.monotonic() + 30
            while refused is None and time.monotonic() < deadline:
                other.send(other.call(sid, INFER, add_sub_message()))
                code, message = other.grpc_status(sid)
                if code != 0:
                    assert code == UNAVAILABLE, message
                    refused = message
                sid += 2
                time.sleep(0.02)
            assert refused is not None, "no call was refused while the server held more than its limit"
            assert f"over its limit of {100 * MIB} bytes" in refused
            # 8 x 16 MiB against 100 MiB: two streams must go before new calls are served again
            # (waiting for the first cut only raced the sweep that makes the second).
            got = statuses(hog, ids, 20, enough=2)
            assert len(got) >= 2, f"too few stalled streams cut to bring the server back under its limit: {got}"
            assert all(code == RESOURCE_EXHAUSTED and "over the limit" in m for code, m in got.values()), got
            assert_infer_works(server.grpc_url)
        finally:
            hog.close()
            other.close()


# ---------------------------------------------------------------- request messages that stop halfway


def test_stalled_request_messages_are_bounded_and_cut(big_repo):
    """Connections that sent most of a large message and stopped held it until they closed
    (7 of them took the front from 212 MB to 4.5 GB)."""
    with serving([big_repo, EXAMPLES], "--grpc-server", "native", f"--max-held-input-bytes={48 * MIB}",
                 "--client-stall-timeout-secs=3") as server:
        before = rss_mb(server.proc.pid)
        conns = []
        try:
            chunk = b"x" * MIB
            for _ in range(8):
                c = RawH2(server.grpc_port)
                conns.append(c)
                # 15 MiB of a 16 MiB message: within the windows the server grants at once
                c.send(c.headers(1, INFER) + frame(DATA, 0, 1, b"\x00" + struct.pack(">L", 16 * MIB) + chunk[5:]))
                for _ in range(14):
                    c.send(frame(DATA, 0, 1, chunk))
            served = []

            def meanwhile():
                if not served:
                    assert_infer_works(server.grpc_url)
                    served.append(True)

            results = [statuses(c, [1], 20, meanwhile).get(1) for c in conns]
            assert all(r is not None for r in results), f"calls left holding their partial messages: {results}"
            for code, message in results:
                assert (code, "no progress") == (RESOURCE_EXHAUSTED, "no progress") and "stall timeout 3 s" in message \
                    or code == RESOURCE_EXHAUSTED and "over the limit" in message \
                    or code == UNAVAILABLE and f"over its limit of {48 * MIB} bytes" in message, (code, message)
            time.sleep(0.5)
            after = rss_mb(server.proc.pid)
            assert after - before < 60, f"front RSS still {after - before:.0f} MB up after the cuts"
            assert_infer_works(server.grpc_url)
        finally:
            for c in conns:
                c.close()


# ---------------------------------------------------------------- SIGTERM


def _read_answer(c: RawH2, sid: int, step: int, pause: float, first_data: threading.Event) -> tuple[int, dict]:
    """Read the call's answer, opening the windows `step` bytes at a time every `pause` seconds:
    (DATA bytes, trailer fields)."""
    decoder = hpack.Decoder()
    received = unacked = 0
    while True:
        try:
            kind, flags, stream_id, payload = c.read_frame(30)
        except Goaway:
            continue  # (the server is stopping: the answer must still come whole)
        if kind == DATA and stream_id == sid:
            received += len(payload)
            unacked += len(payload)
            first_data.set()
            if unacked >= step:
                time.sleep(pause)
                c.send(frame(WINDOW_UPDATE, 0, 0, struct.pack(">L", unacked))
                       + frame(WINDOW_UPDATE, 0, sid, struct.pack(">L", unacked)))
                unacked = 0
        elif kind == HEADERS and stream_id == sid:
            fields = dict(decoder.decode(payload))
            if "grpc-status" in fields:
                return received, fields
        elif kind == RST_STREAM and stream_id == sid:
            return received, {"rst": struct.unpack(">L", payload)[0]}


def test_sigterm_lets_a_slow_reader_finish_its_answer(big_repo):
    """SIGTERM cut answers being written as soon as no request was inside a model."""
    with serving([big_repo, EXAMPLES], "--grpc-server", "native", "--exit-timeout-secs=30") as server:
        idle = RawH2(server.grpc_port)
        c = connect(server.grpc_port, MIB)
        result = {}
        first_data = threading.Event()

        def read():
            try:
                result["answer"] = _read_answer(c, 1, MIB, 0.1, first_data)  # 32 MiB at ~10 MiB/s
            except Exception as exc:  # noqa: BLE001 - reported below
                result["error"] = exc

        reader = threading.Thread(target=read)
        try:
            c.send(c.call(1, INFER, big_request(32)))
            reader.start()
            assert first_data.wait(30), "the answer never started"
            start = time.monotonic()
            server.proc.send_signal(signal.SIGTERM)
            # An idle connection is told to go away at once.
            goaway = idle.wait_goaway(timeout=5)
            assert goaway.code == 0 and time.monotonic() - start < 5
            reader.join(60)
            assert "error" not in result, result.get("error")
            received, trailers = result["answer"]
            assert trailers.get("grpc-status") == "0", trailers
            assert received >= 32 * MIB, f"got {received} bytes of a 32 MiB answer"
            assert server.proc.wait(30) == 0
        finally:
            idle.close()
            c.close()


def test_sigterm_cuts_a_reader_that_never_reads_within_the_exit_timeout(big_repo):
    with serving([big_repo, EXAMPLES], "--grpc-server", "native", "--exit-timeout-secs=2") as server:
        c = connect(server.grpc_port, 0)
        try:
            c.send(c.call(1, INFER, big_request(32)))
            kind = None
            while kind != HEADERS:  # the response headers: the answer is waiting for window
                kind = c.read_frame(30)[0]
            start = time.monotonic()
            server.proc.send_signal(signal.SIGTERM)
            server.proc.wait(2 + 15)
            took = time.monotonic() - start
            assert took < 2 + 10, f"exit took {took:.1f} s with --exit-timeout-secs=2"
            assert c.closed_by_server(5)
        finally:
            c.close()
