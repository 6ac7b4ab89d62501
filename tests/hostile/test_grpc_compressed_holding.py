"""Compressed gRPC answers are held answers like any other (issue 31, N6).

With --grpc-infer-response-compression-level set, an answer waiting to be deflated beside the loop
(and a stream's answers queued behind it) was held outside the server's account of held answers:
64 x 16 MiB answers to a client that does not read were all held (~1 GiB against a 256 MiB
--max-held-output-bytes), and one 300 x 4 MiB stream grew the front to 1.77 GB. Now those bytes
count in the connection's held output (its 256 MiB bound refuses or cuts past it) and in the
server's account (new calls get UNAVAILABLE naming --max-held-output-bytes; calls making no
progress are cut). Raw HTTP/2 against a real `kernel serve --grpc-server native`.

What the front may hold for non-reading clients, compressed or not, is bounded by

    per connection:  256 MiB (Http2Limits.max_pending_output) + one answer
    all together:    --max-held-output-bytes, plus the answers of calls already running when
                     the bound was passed, until the longest-stalled are cut (within ~1 s)

plus the deflate threads' own buffers (compression.POOL_THREADS messages at once, each at most
its own size).
"""

from __future__ import annotations

import time

import pytest
from tritonclient.grpc import service_pb2 as tc_pb

from conftest import EXAMPLES
from kernel.transports.grpc import compression
from test_grpc_slow_clients import big_repo  # noqa: F401 - fixture
from test_grpc_slow_clients import (
    RESOURCE_EXHAUSTED, UNAVAILABLE, Peak, add_sub_message, big_request, connect, serving, statuses,
)
from test_http2_limits import DATA, END_STREAM, INFER, assert_infer_works, frame, grpc_message, rss_mb

MIB = 1 << 20
LIMIT = 64 * MIB
STALL_S = 5
STREAM_INFER = "/inference.GRPCInferenceService/ModelStreamInfer"
ACCEPT = [("grpc-accept-encoding", "gzip")]

@pytest.fixture(scope="module")
def server(big_repo):
    with serving([big_repo, EXAMPLES], "--grpc-server", "native", "--grpc-infer-response-compression-level=high",
                 f"--max-held-output-bytes={LIMIT}", f"--client-stall-timeout-secs={STALL_S}") as k:
        yield k


def refused_meanwhile(other, seconds: float, on_wait) -> str | None:
    """Send add_sub calls on `other` until one is refused (its message) or `seconds` pass."""
    sid = 1
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        on_wait()
        other.send(other.call(sid, INFER, add_sub_message()))
        code, message = other.grpc_status(sid, timeout=20)
        sid += 2
        if code != 0:
            assert code == UNAVAILABLE, message
            return message
        time.sleep(0.02)
    return None


def test_answers_waiting_to_be_compressed_count_as_held(server):
    """A connection that never reads asks for 24 x 16 MiB compressed answers at once (384 MiB):
    the answers waiting to be deflated count as held, so past the connection's 256 MiB the rest
    are refused, other calls are refused naming --max-held-output-bytes while they wait, every
    call of the hog ends (refused, or cut once stalled), and the front's memory stays within the
    connection's bound."""
    pid = server.proc.pid
    rss_before = rss_mb(pid)
    rss = Peak(lambda: rss_mb(pid))
    hog = connect(server.grpc_port, 0)
    other = connect(server.grpc_port, 1 << 30)
    ids = [2 * i + 1 for i in range(24)]
    try:
        hog.send(b"".join(hog.headers(sid, INFER, ACCEPT) + frame(DATA, END_STREAM, sid, big_request(16))
                          for sid in ids))
        refused = refused_meanwhile(other, 20, rss)
        assert refused is not None, "no call was refused while compressed answers over the limit waited"
        assert f"over its limit of {LIMIT} bytes" in refused, refused
        got = statuses(hog, ids, STALL_S + 30, rss)
        assert len(got) == len(ids), f"{len(ids) - len(got)} calls of a non-reading client were never ended"
        assert {code for code, _ in got.values()} == {RESOURCE_EXHAUSTED}, got
        on_connection = [m for _, m in got.values() if "on this connection" in m]
        assert on_connection, f"no answer was refused at the connection's bound: {got}"
        # What the front held for it: the answers under the connection's bound (the worker's arena
        # pages it read to deflate them), the deflate threads' buffers, the interpreter's slack.
        grown = rss.value - rss_before
        bound = 256 + compression.POOL_THREADS * 16 + 64
        print(f"front RSS {rss_before:.0f} -> {rss.value:.0f} MB; {len(on_connection)} refused on the connection")
        assert grown < bound, f"front RSS grew {grown:.0f} MB for 384 MiB of answers (bound {bound} MB)"
    finally:
        hog.close()
        other.close()
    assert_infer_works(server.grpc_url)


def stream_request(mib: int, request_id: str) -> bytes:
    req = tc_pb.ModelInferRequest.FromString(big_request(mib)[5:])
    req.id = request_id
    return grpc_message(req)


def test_a_stream_of_compressed_answers_nobody_reads_is_bounded(server):
    """One ModelStreamInfer call asks for 150 x 4 MiB answers, compressed, and never reads: the
    answers queued behind the one being deflated are held and counted, so the call is cut (or
    its later requests refused) instead of growing the front without bound."""
    pid = server.proc.pid
    rss_before = rss_mb(pid)
    rss = Peak(lambda: rss_mb(pid))
    c = connect(server.grpc_port, 0)
    try:
        c.send(c.headers(1, STREAM_INFER, ACCEPT))
        for i in range(150):
            c.send(frame(DATA, 0, 1, stream_request(4, str(i))))
            rss()
            time.sleep(0.01)
        got = statuses(c, [1], STALL_S + 40, rss)
        assert 1 in got, "the call that holds the unread answers was never cut"
        code, message = got[1]
        assert code == RESOURCE_EXHAUSTED, got
        grown = rss.value - rss_before
        bound = 256 + compression.POOL_THREADS * 4 + 64  # (as above, for 4 MiB answers)
        print(f"stream: front RSS grew {grown:.0f} MB; {message}")
        assert grown < bound, f"front RSS grew {grown:.0f} MB for 600 MiB of answers (bound {bound} MB)"
    finally:
        c.close()
    assert_infer_works(server.grpc_url)
